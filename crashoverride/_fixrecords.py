"""Fix records: the code a recovery changed, signed, so other processes can apply it.

A recovery's agent code that changes a function is noted here (``note``), per recovery:
``replace_function``, ``rebind_everywhere``, and ``persist_function`` with a new source the live
function does not run (kind "persist": applied live elsewhere as ``replace_function`` would;
one the live function runs already was noted by the call that made it run it, and is not
carried twice). When that recovery succeeds, the fleet backend turns the notes into one record:
the fingerprint, each target (module, qualname, digest of the code it replaced, new source), the
recovery id, the time and who approved the code, signed with HMAC-SHA256 under the fleet key.

A ``persist_file_edit`` (any text edit, ``note_file``) has no live equivalent: the record
carries it as information (its path from the import root, its redacted diff), shown to
``approve=`` and never applied. Other processes never write it to their files: the processes of
one host share the file the leader wrote already, and other hosts' copies are the deployment's,
which brings the edit with its next release (a running replica rewriting its own image would
drift from what was deployed and reviewed).

A process applies a record only if its signature verifies AND each target's current code has
the recorded digest (the same deployment); anything else is refused. Digests are computed from
the code object itself (bytecode, constants, names), not from files or line numbers, so they
agree between processes of one deployment and differ when the code differs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

_MAX_PENDING: Final = 256  # recoveries whose notes are kept until they conclude
_MAX_DIFF: Final = 4_000  # characters of a persisted file edit's diff a record carries
_lock = threading.Lock()
_pending: OrderedDict[str, dict[str, dict[str, str]]] = OrderedDict()
# File edits by recovery, until its record is made (``make``) or they are pushed out.
_files: OrderedDict[str, list[dict[str, str]]] = OrderedDict()


class Refused(Exception):
    """A record that must not be applied here; the message says why."""


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
    from ._pipeline import current_recovery

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


def _bound(notes: OrderedDict[str, Any]) -> None:
    while len(notes) > _MAX_PENDING:
        notes.popitem(last=False)


def take(recovery_id: str) -> list[dict[str, str]]:
    """The targets noted by a concluded recovery (and forget them); its file edits go into
    its record (``make``)."""
    with _lock:
        return list(_pending.pop(recovery_id, {}).values())


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


def make(
    *,
    fingerprint: str,
    targets: list[dict[str, str]],
    recovery_id: str,
    approved_by: str,
    recipe: tuple[str, ...] = (),
    turns: int = 0,
) -> dict[str, Any]:
    """A record; ``recipe``: the recovery's state-repair snippets (``_recipes``), left out when
    they hold a secret; ``turns``: the model calls it took. The file edits the recovery
    persisted (``note_file``) come with it."""
    from ._recipes import told, withheld

    reason = withheld(tuple(recipe)) if recipe else ""
    if reason:
        told(recovery_id, fingerprint, reason)
        recipe = ()
    with _lock:
        files = _files.pop(recovery_id, [])
    return {"id": record_id(recovery_id), "fingerprint": fingerprint,
            "targets": targets, "recovery_id": recovery_id, "at": time.time(),
            "approved_by": approved_by, "recipe": list(recipe), "turns": turns,
            "files": files}  # fmt: skip


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def sign(record: dict[str, Any], key: bytes) -> str:
    """The stored form: the record and its HMAC-SHA256 signature, as JSON."""
    signature = hmac.new(key, _canonical(record), hashlib.sha256).hexdigest()
    return json.dumps({"record": record, "sig": signature})


def verify(stored: str | bytes, key: bytes) -> dict[str, Any]:
    """The record inside ``stored``, if its signature verifies; else ``Refused``."""
    try:
        envelope = json.loads(stored)
        record, signature = envelope["record"], envelope["sig"]
        expected = hmac.new(key, _canonical(record), hashlib.sha256).hexdigest()
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"not a fix record ({type(exc).__name__})") from None
    if not isinstance(signature, str) or not hmac.compare_digest(signature, expected):
        raise Refused("bad signature (not signed with this fleet's key)")
    if not isinstance(record, dict) or not isinstance(record.get("targets"), list):
        raise Refused("malformed record")
    if not all(isinstance(snippet, str) for snippet in record.get("recipe", [])):
        raise Refused("malformed recipe")
    files = record.get("files", [])
    if not isinstance(files, list) or not all(
        isinstance(edit, dict) and isinstance(edit.get("path"), str)
        and isinstance(edit.get("diff"), str) for edit in files
    ):  # fmt: skip
        raise Refused("malformed file edits")
    return record


# ------------------------------------------------------------------------------------ applying


def _resolve(module: str, qualname: str) -> types.FunctionType:
    owner: Any = sys.modules.get(module)
    if owner is None:
        raise Refused(f"module {module} is not loaded here")
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    if isinstance(owner, types.MethodType):
        owner = owner.__func__
    if not isinstance(owner, types.FunctionType):
        raise Refused(f"{module}.{qualname} is not a Python function here")
    return owner


def check(record: dict[str, Any]) -> list[tuple[types.FunctionType, dict[str, str]]]:
    """The targets still to change; ``Refused`` if any runs code of another deployment.

    Empty when every target already runs the fix (applied before, here or by a replay).
    """
    todo = []
    for target in record["targets"]:
        function = _resolve(str(target["module"]), str(target["qualname"]))
        current = digest(function.__code__)
        if current == target.get("new_hash"):
            continue
        if current != target.get("code_hash"):
            raise Refused(
                f"{target['module']}.{target['qualname']} runs other code here (code hash "
                f"{current}, the record was made against {target.get('code_hash')})"
            )
        todo.append((function, target))
    return todo


def apply(todo: list[tuple[types.FunctionType, dict[str, str]]]) -> list[str]:
    """Make each change as the recovery did (``replace_function`` or ``rebind_everywhere``);
    the names changed."""
    from ._patching import _as_function, rebind_everywhere, replace_function

    changed = []
    for function, target in todo:
        if target.get("kind") == "rebind":
            rebind_everywhere(function, _as_function(str(target["source"]), function.__globals__))
        else:
            replace_function(function, str(target["source"]))
        changed.append(f"{target['module']}.{target['qualname']}")
    return changed


async def receive(
    stored: str | bytes, key: bytes, approve: Callable[..., Any] | None, call: Any
) -> tuple[dict[str, Any], list[str]]:
    """Verify, check, approve and apply a stored record: (the record, the names changed).

    Nothing changed when this process runs the fix already. ``approve`` (``approve=``) sees the
    code first, through ``call`` (the owner's context, or the helper loop). ``Refused`` when any
    rule says no.
    """
    record = verify(stored, key)
    todo = check(record)
    if not record["targets"] and not record.get("recipe") and record.get("files"):
        raise Refused(
            f"nothing to apply here: the record carries only persisted file edits "
            f"({', '.join(not_applied(record))}), which other processes never apply (the "
            "processes of one host share the file; other hosts get it with their next deployment)"
        )
    if not todo and not record.get("recipe"):
        return record, []
    if approve is not None:
        from ._report import ApprovalRequest

        names = [f"{t['module']}.{t['qualname']}" for t in record["targets"]]
        request = ApprovalRequest(approval_text(record), tool="apply_fix", source="fleet",
                                  arguments={"record": record.get("id"), "targets": names},
                                  is_code=True)  # fmt: skip
        try:
            verdict = await call(lambda: approve(request))
        except Exception as exc:  # an approver that fails denies, as for any tool call
            raise Refused(f"approve= raised {type(exc).__name__}: {exc}"[:200]) from None
        if not verdict or isinstance(verdict, str):
            raise Refused(f"denied by approve=: {verdict!r}"[:200])
    return record, apply(todo)


def approval_text(record: dict[str, Any]) -> str:
    """What ``approve=`` is shown of a propagated fix: the code that will run."""
    lines = [f"# fix record {record.get('id')} from recovery {record.get('recovery_id')}"]
    for target in record["targets"]:
        name = f"{target['module']}.{target['qualname']}"
        lines.append(_HOW.get(str(target.get("kind")), "# replace_function({}):").format(name))
        lines.append(str(target["source"]).rstrip("\n"))
    for snippet in record.get("recipe", []):
        lines.append("# state repair, replayed when this failure recurs (recipe):")
        lines.append(str(snippet).rstrip("\n"))
    for edit in record.get("files", []):
        lines.append(f"# persisted file edit of file {edit['path']} in the recovering process: "
                     "not applied here (shown for information; the diff is redacted):")  # fmt: skip
        lines.append(str(edit["diff"]).rstrip("\n"))
    return "\n".join(lines) + "\n"


_HOW: Final = {
    "rebind": "# rebind_everywhere({}) to:",
    "persist": "# persist_function({}) in the recovering process; applied here live, as "
    "replace_function:",
}


def not_applied(record: dict[str, Any]) -> list[str]:
    """What a record carries that this process does not apply: its persisted file edits."""
    return [
        f"{edit['path']} (persisted file edit: not applied)" for edit in record.get("files", [])
    ]


def approved_by(records: list[Any], approver: Callable[..., Any] | None) -> str:
    """Who approved the code of a recovery: the approver named by its code-running tool calls."""
    if approver is None:
        return "not required (no approve= configured)"
    names = {r.approved_by for r in records if r.ok and r.tool == "exec_python"}
    return ", ".join(sorted(names)) or "unknown"
