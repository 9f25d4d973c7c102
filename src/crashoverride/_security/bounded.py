"""Bounded reprs of arbitrary values: what a rendering of a local or a tool result may cost.

A recovery renders the failed frame's locals for the model, and a tool result for it later.
``reprlib`` bounds the *text* but not the *work*: for anything it has no rule for, it calls the
value's own ``repr`` and shortens the result, so an object whose ``__repr__`` shows all the
data it holds renders 256 MB to keep 160 characters (6 s and 512 MB in
``benchmarks/bench_scaling.py``). ``BoundedRepr`` decides, by the value's type, what is called:

* strings, bytes, ints, the built-in containers and their subclasses whose ``__repr__`` is the
  built-in one, mappings, exceptions, dataclasses, pydantic models and named tuples are walked
  here, a few items each, through the built-in types' own methods (a subclass's ``__iter__``
  or ``items`` is never asked);
* a type whose ``__repr__`` is ``object``'s or a built-in's that shows no contents, and the
  array and frame types of a few data libraries, which bound their reprs by their own display
  options (``_TRUSTED``), have their repr called;
* any other ``__repr__`` (the application's, or a library's we know nothing of) is called only
  if the data the object holds, estimated from its attributes (a bounded walk that calls none
  of its code), would render small; past that, or once a rendering has spent its budget, the
  object is shown by its attributes, walked here, with a note that its repr was not called.

What this cannot bound, said plainly: a ``__repr__`` that is called is application code. One
that sleeps, does I/O or makes up a large text from little data (``"x" * self.count``) costs
what it costs; one that keeps its data out of sight (in a C extension's fields) is estimated
small. A thread with a deadline would not help: a repr made of C calls (``list.__repr__``, a
string product) holds the GIL, so the waiting thread gets back only when the repr ends (808 ms
for an 8-million-item list against a 20 ms deadline, measured), and one that is stopped keeps
running behind the recovery, in a thread that does not own the objects it reads.
"""

from __future__ import annotations

import array
import builtins
import collections
import copy
import dataclasses
import reprlib
import types
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

# Libraries that bound the repr of their big objects themselves (display options that
# summarise: numpy's threshold, pandas' max_rows). A user who sets those to "unlimited" gets
# what they asked for.
_TRUSTED = frozenset({"numpy", "pandas", "polars", "pyarrow", "torch", "xarray"})
# Built-in sequences whose repr is their items': a subclass that keeps that repr is walked too.
_SEQUENCES: dict[Any, tuple[type, str, str]] = {
    list.__repr__: (list, "[", "]"),
    tuple.__repr__: (tuple, "(", ")"),
    set.__repr__: (set, "{", "}"),
    frozenset.__repr__: (frozenset, "frozenset({", "})"),
    collections.deque.__repr__: (collections.deque, "deque([", "])"),
}
_EMPTY: dict[type, str] = {set: "set()", frozenset: "frozenset()"}
_SORTED = 1_000  # a set no larger is shown sorted, as reprlib does; a larger one is not sorted
_INT_BITS = 13_000  # ~3,900 digits: under CPython's int-to-text limit, and quick to render
HEAVY = 64 * 1024  # characters a value's estimated rendering may reach for its repr to be called
BUDGET = 256 * 1024  # the same, over all the values one rendering session calls a repr on
_NODES = 200  # objects the estimate of one value looks at
_SAMPLE = 8  # items of a container the estimate looks at (the rest are assumed alike)
_TYPE_DICT = type.__dict__["__dict__"]
# Around a cut: longer than any secret format the detector knows, PEM blocks aside (``clip``).
MARGIN = 600


def fields_of(value: object) -> list[str] | None:
    """The named fields of a dataclass, pydantic model or named tuple (None: not one of them)."""
    cls = type(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [f.name for f in dataclasses.fields(value) if f.repr]
    pydantic = getattr(cls, "__pydantic_fields__", None)
    if isinstance(pydantic, dict) and hasattr(value, "__pydantic_fields_set__"):
        return [name for name, info in pydantic.items() if getattr(info, "repr", True)]
    named = getattr(cls, "_fields", None)
    if isinstance(value, tuple) and isinstance(named, tuple):
        return [str(name) for name in named]
    return None


def attributes(value: object) -> list[tuple[str, Any]]:
    """The instance's own attributes (``__dict__`` and slots), read with no code of its own: the
    descriptors are looked up on the classes, so no ``__getattr__`` or property runs."""
    cls = type(value)
    found: list[tuple[str, Any]] = []
    have_dict = False
    for klass in cls.__mro__:
        own = _TYPE_DICT.__get__(klass)
        held = own.get("__dict__")
        if not have_dict and type(held) is types.GetSetDescriptorType:
            have_dict = True
            try:
                state = held.__get__(value, cls)
            except Exception:  # an exotic type's dict that cannot be read: not shown
                state = None
            if type(state) is dict:
                found.extend(islice(dict.items(state), _NODES))
        slots = own.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if not isinstance(name, str) or name in ("__dict__", "__weakref__"):
                continue
            private = name.startswith("__") and not name.endswith("__")
            stored = f"_{klass.__name__.lstrip('_')}{name}" if private else name
            slot = own.get(stored)
            if type(slot) is types.MemberDescriptorType:
                try:
                    found.append((name, slot.__get__(value, cls)))
                except AttributeError:  # a slot never set
                    continue
    return found


def _trusted(kind: type) -> bool:
    return str(getattr(kind, "__module__", "")).partition(".")[0] in _TRUSTED


def _plain_repr(kind: type) -> bool:
    """A repr that shows no contents: ``object``'s, or a built-in type's (a function, a module,
    a float): cheap whatever the value holds. (The built-in containers are walked first.)"""
    shown = getattr(kind, "__repr__", None)
    return shown is object.__repr__ or getattr(shown, "__objclass__", None) in _PLAIN_OWNERS


_PLAIN_OWNERS = frozenset(
    {object, float, complex, bool, type, types.FunctionType, types.BuiltinFunctionType,
     types.MethodType, types.ModuleType, types.CodeType, types.FrameType, range, slice,
     memoryview, property, classmethod, staticmethod, type(None)}
)  # fmt: skip


class _Estimate:
    """About how many characters a rendering that shows all of a value would take: a walk of
    ``_NODES`` objects at most, through built-in methods and attribute slots only."""

    def __init__(self) -> None:
        self.nodes = _NODES

    def of(self, value: object, depth: int) -> float:
        self.nodes -= 1
        kind = type(value)
        if isinstance(value, str):
            return str.__len__(value) + 2
        if isinstance(value, bytes | bytearray):
            return len(memoryview(value)) + 3
        if isinstance(value, int):
            return int.bit_length(value) * 0.31 + 1
        if kind in _PLAIN_OWNERS or depth <= 0 or self.nodes <= 0:
            return 16
        if _trusted(kind):
            return 2_000  # their own display options bound it
        count, sample = _contents(value)
        seen = list(islice(sample, _SAMPLE))
        if not seen:
            return 16 + count
        each = sum(self.of(item, depth - 1) for item in seen) / len(seen)
        return 16 + count * (each + 2)


def _contents(value: object) -> tuple[int, Iterable[Any]]:
    """How many items (or attributes) ``value`` holds, and an iterable of the first ones."""
    bases: tuple[Any, ...] = (list, tuple, set, frozenset, collections.deque)
    for base in bases:
        if isinstance(value, base):
            return base.__len__(value), base.__iter__(value)
    if isinstance(value, dict):
        return dict.__len__(value), (pair for pair in dict.items(value))
    held = [item for _, item in attributes(value)]
    if isinstance(value, BaseException):  # its arguments live out of its ``__dict__``
        held.extend(BaseException.__dict__["args"].__get__(value, type(value)))
    return len(held), iter(held)


def estimate(value: object) -> float:
    """About how many characters a repr that renders all of ``value`` would make."""
    try:
        return _Estimate().of(value, 4)
    except Exception:  # an exotic object the walk cannot read: assume it small
        return 16


class BoundedRepr(reprlib.Repr):
    """A ``reprlib.Repr`` whose work, not only its text, is bounded (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self.spent = 0.0  # estimated characters of the reprs called so far
        self._session = False

    def session(self) -> BoundedRepr:
        """A copy whose budget covers several values (``repr`` on it shares one budget)."""
        made = copy.copy(self)
        made.spent, made._session = 0.0, True
        return made

    def repr(self, x: Any) -> str:
        own = self if self._session else self.session()
        return own.repr1(x, own.maxlevel)

    # -- the values walked here -----------------------------------------------------------------

    def repr1(self, x: Any, level: int) -> str:
        kind = type(x)
        if isinstance(x, str):
            return self.repr_text(self.shown_text(x), level)
        if isinstance(x, bytes | bytearray):
            return self._bytes(x)
        if kind is int:
            if x.bit_length() > _INT_BITS:
                return f"<int of about {int(x.bit_length() * 0.30103) + 1} digits>"
            return self.repr_int(x, level)
        shown = getattr(kind, "__repr__", None)
        sequence = _SEQUENCES.get(shown)
        if sequence is not None:
            return self._sequence(x, level, *sequence)
        if kind is array.array:
            return self.repr_array(x, level)
        if isinstance(x, dict | types.MappingProxyType) or (
            isinstance(x, Mapping) and shown is not object.__repr__
        ):
            items = dict.items(x) if isinstance(x, dict) else x.items()
            body = self.pairs(iter(items), len(x), level, "{", ": ", "}")
            return body if kind is dict else f"{kind.__name__}({body})"
        if isinstance(x, BaseException) and shown is BaseException.__repr__:
            args = BaseException.__dict__["args"].__get__(x, kind)
            if len(args) == 1 and level > 0:  # ``ValueError('boom')``, without the comma
                return f"{kind.__name__}({self.repr1(args[0], level - 1)})"
            return kind.__name__ + self._sequence(args, level, tuple, "(", ")")
        names = fields_of(x)
        if names is not None:
            pairs = ((name, getattr(x, name, None)) for name in names)
            return kind.__name__ + self.pairs(pairs, len(names), level, "(", "=", ")", True)
        if _plain_repr(kind) or _trusted(kind):
            return self.repr_instance(x, level)
        size = estimate(x)
        if size > HEAVY or self.spent + size > BUDGET:
            return self._unrendered(x, size, level)
        self.spent += size
        return self.repr_instance(x, level)

    def shown_text(self, text: str) -> str:
        """The parts of ``text`` a repr of it can show: its head and tail, each with a margin
        (``MaskingRepr`` masks secrets in them; a secret across the cut stays whole)."""
        keep = self.maxstring + MARGIN
        size = str.__len__(text)
        if size <= 2 * keep + 1:
            return str.__getitem__(text, slice(None))  # a plain ``str``, for a subclass too
        return f"{str.__getitem__(text, slice(keep))}\n{str.__getitem__(text, slice(-keep, None))}"

    def repr_text(self, text: str, level: int) -> str:
        return self.repr_str(text, level)

    def _bytes(self, value: bytes | bytearray) -> str:
        # ``reprlib`` has no bytes rule: it would render all of ``value`` to keep a few
        # characters. The same text, from a repr of each end only.
        base: Any = bytes if isinstance(value, bytes) else bytearray
        limit = self.maxother
        size = len(memoryview(value))
        if size <= limit:
            return builtins.repr(base(value))
        head = builtins.repr(base.__getitem__(value, slice(limit)))
        tail = builtins.repr(base.__getitem__(value, slice(size - limit, None)))
        i = max(0, (limit - 3) // 2)
        j = max(0, limit - 3 - i)
        return head[:i] + self.fillvalue + tail[len(tail) - j :]

    def _sequence(self, x: Any, level: int, base: Any, left: str, right: str) -> str:
        """A built-in sequence's text, a few items, read with the built-in type's methods."""
        count: int = base.__len__(x)
        if count == 0:
            return _EMPTY.get(base, f"{left}{right}")
        limit = getattr(self, "max" + base.__name__, self.maxlist)
        items: Iterator[Any] = base.__iter__(x)
        if base in (set, frozenset) and count <= _SORTED:
            try:
                items = iter(sorted(items))  # as reprlib shows them
            except Exception:
                items = base.__iter__(x)
        if level <= 0:
            return f"{left}{self.fillvalue}{right}"
        pieces = [self.repr1(item, level - 1) for item in islice(items, limit)]
        if count > limit:
            pieces.append(self.fillvalue)
        trail = "," if base is tuple and count == 1 else ""
        return f"{left}{', '.join(pieces)}{trail}{right}"

    def pairs(
        self,
        pairs: Iterator[tuple[Any, Any]],
        count: int,
        level: int,
        opening: str,
        between: str,
        closing: str,
        bare_names: bool = False,
    ) -> str:
        """``name: value`` pairs (or ``name=value``), the first ``maxdict`` of them."""
        if count == 0:
            return opening + closing
        if level <= 0:
            return opening + self.fillvalue + closing
        limit = self.maxdict
        pieces = []
        for name, value in islice(pairs, limit):
            label = str(name) if bare_names else self.repr1(name, level - 1)
            pieces.append(f"{label}{between}{self.repr_value(name, value, level - 1)}")
        if count > limit:
            pieces.append(self.fillvalue)
        return opening + ", ".join(pieces) + closing

    def repr_value(self, name: object, value: object, level: int) -> str:
        """The value of a key, field or attribute (``MaskingRepr`` masks secret-named ones)."""
        return self.repr1(value, level)

    def _unrendered(self, x: object, size: float, level: int) -> str:
        held = attributes(x)
        if isinstance(x, BaseException):
            held.insert(0, ("args", BaseException.__dict__["args"].__get__(x, type(x))))
        shown = self.pairs(iter(held), len(held), level, "; ", "=", "", True) if held else ""
        why = f"repr not called (its data would render as ~{_amount(size)})"
        return f"<{type(x).__name__} object, {why}{shown}>"


def _amount(size: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.0f} {unit}"
    return f"{size:.0f} characters"
