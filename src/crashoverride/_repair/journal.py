"""The change journal: what a recovery's agent code changed in live functions, per recovery.

``replace_function`` (kind "replace"), ``rebind_everywhere`` ("rebind") and ``persist_function``
with a new source the live function does not run ("persist") note each change here (``note``),
under the recovery whose agent code is running (``_placement.inside``); ``persist_file_edit``
notes its redacted diff (``note_file``). The fleet backend turns a successful recovery's journal
into a signed fix record (``_fleet.records``); in-process coordination just drops it.

A change is identified by the digest of the code object it replaced (``digest``): bytecode,
constants and names, not files or line numbers, so it is the same in every process of one
deployment.

Every code object a change replaced in this process, whoever made it (agent code, a fleet
record applied on failure or eagerly), is also remembered for as long as something still
holds it (``supersede``): a failure raised through one of them happened before the fix, and
single-flight replays it rather than starting another recovery (``ran_superseded``).
"""

from __future__ import annotations

import hashlib
import sys
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from crashoverride._placement.inside import current_recovery

_MAX_PENDING: Final = 256  # recoveries whose notes are kept until they conclude
_MAX_DIFF: Final = 4_000  # characters of a persisted file edit's diff a record carries
_lock = threading.Lock()
_pending: OrderedDict[str, dict[str, dict[str, str]]] = OrderedDict()
# File edits by recovery, until its record is made (``make``) or they are pushed out.
_files: OrderedDict[str, list[dict[str, str]]] = OrderedDict()
# Live code swaps by recovery, as diffs for its report (``note_live``, ``live_diffs``).
_live: OrderedDict[str, dict[str, tuple[str, str, str]]] = OrderedDict()
# The code objects changes replaced here, by identity (code objects compare equal by content):
# id -> the code, the function it was replaced in, whether its names were rebound (rather than
# its code swapped). All weakly held: an entry lasts while a traceback or a caller holds the code.
_superseded: dict[int, tuple[weakref.ref[types.CodeType], weakref.ref[types.FunctionType], bool]]
_superseded = {}


def supersede(code: types.CodeType, function: types.FunctionType, *, rebound: bool = False) -> None:
    """``function`` no longer runs ``code`` here: a change swapped its code, or (``rebound``)
    rebound the names that held it to another function."""
    key = id(code)
    # A weakref callback may run in the middle of any code (this thread may hold a lock):
    # plain dict operations only, atomic on their own.
    _superseded[key] = (weakref.ref(code, lambda _: _forget(key)), weakref.ref(function), rebound)


def _forget(key: int) -> None:
    entry = _superseded.get(key)
    if entry is not None and entry[0]() is None:
        _superseded.pop(key, None)


def ran_superseded(exc: BaseException | None) -> bool:
    """Whether ``exc`` was raised through code that a change has replaced since it ran, and
    that its function still does not run: a failure from before a fix."""
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None and _superseded:
        code = tb.tb_frame.f_code
        entry = _superseded.get(id(code))
        if entry is not None and entry[0]() is code and _still_replaced(code, *entry[1:]):
            return True
        tb = tb.tb_next
    return False


def _still_replaced(
    code: types.CodeType, ref: weakref.ref[types.FunctionType], rebound: bool
) -> bool:
    function = ref()
    if function is None:  # nothing can run it again
        return True
    if not rebound:
        return function.__code__ is not code
    if "<locals>" in function.__qualname__:
        return True  # no name reaches it but references: it was rebound
    named: object = sys.modules.get(function.__module__)
    for part in function.__qualname__.split("."):
        named = getattr(named, part, None)
    return named is not function


def digest(code: types.CodeType) -> str:
    """A digest of what ``code`` does, stable across processes of one deployment."""
    sha = hashlib.sha256()
    _feed(sha, code)
    return sha.hexdigest()[:32]


def _feed(sha: Any, code: types.CodeType) -> None:
    sha.update(code.co_code)
    shape = (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
             code.co_argcount, code.co_kwonlyargcount, code.co_flags)  # fmt: skip
    sha.update(repr(shape).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed(sha, const)
        elif isinstance(const, frozenset):  # iteration order varies with hash randomisation
            sha.update(repr(sorted(map(repr, const))).encode())
        else:
            sha.update(repr(const).encode())


def note(
    target: types.FunctionType,
    replaced: types.CodeType,
    source: str | None,
    *,
    new: types.CodeType | None = None,
    kind: str = "replace",
) -> None:
    """Agent code changed ``target`` (``replace_function`` swapped its code, ``kind``
    "replace"; ``rebind_everywhere`` rebound it to a function running ``new``, "rebind";
    ``persist_function`` wrote ``new`` to its file, "persist"): remember it for the running
    recovery's fix record. A later change of the same target replaces an earlier one."""

    recovery_id = current_recovery()
    qualname = target.__qualname__
    if recovery_id is None or source is None or "<locals>" in qualname:
        return  # not agent code, or a target no other process can name
    change = {"module": target.__module__, "qualname": qualname, "code_hash": digest(replaced),
              "new_hash": digest(new or target.__code__), "source": source,
              "kind": kind}  # fmt: skip
    with _lock:
        changes = _pending.setdefault(recovery_id, {})
        first = changes.get(f"{target.__module__}:{qualname}")
        if first is not None:  # replaced twice: the original digest is the first one
            change["code_hash"] = first["code_hash"]
        changes[f"{target.__module__}:{qualname}"] = change
        _pending.move_to_end(recovery_id)
        _bound(_pending)


def note_file(recovery_id: str, path: str, diff: str) -> None:
    """A ``persist_file_edit`` of recovery ``recovery_id`` wrote ``diff`` (redacted) to the file
    ``path`` (relative to its import root): information for its fix record."""
    edit = {"path": path, "diff": diff[:_MAX_DIFF]}
    with _lock:
        _files.setdefault(recovery_id, []).append(edit)
        _files.move_to_end(recovery_id)
        _bound(_files)


def note_live(target: types.FunctionType, file: str, old: str, new: str) -> None:
    """Agent code of the running recovery swapped ``target``'s code (``replace_function``):
    keep the unified diff of its ``old`` source against the ``new`` one for the recovery's
    report. Not redacted here: the report redacts it. A later swap of the same target keeps
    the first ``old`` (the diff is against what ran before the recovery)."""
    import difflib

    recovery_id = current_recovery()
    if recovery_id is None:
        return
    name = f"{target.__module__}.{target.__qualname__}"
    with _lock:
        swaps = _live.setdefault(recovery_id, {})
        old = swaps.get(name, ("", old, ""))[1]
        lines = difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=f"a/{name}", tofile=f"b/{name}",
        )  # fmt: skip
        diff = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
        swaps[name] = (file, old, diff[:_MAX_DIFF])
        _live.move_to_end(recovery_id)
        _bound(_live)


def live_diffs(recovery_id: str) -> list[tuple[str, str, str]]:
    """(function, file, diff) of every live code swap ``recovery_id``'s agent code made."""
    with _lock:
        swaps = _live.get(recovery_id, {})
        return [(name, file, diff) for name, (file, _, diff) in swaps.items()]


def _bound(notes: OrderedDict[str, Any]) -> None:
    while len(notes) > _MAX_PENDING:
        notes.popitem(last=False)


def take(recovery_id: str) -> list[dict[str, str]]:
    """The targets noted by a concluded recovery (and forget them); its file edits go into
    its fix record (``take_files``)."""
    with _lock:
        return list(_pending.pop(recovery_id, {}).values())


def take_files(recovery_id: str) -> list[dict[str, str]]:
    """The file edits noted by a recovery (and forget them)."""
    with _lock:
        return _files.pop(recovery_id, [])


def withhold_secrets(recovery_id: str, redact: Callable[[str], str]) -> list[str]:
    """Drop the noted changes whose new source holds a secret (``redact``, the recovery's own
    redactor, would change it); the names dropped. They stay in force here, in a process that
    held the secret already; published, they would copy it into Redis and every process."""
    with _lock:
        changes = _pending.get(recovery_id, {})
        held = [
            key for key, change in changes.items() if redact(change["source"]) != change["source"]
        ]
        names = [f"{changes[key]['module']}.{changes[key]['qualname']}" for key in held]
        for key in held:
            del changes[key]
    return names


def has_changes(recovery_id: str) -> bool:
    with _lock:
        return bool(_pending.get(recovery_id)) or bool(_files.get(recovery_id))


# ------------------------------------------------------------------------- records on the wire


def record_id(recovery_id: str) -> str:
    """The id of the record a recovery publishes (known before it is made: for its report)."""
    return "fix_" + recovery_id.removeprefix("rec_")


# ------------------------------------------------------------------------------------ applying
