"""The source a live object runs now: also for functions a recovery replaced in place.

``inspect.getsource`` reads the file a function was defined in; after ``replace_function`` the
live code came from agent code, whose text is registered with ``linecache`` when it is compiled
(``_security.gate``). ``ORIGINS`` keeps where a replaced function first came from, so a fix can
still be persisted to the original file.
"""

from __future__ import annotations

import inspect
import textwrap
import types
import weakref
from typing import Any

from crashoverride._security.text import clip

# Where each function replaced in place came from (file, first line, original source), so a fix
# can still be persisted to the original file after its live code has been swapped. Keyed weakly
# by the patched function itself (the object every caller holds; it survives any number of
# swaps), so an entry lasts exactly as long as the function: a long-running process repairing
# short-lived functions (closures, per-request classes) does not accumulate one per repair. Code
# objects cannot be weakly referenced, and the live code is a renamed copy anyway.
ORIGINS: weakref.WeakKeyDictionary[types.FunctionType, tuple[str, int, str]] = (
    weakref.WeakKeyDictionary()
)


def source_of(function: types.FunctionType) -> str | None:
    # Agent code registers its source (``_agent.namespace``), so functions it defines have one.
    try:
        return textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None


def origin(func: Any) -> tuple[str, int, str] | None:
    """(file, first line, original source) of a function, also after ``replace_function``."""
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    if isinstance(func, types.FunctionType) and func in ORIGINS:
        return ORIGINS[func]
    if code.co_filename.startswith("<"):
        return None
    try:
        return code.co_filename, code.co_firstlineno, inspect.getsource(func)
    except (OSError, TypeError):
        return None


def show_source(target: Any) -> str:
    """The source the live object runs now (also for functions patched by a recovery)."""
    if isinstance(target, types.MethodType):
        target = target.__func__
    try:
        return clip(inspect.getsource(target), 8_000)
    except (OSError, TypeError) as exc:
        module = getattr(target, "__module__", None)
        return f"(no source for {target!r}: {exc}; module {module}; it may be builtin or C code)"
