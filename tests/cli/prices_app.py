"""A function a recovery in ``test_show`` patches live (it must live in a real file)."""


def price_of(item: dict[str, float]) -> float:
    return item["price"]
