"""Live code repair that reaches every caller, and the current source of live objects.

``module.func = new`` only rebinds one name: callers that did ``from module import func``, bound
methods, callbacks and registries keep the old function. Swapping the function's code object in
place changes the one object all of them hold. That needs a compatible replacement: same free
variables (closures cannot be re-pointed), and a Python function on both sides.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
import types
import weakref
from typing import Any

from ._text import clip

# Where each function replaced in place came from (file, first line, original source), so a fix
# can still be persisted to the original file after its live code has been swapped. Keyed weakly
# by the patched function itself (the object every caller holds; it survives any number of
# swaps), so an entry lasts exactly as long as the function: a long-running process repairing
# short-lived functions (closures, per-request classes) does not accumulate one per repair. Code
# objects cannot be weakly referenced, and the live code is a renamed copy anyway.
ORIGINS: weakref.WeakKeyDictionary[types.FunctionType, tuple[str, int, str]] = (
    weakref.WeakKeyDictionary()
)


def _as_function(value: Any, where: dict[str, Any]) -> types.FunctionType:
    if isinstance(value, str):
        namespace: dict[str, Any] = {}
        from ._namespace import compile_source

        exec(compile_source(value), where, namespace)
        functions = [v for v in namespace.values() if isinstance(v, types.FunctionType)]
        if len(functions) != 1:
            raise ValueError("the new source must define exactly one function")
        return functions[0]
    if isinstance(value, types.MethodType):
        value = value.__func__
    if not isinstance(value, types.FunctionType):
        raise TypeError(f"expected a Python function or its source, got {type(value).__name__}")
    return value


def replace_function(target: Any, new: Any) -> str:
    """Give ``target`` the implementation of ``new`` (a function or its source), in place.

    Every existing reference to ``target`` sees the change, including ``from m import f``
    copies, bound methods and registered callbacks. The new code runs with ``target``'s globals
    and defaults taken from ``new``.
    """
    if isinstance(target, types.MethodType):
        target = target.__func__
    if not isinstance(target, types.FunctionType) and callable(target):
        raise TypeError(
            f"{target!r} is not a Python function (a builtin or C function has no code to swap); "
            "use rebind_everywhere(old, new) to replace the references to it instead"
        )
    if not isinstance(target, types.FunctionType):
        raise TypeError(f"expected a Python function, got {type(target).__name__}")
    replacement = _as_function(new, target.__globals__)
    old_free, new_free = target.__code__.co_freevars, replacement.__code__.co_freevars
    if old_free != new_free:
        raise ValueError(
            f"cannot swap the code of {target.__qualname__}: its free variables {old_free} "
            f"differ from the replacement's {new_free} (a closure's cells cannot be re-pointed); "
            "write the replacement with the same free variables, or use rebind_everywhere()"
        )
    if (
        replacement.__code__.co_flags & inspect.CO_COROUTINE
        != target.__code__.co_flags & inspect.CO_COROUTINE
    ):
        raise ValueError("the replacement must be async exactly when the original is")
    found = ORIGINS.get(target)
    if found is None and not target.__code__.co_filename.startswith("<"):
        try:
            original = inspect.getsource(target)
        except (OSError, TypeError):
            original = ""
        found = (target.__code__.co_filename, target.__code__.co_firstlineno, original)
    if found is not None:
        ORIGINS[target] = found
        if replacement.__code__.co_filename.startswith("<") and replacement not in ORIGINS:
            # The agent may persist the function object it wrote; one defined in a real file
            # keeps its own origin (persisting it must not overwrite the target's definition).
            ORIGINS[replacement] = found
    replaced = target.__code__
    # Keep the target's name so tracebacks and reprs still say what the function is.
    target.__code__ = replacement.__code__.replace(
        co_name=target.__code__.co_name, co_qualname=target.__code__.co_qualname
    )
    target.__defaults__ = replacement.__defaults__
    target.__kwdefaults__ = replacement.__kwdefaults__
    target.__doc__ = replacement.__doc__ or target.__doc__
    from ._fixrecords import note

    note(target, replaced, new if isinstance(new, str) else _source_of(replacement))
    return f"{target.__module__}.{target.__qualname__} now runs the new code for every caller."


def _source_of(function: types.FunctionType) -> str | None:
    # Agent code registers its source (``_namespace``), so functions it defines have one.
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


def rebind_everywhere(old: Any, new: Any) -> list[str]:
    """Rebind every module global and class attribute that is ``old`` to ``new``.

    Reaches ``from m import f`` copies in loaded modules, but not references held elsewhere
    (lists, dicts, closures, bound methods); prefer ``replace_function`` when it applies.
    """
    changed: list[str] = []
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            if value is old:
                namespace[key] = new
                changed.append(f"{name}.{key}")
            elif inspect.isclass(value) and value.__module__ == name:
                for attr, member in list(vars(value).items()):
                    if member is old:
                        setattr(value, attr, new)
                        changed.append(f"{name}.{key}.{attr}")
    if changed and isinstance(old, types.FunctionType) and isinstance(new, types.FunctionType):
        from ._fixrecords import note

        note(old, old.__code__, _source_of(new), new=new.__code__, kind="rebind")
    return changed


def show_source(target: Any) -> str:
    """The source the live object runs now (also for functions patched by a recovery)."""
    if isinstance(target, types.MethodType):
        target = target.__func__
    try:
        return clip(inspect.getsource(target), 8_000)
    except (OSError, TypeError) as exc:
        module = getattr(target, "__module__", None)
        return f"(no source for {target!r}: {exc}; module {module}; it may be builtin or C code)"
