"""One rule for what a check's result means: approvers, postconditions and unit checks alike.

Only a true result says yes (``True``, or a value whose truth is true). Everything else says
no: ``None`` (a check that forgot to return approves nothing and claims nothing), ``False``,
a string (the reason; an empty one gets the default reason), a false value, a value whose
truth raises, and a check that raises (the exception is the reason). The docs' table "What
a check's result means" documents this and ``tests/security/test_verdict.py`` holds it to it.

``reason`` reads a value; ``judge`` calls a check (awaiting it if it is async) and answers
``True`` or the reason, itself a value this rule reads the same way, so judged checks nest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from crashoverride._security.text import clip

# A judged check: yes, or the reason for no (never empty).
Verdict = Literal[True] | str


def reason(value: Any, default: str | None = None, what: str = "the check") -> str | None:
    """None when ``value`` means yes; otherwise the reason it means no.

    ``default`` is the reason for a plain no (``False``, ``""``, a false value); by default
    "<what> does not hold".
    """
    if value is True:
        return None
    if value is None:
        return f"{what} returned None"
    plain_no = default if default is not None else f"{what} does not hold"
    if isinstance(value, str):
        return value or plain_no
    try:
        return None if value else plain_no
    except Exception as exc:  # a value whose truth raises (a numpy array, say) is not a yes
        return f"{what} returned {type(value).__name__}, whose truth raised {exc!r}"


def raised(what: str, exc: BaseException) -> str:
    """The reason for no of a check that raised ``exc``."""
    return f"{what} raised {type(exc).__name__}: {clip(str(exc), 300)}"


def judge(check: Callable[[], Any], *, what: str = "the check", default: str | None = None) -> Any:
    """Call ``check``: ``True`` or the reason for no (a ``Verdict``), or an awaitable of it
    for an async check."""
    try:
        value = check()
    except Exception as exc:
        return raised(what, exc)
    if hasattr(value, "__await__"):
        return _judge_async(value, what, default)
    return _verdict(value, what, default)


def _verdict(value: Any, what: str, default: str | None) -> Verdict:
    why = reason(value, default, what)
    return True if why is None else why


async def _judge_async(awaitable: Any, what: str, default: str | None) -> Verdict:
    try:
        value = await awaitable
    except Exception as exc:
        return raised(what, exc)
    return _verdict(value, what, default)
