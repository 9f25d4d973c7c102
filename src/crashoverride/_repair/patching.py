"""Live code repair that reaches every caller, and the current source of live objects.

``module.func = new`` only rebinds one name: callers that did ``from module import func``, bound
methods, callbacks and registries keep the old function. Swapping the function's code object in
place changes the one object all of them hold. That needs a compatible replacement: same free
variables (closures cannot be re-pointed), and a Python function on both sides.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import weakref
from typing import Any

from crashoverride._diagnose.source import ORIGINS, source_of
from crashoverride._security.gate import compile_source, run_code


def as_function(value: Any, where: dict[str, Any]) -> types.FunctionType:
    if isinstance(value, str):
        namespace: dict[str, Any] = {}
        run_code(compile_source(value), where, namespace)
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
    replacement = as_function(new, target.__globals__)
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
    before = (target.__defaults__, target.__kwdefaults__, target.__doc__)
    # Keep the target's name so tracebacks and reprs still say what the function is.
    target.__code__ = replacement.__code__.replace(
        co_name=target.__code__.co_name, co_qualname=target.__code__.co_qualname
    )
    target.__defaults__ = replacement.__defaults__
    target.__kwdefaults__ = replacement.__kwdefaults__
    target.__doc__ = replacement.__doc__ or target.__doc__
    from crashoverride._repair import watch
    from crashoverride._repair.journal import note, note_live, supersede

    supersede(replaced, target)
    # Weakly: the watch must not keep a short-lived function (a closure) alive.
    watch.patched(_name(target), replaced, target.__code__,
                  functools.partial(_swap_back, weakref.ref(target), target.__code__, replaced,
                                    before))  # fmt: skip
    new_source = new if isinstance(new, str) else source_of(replacement)
    note(target, replaced, new_source)
    if found is not None and new_source is not None:
        note_live(target, found[0], found[2], new_source)
    return f"{target.__module__}.{target.__qualname__} now runs the new code for every caller."


def _name(function: types.FunctionType) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def _swap_back(
    ref: weakref.ref[types.FunctionType],
    new: types.CodeType,
    old: types.CodeType,
    before: tuple[Any, Any, str | None],
) -> None:
    """Undo a ``replace_function`` (the patch watch's revert), unless the code changed since."""
    target = ref()
    if target is not None and target.__code__ is new:
        target.__code__ = old
        target.__defaults__, target.__kwdefaults__, target.__doc__ = before


def rebind_everywhere(old: Any, new: Any) -> list[str]:
    """Rebind every module global and class attribute that is ``old`` to ``new``.

    Reaches ``from m import f`` copies in loaded modules, but not references held elsewhere
    (lists, dicts, closures, bound methods); prefer ``replace_function`` when it applies.
    """
    changed = _rebind(old, new)
    if changed and isinstance(old, types.FunctionType) and isinstance(new, types.FunctionType):
        from crashoverride._repair import watch
        from crashoverride._repair.journal import note, supersede

        supersede(old.__code__, old, rebound=True)
        note(old, old.__code__, source_of(new), new=new.__code__, kind="rebind")
        # Reverted by rebinding back: never journaled, so the new code is not "superseded".
        undo = functools.partial(_rebind_back, weakref.ref(new), weakref.ref(old))
        watch.patched(_name(old), old.__code__, new.__code__, undo)
    return changed


def _rebind_back(
    new: weakref.ref[types.FunctionType], old: weakref.ref[types.FunctionType]
) -> None:
    """Undo a ``rebind_everywhere`` (the patch watch's revert): the names back to ``old``."""
    then, now = old(), new()
    if then is not None and now is not None:
        _rebind(now, then)


def _rebind(old: Any, new: Any) -> list[str]:
    changed: list[str] = []
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            if value is old:
                namespace[key] = new
                changed.append(f"{name}.{key}")
            # ``type(value)``, never ``isinstance``: that asks the object its ``__class__``,
            # and a library's lazy proxy answers by loading what it stands for (openai's import
            # a thousand modules, taking seconds): every module's globals are walked here.
            elif issubclass(type(value), type) and value.__module__ == name:
                for attr, member in list(vars(value).items()):
                    if member is old:
                        setattr(value, attr, new)
                        changed.append(f"{name}.{key}.{attr}")
    return changed
