"""Write-through access to the locals of a live frame.

On 3.13+ ``frame.f_locals`` is a write-through proxy (PEP 667). On 3.11 and 3.12 it is a
snapshot dict; writes reach the frame only through ``PyFrame_LocalsToFast``, which must run in
the thread that owns the frame while that frame is suspended (it is: it is waiting on our
``__exit__``). Module-level frames need neither: their locals are their globals.
"""

from __future__ import annotations

import sys
from collections.abc import ItemsView, Iterator, KeysView, MutableMapping, ValuesView
from types import FrameType
from typing import Any

_NATIVE_PROXY = sys.version_info >= (3, 13)


def _locals_to_fast(frame: FrameType, clear: int = 0) -> None:
    import ctypes

    # ``clear=1`` also unbinds fast locals missing from the snapshot (needed for ``del``).
    ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(clear))


class CallerLocals(MutableMapping[str, Any]):
    """A mutable mapping of a frame's locals whose writes are what the frame sees next."""

    __slots__ = ("_frame", "writes")

    def __init__(self, frame: FrameType) -> None:
        self._frame: FrameType | None = frame
        # Writes are the evidence that agent code set what the block was meant to produce.
        self.writes = 0

    def release(self) -> None:
        """Drop the frame reference so the frame (and its locals) can be freed."""
        self._frame = None

    @property
    def _live(self) -> FrameType:
        if self._frame is None:
            raise RuntimeError("the recovery has ended; caller locals are no longer reachable")
        return self._frame

    def _is_module(self) -> bool:
        frame = self._live
        return frame.f_locals is frame.f_globals

    def __getitem__(self, name: str) -> Any:
        return self._live.f_locals[name]

    def __setitem__(self, name: str, value: Any) -> None:
        frame = self._live
        self.writes += 1
        if _NATIVE_PROXY or self._is_module():
            frame.f_locals[name] = value
            return
        snapshot = frame.f_locals  # refreshed from the fast locals on every access
        snapshot[name] = value
        _locals_to_fast(frame)

    def __delitem__(self, name: str) -> None:
        frame = self._live
        self.writes += 1
        if _NATIVE_PROXY and not self._is_module():
            # PEP 667 proxies refuse ``del`` of fast locals; unbinding is not something a
            # recovery needs, so say so instead of half-working.
            raise TypeError("caller locals cannot be deleted on this Python; assign instead")
        snapshot = frame.f_locals
        del snapshot[name]
        if not self._is_module():
            _locals_to_fast(frame, clear=1)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._live.f_locals))

    # Reading ``f_locals`` on 3.11/3.12 rebuilds the whole dict from the fast locals: the
    # mixin methods (one ``__getitem__`` per key) would make walking n locals cost n^2. The
    # views below read the frame once; what they show is the locals at that moment.
    def snapshot(self) -> dict[str, Any]:
        """The frame's locals now, read once (a copy: writing to it changes nothing)."""
        return dict(self._live.f_locals)

    def items(self) -> ItemsView[str, Any]:
        return self.snapshot().items()

    def keys(self) -> KeysView[str]:
        return self.snapshot().keys()

    def values(self) -> ValuesView[Any]:
        return self.snapshot().values()

    def get(self, name: str, default: Any = None) -> Any:
        return self._live.f_locals.get(name, default)

    def __len__(self) -> int:
        return len(self._live.f_locals)

    def __contains__(self, name: object) -> bool:
        return name in self._live.f_locals

    def __repr__(self) -> str:
        return f"<caller locals: {', '.join(sorted(self._live.f_locals))}>"
