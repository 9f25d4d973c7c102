"""Secret-named keys and attributes inside values: masked in reprs, collected for the redactor.

A local named ``config`` can hold ``{"db_password": ...}``, a dataclass with a ``password``
field or a pydantic model with an ``api_key``. Two things keep those values in the process:

- ``MaskingRepr`` renders dicts, mappings, dataclasses, pydantic models and named tuples with
  the values of secret-named keys and fields masked, and masks secrets found by value in every
  string *before* a long string is shortened (a clipped key is a partial leak);
- ``secret_values`` walks the failed frame's locals (bounded) and collects the strings held under
  secret-named keys and attributes, so that the redactor masks them wherever they recur (a
  custom ``__repr__``, an exception message, a printed value, a log line).
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Any

from crashoverride._security import secrets
from crashoverride._security.bounded import BoundedRepr, attributes, fields_of
from crashoverride._security.redact import MASK

# A number or a flag under a secret-looking name (``max_tokens``, ``key_count``) is no secret.
_HARMLESS = (bool, int, float, complex, type(None))
_HARMLESS_SET = frozenset(_HARMLESS)
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
           types.MethodType, types.FrameType, types.CodeType, types.TracebackType)  # fmt: skip


def hidden(name: object, value: object, is_secret: Callable[[str], bool]) -> bool:
    """Whether ``value``, found under ``name``, is shown as the mask."""
    return isinstance(name, str) and is_secret(name) and not isinstance(value, _HARMLESS)


class MaskingRepr(BoundedRepr):
    """A bounded repr that never shows a secret-named key's value or a secret found by value.

    What is walked and what is called is ``BoundedRepr``'s; this adds the masking, of strings
    (before a long one is shortened: a clipped key is a partial leak; ``shown_text`` keeps a
    margin around the cut) and of the values under secret-named keys, fields and attributes.
    """

    def __init__(self, is_secret: Callable[[str], bool] = secrets.is_secret_name) -> None:
        super().__init__()
        self.is_secret = is_secret

    def repr_text(self, text: str, level: int) -> str:
        return super().repr_text(secrets.mask(text, MASK, self.is_secret), level)

    def repr_value(self, name: object, value: object, level: int) -> str:
        return MASK if hidden(name, value, self.is_secret) else self.repr1(value, level)


def masking_repr(is_secret: Callable[[str], bool], **limits: int) -> MaskingRepr:
    """A ``MaskingRepr`` with ``reprlib`` limits (``maxstring=...``, ``maxdict=...``)."""
    made = MaskingRepr(is_secret)
    for name, limit in limits.items():
        setattr(made, name, limit)
    return made


# -- collecting the values to mask everywhere ---------------------------------------------------

_MAX_NODES = 1_000  # a frame's locals can reference a whole application: bound the walk
_MAX_DEPTH = 3
_MAX_ITEMS = 200  # items looked at per container
_MAX_SCANNED = 20_000  # longer strings are not scanned for embedded credentials here


def secret_values(
    roots: Iterable[Mapping[str, Any]], is_secret: Callable[[str], bool]
) -> list[str]:
    """Strings held under secret-looking names at any depth, and credentials inside strings.

    Runs at the start of every recovery: a bounded walk (``_MAX_NODES`` objects, ``_MAX_DEPTH``
    levels, ``_MAX_ITEMS`` per container) of plain containers, dataclasses, pydantic models and
    objects' ``__dict__``; crashoverride's own objects are not entered.
    """
    found: list[str] = []
    seen: set[int] = set()
    pending: list[tuple[object, object, int]] = []
    for root in roots:
        try:
            # The first names only: the budget ends the walk before more are looked at, and
            # the locals' summary the model reads shows the first ones. (10,000 locals would
            # otherwise be listed, and pushed here, whole.)
            items = list(islice(root.items(), _MAX_NODES))
            pending.extend((name, value, 1) for name, value in items)
        except Exception:  # an exotic mapping must not stop the recovery
            continue
    budget = _MAX_NODES
    while pending and budget > 0:
        name, value, depth = pending.pop()
        budget -= 1
        kind = type(value)
        if isinstance(value, str | bytes | bytearray):
            text = value if isinstance(value, str) else _decoded(value)
            if text is None:
                continue
            if isinstance(name, str) and is_secret(name):
                found.append(text)
            elif len(text) <= _MAX_SCANNED and ("=" in text or ":" in text):
                # A URL's password or the value of ``key=value`` may later appear on its own.
                # (Whole tokens need no memory: the detector finds them wherever they are.)
                found.extend(secrets.found(text, is_secret))
            continue
        if kind in _HARMLESS_SET or depth >= _MAX_DEPTH or isinstance(value, _OPAQUE):
            continue
        if id(value) in seen or str(getattr(kind, "__module__", "")).startswith("crashoverride"):
            continue  # ours: what it holds that is secret (the api_key) is masked by value
        seen.add(id(value))
        try:
            pending.extend((key, item, depth + 1) for key, item in _children(value, name))
        except Exception:  # a property or mapping that fails is simply not walked
            continue
    return found


_CHAIN = 16  # exceptions of a chain looked at
_CHAIN_FRAMES = 32  # the innermost frames of each one's traceback


def traceback_locals(
    exc: BaseException, skip: types.FrameType | None = None
) -> list[Mapping[str, Any]]:
    """The locals of the frames ``exc`` and the exceptions chained to it passed through.

    A message is often written where the secret is a local: ``connect(password)`` raising
    ``f"authentication failed using {password!r}"`` in a callee, or a cause raised three frames
    down. Their values, collected by ``secret_values``, are then masked in every message of the
    chain. Bounded (``_CHAIN`` exceptions, the innermost ``_CHAIN_FRAMES`` frames of each),
    innermost last (``secret_values`` walks the last roots first); crashoverride's own frames
    and ``skip`` (the protected frame, walked already) are left out.
    """
    roots: list[Mapping[str, Any]] = []
    seen: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _CHAIN:
        item = pending.pop(0)
        if any(item is other for other in seen):
            continue
        seen.append(item)
        frames = []
        tb = item.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        for frame in frames[-_CHAIN_FRAMES:]:
            module = str(frame.f_globals.get("__name__", ""))
            if frame is skip or module == "crashoverride" or module.startswith("crashoverride."):
                continue
            roots.append(frame.f_locals)
        chained = [item.__cause__, item.__context__, *getattr(item, "exceptions", ())]
        pending.extend(e for e in chained if isinstance(e, BaseException))
    return roots[::-1]


def _decoded(value: bytes | bytearray) -> str | None:
    return bytes(value).decode("utf-8", "replace") if len(value) <= _MAX_SCANNED else None


def _children(value: object, name: object) -> Iterable[tuple[object, object]]:
    if isinstance(value, dict | Mapping):
        return [
            pair for pair in islice(value.items(), _MAX_ITEMS) if type(pair[1]) not in _HARMLESS_SET
        ]
    if isinstance(value, list | tuple | set | frozenset):
        fields = fields_of(value) if isinstance(value, tuple) else None
        if fields is not None:
            return [(field, getattr(value, field, None)) for field in fields]
        # Items of a secret-named collection are secrets too (``api_keys = [...]``).
        return [
            (name, item) for item in islice(value, _MAX_ITEMS) if type(item) not in _HARMLESS_SET
        ]
    fields = fields_of(value)
    if fields is not None:
        return [(field, getattr(value, field, None)) for field in fields]
    # Read from the classes' descriptors: no ``__getattr__`` or property of the value runs.
    return attributes(value)[:_MAX_ITEMS]


# -- request data (query strings, form and JSON bodies) -----------------------------------------


def mask_fields(value: Any, is_secret: Callable[[str], bool] = secrets.is_secret_name) -> Any:
    """JSON-like data with the values of secret-named keys masked, at any depth."""
    if isinstance(value, dict):
        return {
            key: MASK if hidden(key, item, is_secret) else mask_fields(item, is_secret)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [mask_fields(item, is_secret) for item in value]
    return value


def mask_query(
    query: str, is_secret: Callable[[str], bool] = secrets.is_secret_name
) -> tuple[str, list[str]]:
    """A query string (or form body) with secret-named parameters masked, and their values."""
    from urllib.parse import unquote_plus

    kept: list[str] = []
    values: list[str] = []
    for part in query.split("&"):
        name, equals, value = part.partition("=")
        if equals and value and is_secret(unquote_plus(name)):
            values.extend({value, unquote_plus(value)})
            part = f"{name}={MASK}"
        kept.append(part)
    return "&".join(kept), values


_DISPOSITION_NAME = re.compile(rb'(?i)content-disposition:[^\r\n]*?\bname="([^"\r\n]*)"')


def mask_multipart(
    body: bytes, content_type: str, is_secret: Callable[[str], bool] = secrets.is_secret_name
) -> bytes:
    """A ``multipart/form-data`` body with the values of secret-named fields masked.

    Everything else stays byte for byte: the boundaries, each part's headers, other fields and
    files. A body whose boundary cannot be read is returned as it is (the value scan still
    applies to it, as to any text)."""
    found = re.search(r'boundary=(?:"([^"]+)"|([^;\s]+))', content_type, re.IGNORECASE)
    if found is None:
        return body
    delimiter = b"--" + (found.group(1) or found.group(2)).encode("latin-1")
    parts = body.split(delimiter)
    for index, part in enumerate(parts[1:], 1):
        head, sep, value = part.partition(b"\r\n\r\n")
        named = _DISPOSITION_NAME.search(head)
        if not sep or named is None or not is_secret(named.group(1).decode("latin-1")):
            continue
        ending = b"\r\n" if value.endswith(b"\r\n") else b""
        parts[index] = head + sep + MASK.encode() + ending
    return delimiter.join(parts)
