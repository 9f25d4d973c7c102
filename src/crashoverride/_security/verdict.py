"""One verdict: what a check's return value means, for postconditions, approvals and units.

``None`` or ``True``: holds / allowed. A string: the reason it does not hold / is denied.
Any other value: its truth. A check may be async; ``judge`` awaits it where the caller can.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crashoverride._security.text import clip

NOT_HOLDING = "the postcondition does not hold"


def reason(value: Any, default: str = NOT_HOLDING) -> str | None:
    """None when ``value`` means yes; otherwise the reason it means no."""
    if value is None or value is True:
        return None
    if isinstance(value, str):
        return value or default
    try:
        return None if value else default
    except Exception as exc:  # a value whose truth raises (a numpy array, say) is not a yes
        return f"the check returned {type(value).__name__}, whose truth raised {exc!r}"


def judge(check: Callable[[], Any], *, what: str = "the postcondition") -> Any:
    """Call ``check``; its reason (or None) — or an awaitable of it for an async check."""
    try:
        value = check()
    except Exception as exc:
        return f"{what} raised {type(exc).__name__}: {clip(str(exc), 300)}"
    if hasattr(value, "__await__"):
        return _judge_async(value, what)
    return reason(value)


async def _judge_async(awaitable: Any, what: str) -> str | None:
    try:
        return reason(await awaitable)
    except Exception as exc:
        return f"{what} raised {type(exc).__name__}: {clip(str(exc), 300)}"
