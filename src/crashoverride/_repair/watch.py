"""The patch watch: a live patch that makes things worse is put back.

Every live patch (``replace_function``, ``rebind_everywhere``, in agent code or applied from a
fleet record) is registered here (``patched``) with what it replaced. When the recovery that made
it ends, or the fleet record that brought it is applied eagerly, it is armed (``arm``): for
``patch_watch`` seconds, each failure crashoverride sees raised through the new code is judged
against the old code's record, and the patch is reverted when the new code

- raised an exception type the old code was never seen raising here, or
- failed more often than the old code did: more failures since the patch than crashoverride saw
  raised through the old code in the ``patch_watch`` seconds before it.

"Seen" is precise: an exception that reached a handler of crashoverride (a ``with`` block, a
decorated call, a task, a request; ``observe``, called first thing on the failure path) or that
a single-flight replay raised, whose traceback passes through the code in question. Failures
the application catches itself are invisible to crashoverride, before the patch as after.
Failures raised by a recovery's own agent code (its experiments, its ``rerun()``) are not
counted: they are that recovery's work.

Why the failure path and no call counter: counting calls needs the patched function wrapped or
traced, which changes its frames and signature (a trampoline) or slows every call of the
process (a profile hook). Failures already pass through crashoverride, so watching them costs
the happy path nothing at all: a patched function that succeeds runs exactly the code the agent
wrote. The price is that rates are counts of failures over equal windows, not ratios of calls.

A revert restores the old code for every caller (the same objects patching changed), reverts
every change the same recovery or record made (a fix spanning two functions stands or falls
whole), emits ``recovery.patch_reverted`` and calls the revocation the fleet attached
(``attach``), if any. The new code is not marked superseded (``journal.supersede``): a failure
it raised is recovered afresh, never replayed or skipped as raised by replaced code.
"""

from __future__ import annotations

import threading
import time
import types
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final

from crashoverride._observe import events
from crashoverride._placement.inside import current_recovery
from crashoverride._security.redact import fixed, scanned

_MAX_CODES: Final = 512  # code objects whose recent failures are remembered
_MAX_TIMES: Final = 256  # failure times remembered per code object
_MAX_PATCHES: Final = 256  # patches remembered for a revert (a window's or a revocation's)
_MARK: Final = "__crashoverride_watched__"  # an exception is counted once (nested handlers)

Revoke = Callable[[str], None]
Record = tuple[str, Revoke]  # a fleet record's id and its revocation


class _Seen:
    """Failures crashoverride saw raised through one code object."""

    __slots__ = ("code", "times", "types")

    def __init__(self, code: types.CodeType) -> None:
        self.code = weakref.ref(code)
        self.times: deque[float] = deque(maxlen=_MAX_TIMES)
        self.types: set[str] = set()


class _Patch:
    """One live change and how to undo it."""

    __slots__ = ("after", "before", "group", "name", "new", "new_types", "old", "record",
                 "restore", "reverted", "since", "until")  # fmt: skip

    def __init__(
        self, name: str, old: types.CodeType, new: types.CodeType, restore: Callable[[], None]
    ) -> None:
        self.name, self.old, self.new, self.restore = name, old, new, restore
        self.group = current_recovery()  # armed with its recovery (None: by an eager apply)
        self.since = time.monotonic()
        self.until: float | None = None  # armed: watched until then
        self.before = 0
        self.after = 0
        self.new_types: list[str] = []
        self.record: Record | None = None  # the fleet record: its id, its revocation
        self.reverted = False


_lock = threading.RLock()
_seen: OrderedDict[int, _Seen] = OrderedDict()
_patches: OrderedDict[int, _Patch] = OrderedDict()  # by id of the new code


def patched(
    name: str, old: types.CodeType, new: types.CodeType, restore: Callable[[], None]
) -> None:
    """A function named ``name`` now runs ``new`` instead of ``old``; ``restore`` undoes it."""
    with _lock:
        for earlier in list(_patches.values()):
            if earlier.new is old and earlier.group == current_recovery():
                # Patched twice by one recovery: one change, whose old code is the first's.
                old, restore = earlier.old, _both(restore, earlier.restore)
                del _patches[id(earlier.new)]
        _patches[id(new)] = _Patch(name, old, new, restore)
        while len(_patches) > _MAX_PATCHES:
            _patches.popitem(last=False)


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def restore() -> None:
        first()
        then()

    return restore


def arm(group: str | None, window: float, record: Record | None = None) -> None:
    """Watch the patches ``group`` made (a recovery's id; None: an eager fleet apply) for
    ``window`` seconds from now (0: never), with the old code's failures of the same span
    before each patch as the bar. Called as the recovery ends, whatever its outcome."""
    now = time.monotonic()
    with _lock:
        mine = [p for p in _patches.values() if p.group == group and p.until is None]
        for patch in mine:
            patch.until = now + window
            patch.before = _count(patch.old, patch.since - window, patch.since)
            if group is None and record is not None:
                patch.group = record[0]  # a later eager apply arms only its own
            if record is not None:
                patch.record = record
        worse = [p for p in mine if window > 0 and _why(p)]
    for patch in worse[:1]:
        _revert(patch, _why(patch))


def attach(group: str, record: Record, names: tuple[str, ...] = ()) -> None:
    """The patches of recovery ``group`` travel as fleet record ``record`` (published, or
    applied on failure): a revert revokes it. If they were reverted already, revoke now.
    ``names``: the functions the record just changed here, adopted by ``group`` if they were
    not patched by code marked as its own (the record's code ran where the frame lives)."""
    with _lock:
        for patch in _patches.values():
            if patch.group is None and patch.until is None and patch.name in names:
                patch.group = group
        mine = [p for p in _patches.values() if p.group == group]
        for patch in mine:
            patch.record = record
        gone = any(p.reverted for p in mine)
    if gone:
        record[1]("its patch was reverted before the record was published")


def observe(exc: BaseException) -> None:
    """A failure crashoverride sees: remember it, and revert a watched patch it shows worse.
    Called on the failure path only, first thing; never raises."""
    try:
        _observe(exc)
    except Exception:  # the watch must never stand between a failure and its recovery
        pass


def _observe(exc: BaseException) -> None:
    if current_recovery() is not None or getattr(exc, _MARK, False):
        return  # agent code's own work, or counted already by an outer handler
    try:
        setattr(exc, _MARK, True)
    except Exception:  # no __dict__: it may be counted twice, which only errs toward a revert
        pass
    now, kind = time.monotonic(), f"{type(exc).__module__}.{type(exc).__qualname__}"
    codes: dict[int, types.CodeType] = {}
    tb = exc.__traceback__
    while tb is not None:
        codes.setdefault(id(tb.tb_frame.f_code), tb.tb_frame.f_code)
        tb = tb.tb_next
    worse: list[tuple[_Patch, str]] = []
    with _lock:
        for key, code in codes.items():
            seen = _seen.get(key)
            if seen is None or seen.code() is not code:
                seen = _seen[key] = _Seen(code)
            _seen.move_to_end(key)
            seen.times.append(now)
            seen.types.add(kind)
            patch = _patches.get(key)
            if patch is None or patch.new is not code or patch.reverted:
                continue
            patch.after += 1
            if kind not in patch.new_types:
                patch.new_types.append(kind)
            why = _why(patch) if patch.until is not None and now <= patch.until else ""
            if why:
                worse.append((patch, why))
        while len(_seen) > _MAX_CODES:
            _seen.popitem(last=False)
    for patch, why in worse[:1]:
        _revert(patch, why)


def _count(code: types.CodeType, start: float, end: float) -> int:
    seen = _seen.get(id(code))
    if seen is None or seen.code() is not code:
        return 0
    return sum(1 for at in seen.times if start <= at <= end)


def _why(patch: _Patch) -> str:
    """Why ``patch`` made things worse, or "" if it did not (yet)."""
    seen = _seen.get(id(patch.old))
    known = seen.types if seen is not None and seen.code() is patch.old else set()
    new = [kind for kind in patch.new_types if kind not in known]
    if new:
        return f"the new code raised {', '.join(new)}, which the old code never raised here"
    if patch.after > patch.before:
        return (f"the new code failed more often than the old code: {patch.after} failures "
                f"since the patch, {patch.before} before it")  # fmt: skip
    return ""


def _revert(patch: _Patch, reason: str, *, by: str = "watch") -> None:
    """Revert ``patch`` and every other change of its recovery or record; revoke its record."""
    with _lock:
        group = [p for p in _patches.values() if p.group == patch.group and not p.reverted]
        if patch.reverted or patch not in group:
            return  # reverted already (by another thread, or a revocation)
        for each in group:
            each.reverted = True
    for each in group:
        each.restore()
    record = patch.record
    events.emit("warning", events.PATCH_REVERTED, targets=[scanned(p.name) for p in group],
                reason=scanned(reason), reverted_by=fixed(by),
                fix_record=scanned(record[0]) if record is not None else None)  # fmt: skip
    if record is not None and by == "watch":
        record[1](reason)


def revoked(record_id: str, reason: str) -> list[str]:
    """The fleet revoked record ``record_id``: revert what it changed here (the names)."""
    with _lock:
        found = [
            p for p in _patches.values()
            if p.record is not None and p.record[0] == record_id and not p.reverted
        ]  # fmt: skip
    names = [p.name for p in found]
    if found:
        _revert(found[0], reason, by="fleet")
    return names
