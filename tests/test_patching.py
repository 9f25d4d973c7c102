"""Live code repair that reaches every caller, and the source of patched objects."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from crashoverride import CrashOverride
from crashoverride._patching import replace_function, show_source
from tests.helpers import done_step, exec_step, scripted, tool_outputs


@pytest.fixture
def modules() -> Iterator[tuple[object, object]]:
    import tests.fixtures.checkout as checkout
    import tests.fixtures.pricing as pricing

    yield pricing, checkout
    importlib.reload(pricing)
    importlib.reload(checkout)


NEW_PRICE = "def unit_price(sku):\n    return {'apple': 3}[sku]\n"


def test_rebinding_the_module_attribute_misses_from_imports(modules: tuple[object, object]) -> None:
    pricing, checkout = modules
    model = scripted(
        exec_step(f"import tests.fixtures.pricing as pricing\nexec({NEW_PRICE!r}, vars(pricing))"),
        done_step(),
    )
    co = CrashOverride(model=model)
    with co.handler():
        raise ValueError("trigger")
    assert pricing.unit_price("apple") == 3  # type: ignore[attr-defined]
    with pytest.raises(KeyError):  # `from pricing import unit_price` still holds the old one
        checkout.total("apple", 2)  # type: ignore[attr-defined]


def test_replace_function_reaches_every_reference(modules: tuple[object, object]) -> None:
    pricing, checkout = modules
    held = pricing.unit_price  # type: ignore[attr-defined]
    model = scripted(
        exec_step(
            "import tests.fixtures.pricing as pricing\n"
            f"replace_function(pricing.unit_price, {NEW_PRICE!r})"
        ),
        exec_step("print(show_source(pricing.unit_price))"),
        done_step(),
    )
    co = CrashOverride(model=model)
    with co.handler():
        raise ValueError("trigger")
    assert checkout.total("apple", 2) == 6  # type: ignore[attr-defined]
    assert held("apple") == 3  # even a reference taken before the repair
    assert held.__name__ == "unit_price"
    outputs = tool_outputs(model)
    assert "now runs the new code for every caller" in outputs[0]
    assert "return {'apple': 3}[sku]" in outputs[1]  # show_source sees the live code


def test_replace_function_refuses_builtins_and_mismatched_closures() -> None:
    with pytest.raises(TypeError, match="not a Python function"):
        replace_function(len, "def len(x):\n    return 0\n")
    from tests.fixtures.pricing import make_counter

    bump = make_counter()
    with pytest.raises(ValueError, match="free variables"):
        replace_function(bump, "def bump():\n    return 1\n")
    with pytest.raises(ValueError, match="exactly one function"):
        replace_function(make_counter, "x = 1\n")


def test_show_source_of_unpatched_and_builtin_objects() -> None:
    from tests.fixtures.pricing import make_counter

    assert "def make_counter" in show_source(make_counter)
    assert "no source" in show_source(len)
