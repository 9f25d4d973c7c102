"""Reading objects without running their code: the primitives of ``_diagnose.readonly``.

Attributes come from an instance's ``__dict__``, its class's namespaces (walked through
``type``'s own descriptors, so no metaclass is consulted) or C-level slots; values count as plain
data only when they are exact built-in types, so comparing, hashing, ordering or printing them
runs nothing of the application's.
"""

from __future__ import annotations

import datetime
import types
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Any

from crashoverride._security.text import RESULT_LIMIT, clip

_MISSING: Any = object()
_SHOWN = 60  # items of a container a rendering shows
_MAX_ITEMS = 100_000  # plain data larger than this is not treated as plain (bounded work)
_MRO: Callable[[type], tuple[type, ...]] = type.__dict__["__mro__"].__get__
_TYPE_DICT: Callable[[type], Mapping[str, Any]] = type.__dict__["__dict__"].__get__
_QUALNAME: Callable[[type], str] = type.__dict__["__qualname__"].__get__
_MODULE: Callable[[type], str] = type.__dict__["__module__"].__get__
_SLOTLIKE = (types.GetSetDescriptorType, types.MemberDescriptorType)  # C-level reads
_SCALARS = (int, float, complex, bool, str, bytes, type(None), range)
_SEQUENCES = (list, tuple, set, frozenset)
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()))
_SIZED = (*_SEQUENCES, dict, str, bytes, range, *_VIEWS)
_DATES = (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)
_ZONES = (type(None), datetime.timezone)


def one_of(kind: type, kinds: Iterable[type]) -> bool:
    # Identity, not ``in``: a metaclass may define ``__eq__``/``__hash__``.
    return any(kind is k for k in kinds)


def is_plain(value: object) -> bool:
    """Exact built-in scalars and exact containers of them, within ``_MAX_ITEMS`` items."""
    pending: list[Any] = [value]
    seen = 0
    while pending:
        item = pending.pop()
        kind = type(item)
        seen += 1
        if seen > _MAX_ITEMS:
            return False
        if one_of(kind, _SCALARS):
            if kind is range and len(item) > _MAX_ITEMS:
                return False
        elif one_of(kind, _DATES):
            # A time zone of the application's would run its code to print or compare.
            if not one_of(type(getattr(item, "tzinfo", None)), _ZONES):
                return False
        elif kind is dict:
            pending.extend(dict.keys(item))
            pending.extend(dict.values(item))
        elif one_of(kind, _SEQUENCES) or one_of(kind, _VIEWS):
            pending.extend(item)
        else:
            return False
    return True


def refuse(what: str) -> PermissionError:
    return PermissionError(f"diagnose mode: {what} (read-only inspection without a snapshot)")


def is_type(value: object) -> bool:
    try:
        _MRO(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def class_entry(klass: type, name: str) -> Any:
    for base in _MRO(klass):
        entry = _TYPE_DICT(base).get(name, _MISSING)
        if entry is not _MISSING:
            return entry
    return _MISSING


def instance_dict(value: object) -> dict[str, Any] | None:
    entry = class_entry(type(value), "__dict__")
    if entry is _MISSING or not one_of(type(entry), _SLOTLIKE):
        return None  # no ``__dict__``, or a ``__dict__`` the class computes itself
    found = entry.__get__(value, type(value))
    return found if type(found) is dict else None


def describe(value: object) -> str:
    """How a refusal names ``value``: its class, or its own name for a class or function."""
    if is_type(value):
        return _QUALNAME(value)  # type: ignore[arg-type]
    if type(value) is types.ModuleType:
        return f"module {(instance_dict(value) or {}).get('__name__')}"
    for kind in (types.FunctionType, types.BuiltinFunctionType):
        if type(value) is kind:
            return f"{kind.__dict__['__qualname__'].__get__(value)}()"
    return f"{_QUALNAME(type(value))} object"


def read_attribute(value: object, name: str, default: Any = _MISSING) -> Any:
    """``value.name`` without running code of the value's class (or ``default``)."""
    kind = type(value)
    if name == "__class__":
        return kind
    entry = class_entry(kind, name)
    is_data = entry is not _MISSING and any(
        class_entry(type(entry), hook) is not _MISSING for hook in ("__set__", "__delete__")
    )
    if is_data:
        if one_of(type(entry), _SLOTLIKE):
            return entry.__get__(value, kind)
        raise refuse(f"{describe(value)}.{name} is computed by code (a property or descriptor)")
    if is_type(value):
        own = class_entry(value, name)  # type: ignore[arg-type]
        if own is not _MISSING:
            return own  # the class's own entry (a descriptor as itself, unbound)
    namespace = instance_dict(value)
    if namespace is not None and name in namespace:
        return namespace[name]
    if entry is not _MISSING:
        if type(entry) is types.FunctionType:
            return types.MethodType(entry, value)
        if one_of(type(entry), _SLOTLIKE):
            return entry.__get__(value, kind)
        return entry
    if default is not _MISSING:
        return default
    if class_entry(kind, "__getattr__") is not _MISSING:
        raise refuse(f"{describe(value)}.{name} would be computed by __getattr__")
    raise AttributeError(f"{describe(value)} has no attribute {name!r}")


def has_attribute(value: object, name: str) -> bool:
    """``hasattr`` without computing anything: is ``name`` defined for ``value``?"""
    found = name in (instance_dict(value) or ()) or class_entry(type(value), name) is not _MISSING
    return found or (is_type(value) and class_entry(value, name) is not _MISSING)  # type: ignore[arg-type]


def static_dir(value: object) -> list[str]:
    names: set[str] = set(instance_dict(value) or ())
    for base in _MRO(value if is_type(value) else type(value)):  # type: ignore[arg-type]
        names.update(_TYPE_DICT(base))
    return sorted(names)


def truth(value: object) -> bool:
    kind = type(value)
    if is_plain(value) or one_of(kind, _SIZED):
        return bool(value)
    if all(class_entry(kind, hook) is _MISSING for hook in ("__bool__", "__len__")):
        return True
    raise refuse(f"the truth of a {describe(value)} is computed by code")


def plain_classes(value: Any) -> tuple[type, ...]:
    found: tuple[Any, ...] = value if type(value) is tuple else (value,)
    for item in found:
        if type(item) is not type:  # a metaclass may compute the check
            raise refuse("isinstance/issubclass only against plain classes")
    return found


def render_static(value: object, limit: int = RESULT_LIMIT) -> str:
    """A bounded rendering that reads ``value`` as ``read_attribute`` does (no ``__repr__``)."""
    return clip(_render(value, 4), limit)


def _more(total: int, shown: int) -> str:
    return f", ... ({total - shown} more)" if total > shown else ""


def _render(value: Any, depth: int) -> str:
    kind = type(value)
    if one_of(kind, _SCALARS) or (one_of(kind, _DATES) and is_plain(value)):
        return clip(repr(value), RESULT_LIMIT)
    if depth <= 0:
        return f"<{describe(value)}>"
    if kind is dict:
        pairs = list(islice(dict.items(value), _SHOWN))
        inner = ", ".join(f"{_render(k, depth - 1)}: {_render(v, depth - 1)}" for k, v in pairs)
        return "{" + inner + _more(len(value), len(pairs)) + "}"
    if one_of(kind, _SEQUENCES) or one_of(kind, _VIEWS):
        items = list(islice(value, _SHOWN))
        shown = ", ".join(_render(item, depth - 1) for item in items) + _more(
            len(value), len(items)
        )
        if kind is list:
            return f"[{shown}]"
        if kind is tuple:
            return f"({shown},)" if len(items) == 1 else f"({shown})"
        return f"{kind.__name__}([{shown}])"
    if is_type(value):
        return f"<class '{_MODULE(value)}.{_QUALNAME(value)}'>"
    if kind is types.ModuleType:
        return f"<module {(instance_dict(value) or {}).get('__name__')!r}>"
    if issubclass(kind, BaseException):
        args = BaseException.__dict__["args"].__get__(value, kind)
        return f"{_QUALNAME(kind)}({', '.join(_render(a, depth - 1) for a in args)})"
    if kind is types.FunctionType or kind is types.MethodType:
        func = value.__func__ if kind is types.MethodType else value
        if type(func) is types.FunctionType:
            return f"<function {types.FunctionType.__dict__['__qualname__'].__get__(func)}>"
    fields = instance_dict(value)
    shown = f" {_render(dict(fields), depth - 1)}" if fields else ""
    return f"<{_MODULE(kind)}.{_QUALNAME(kind)} object{shown}>"
