"""Bounded renderings of exceptions, tracebacks and values for prompts and tool results.

Whatever failed, the text we hand to a model stays small: a ``RecursionError`` has ~1000
frames, a message can be megabytes and a local can be a 2 GB bytes object.
"""

from __future__ import annotations

import os
import reprlib
import traceback
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from crashoverride._security.masking import MaskingRepr, hidden, masking_repr
from crashoverride._security.redact import MASK
from crashoverride._security.redact import clip as clip  # at home with the redactor: see there
from crashoverride._security.secrets import is_secret_name

TRACEBACK_LIMIT = 12_000
MESSAGE_LIMIT = 2_000
RESULT_LIMIT = 4_000
LOCALS_LIMIT = 4_000
_HEAD_FRAMES = 8
_TAIL_FRAMES = 24


def _short_repr(is_secret: Callable[[str], bool] = is_secret_name) -> MaskingRepr:
    # Secret-named keys and fields inside values are masked, as are secrets found by value.
    return masking_repr(
        is_secret, maxstring=160, maxother=160, maxlong=60, maxlist=8, maxtuple=8, maxset=8,
        maxfrozenset=8, maxdeque=8, maxarray=8, maxdict=8, maxlevel=3,
    )  # fmt: skip


_REPR = _short_repr()


def _wide_repr() -> MaskingRepr:
    return masking_repr(
        is_secret_name, maxstring=RESULT_LIMIT, maxother=RESULT_LIMIT, maxlong=400, maxlist=60,
        maxtuple=60, maxset=60, maxfrozenset=60, maxdeque=60, maxarray=60, maxdict=60, maxlevel=6,
    )  # fmt: skip


_WIDE = _wide_repr()


def safe_repr(value: object, shortener: reprlib.Repr = _REPR) -> str:
    """A bounded repr that never raises (a broken ``__repr__`` is data, not a crash).

    Bounded in its work too, as far as that can be (``_security.bounded``): an object's own
    ``__repr__`` is called only when the data it holds would render small."""
    try:
        return shortener.repr(value)
    except Exception as exc:  # any user __repr__ may fail
        return f"<{type(value).__name__} (repr failed: {type(exc).__name__})>"


def describe_exception(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:
        message = "<str() failed>"
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {clip(message, MESSAGE_LIMIT)}"


def format_traceback(exc: BaseException, tb: TracebackType | None = None) -> str:
    """Format ``exc`` with its chain, keeping the head and tail of very deep stacks."""
    try:
        # Lines are looked up when formatted, not checked against their files first (a stat
        # per file: on a loop a thread is busy on, each is a wait for the GIL).
        te = traceback.TracebackException(
            type(exc), exc, tb if tb is not None else exc.__traceback__, compact=True,
            lookup_lines=False,
        )  # fmt: skip
        for item in _chain(te):
            stack = item.stack
            if len(stack) > _HEAD_FRAMES + _TAIL_FRAMES:
                hidden = len(stack) - _HEAD_FRAMES - _TAIL_FRAMES
                kept = list(stack[:_HEAD_FRAMES]) + list(stack[-_TAIL_FRAMES:])
                item.stack = traceback.StackSummary.from_list(kept)
                _note_hidden(item, hidden)
            # Carets only where the exception was raised: they cost a parse of each frame's
            # line (most of the formatting time), and on the callers' lines (framework
            # plumbing, mostly) they only underline the call.
            for frame in item.stack[:-1]:
                frame.colno = frame.end_colno = None
            # ``_str`` is the rendered message; there is no public way to shorten it.
            message = getattr(item, "_str", None)
            if isinstance(message, str) and len(message) > MESSAGE_LIMIT:
                item._str = clip(message, MESSAGE_LIMIT)  # type: ignore[attr-defined]
        text = "".join(te.format())
    except Exception as problem:  # a traceback we cannot format must not end the recovery
        text = f"(traceback unavailable: {type(problem).__name__}: {problem})\n"
    return clip(text, TRACEBACK_LIMIT)


def _chain(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    seen: list[traceback.TracebackException] = []
    pending = [te]
    while pending:
        item = pending.pop()
        if any(item is s for s in seen):
            continue
        seen.append(item)
        for nxt in (item.__cause__, item.__context__):
            if nxt is not None:
                pending.append(nxt)
        pending.extend(item.exceptions or ())
    return seen


def _note_hidden(item: traceback.TracebackException, hidden: int) -> None:
    notes = list(item.__notes__ or [])
    notes.append(f"[crashoverride: {hidden} middle frames of this traceback were elided]")
    item.__notes__ = notes


def summarize_locals(
    names: Mapping[str, Any],
    limit: int = LOCALS_LIMIT,
    is_secret: Callable[[str], bool] = is_secret_name,
) -> str:
    """One line per local: name, type and a short repr; secret-looking names are masked.

    Masking reaches inside values too: secret-named keys and fields of containers, dataclasses
    and pydantic models, and secrets recognised by their value.
    """
    # One budget for the whole summary: many objects each just under the limit of one value
    # still add up to one bounded cost.
    shortener = (_REPR if is_secret is is_secret_name else _short_repr(is_secret)).session()
    lines: list[str] = []
    used = 0
    items = list(names.items())
    for index, (name, value) in enumerate(items):
        if name.startswith("__") and name.endswith("__"):
            continue
        shown = MASK if hidden(name, value, is_secret) else safe_repr(value, shortener)
        line = f"  {name} ({type(value).__name__}) = {shown}"
        if used + len(line) > limit:
            lines.append(f"  ... {len(items) - index} more (inspect them with eval_python)")
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines) if lines else "  (none)"


def render_value(value: object, limit: int = RESULT_LIMIT) -> str:
    """Render a tool result: strings as they are (bounded), other values by bounded repr.

    Secret-named keys and fields inside the value are masked (``dict(os.environ)``); the
    redactor then masks secrets in the text, strings included.
    """
    if isinstance(value, str):
        return clip(value, limit)
    return clip(safe_repr(value, _WIDE), limit)


# Frames of crashoverride itself (any subpackage) are left out of what the model sees.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def format_tool_error(exc: BaseException, original: BaseException | None = None) -> str:
    """The traceback the model sees: agent code frames onward, our own frames left out.

    Agent code runs while ``original`` (the exception being recovered) is being handled, so
    Python chains it as context; the model already has it, so that link is not repeated.
    """
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        tb = tb.tb_next
    chain = exc.__cause__ is not None or exc.__context__ not in (None, original)
    text = "".join(traceback.format_exception(type(exc), exc, tb, chain=chain))
    return clip(text, 4_000)


def describe_result(value: Any, printed: str) -> str:
    parts = []
    if printed:
        parts.append(clip(printed, 3_000))
    if value is not None:
        parts.append(render_value(value))
    return "\n".join(parts) if parts else "OK (no output, no value)"
