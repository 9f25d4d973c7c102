"""Fix records: a recovery's code changes (``_repair.journal``), signed, for other processes.

When a recovery succeeds, the fleet backend turns its journal into one record: the fingerprint,
each target (module, qualname, digest of the code it replaced, new source), the recovery id, the
time and who approved the code, signed with HMAC-SHA256 under the fleet key. A
``persist_file_edit`` travels as information only (its path from the import root, its redacted
diff), shown to ``approve=`` and never applied: the processes of one host share the file the
leader wrote already, and other hosts' copies are the deployment's, which brings the edit with
its next release.

A process applies a record only if its signature verifies AND each target's current code has
the recorded digest (the same deployment); anything else is refused. Digests (``journal.digest``)
are computed from the code object itself (bytecode, constants, names), not from files or line
numbers, so they agree between processes of one deployment and differ when the code differs.
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
from typing import TYPE_CHECKING, Any, Final

from crashoverride._repair.journal import digest, record_id, take_files

if TYPE_CHECKING:
    from crashoverride._security.audit import Approver

if TYPE_CHECKING:
    from crashoverride._security.gate import Owner

_HOW: Final = {
    "rebind": "# rebind_everywhere({}) to:",
    "persist": "# persist_function({}) in the recovering process; applied here live, as "
    "replace_function:",
}


class Refused(Exception):
    """A record that must not be applied here; the message says why."""


class Revoked(Refused):
    """What was stored is a verified revocation (``_fleet.revocation``), not a record."""

    def __init__(self, revocation: dict[str, Any]) -> None:
        super().__init__(f"fix record {revocation['revokes']} was revoked")
        self.revocation = revocation


_revoked: OrderedDict[str, None] = OrderedDict()  # record ids this process saw revoked
_revoked_lock = threading.Lock()
_MAX_REVOKED: Final = 1_000


def remember_revoked(record_id: str) -> None:
    """Never apply record ``record_id`` here again (it was revoked: by us, or heard of)."""
    with _revoked_lock:
        _revoked[record_id] = None
        while len(_revoked) > _MAX_REVOKED:
            _revoked.popitem(last=False)


def was_revoked(record_id: object) -> bool:
    with _revoked_lock:
        return isinstance(record_id, str) and record_id in _revoked


def make(
    *,
    namespace: str,
    fingerprint: str,
    targets: list[dict[str, str]],
    recovery_id: str,
    approved_by: str,
    recipe: tuple[str, ...] = (),
    turns: int = 0,
) -> dict[str, Any]:
    """A record; ``recipe``: the recovery's state-repair snippets (``_repair.recipes``), left out
    when they hold a secret; ``turns``: the model calls it took. The file edits the recovery
    persisted (``note_file``) come with it."""
    from crashoverride._repair.recipes import told, withheld

    reason = withheld(tuple(recipe)) if recipe else ""
    if reason:
        told(recovery_id, fingerprint, reason)
        recipe = ()
    files = take_files(recovery_id)
    return {"id": record_id(recovery_id), "namespace": namespace, "fingerprint": fingerprint,
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
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        # Whatever sits under the key (anyone who can write to Redis can put anything there):
        # refused, never an internal error that would leave the failure unrecovered.
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
    from crashoverride._repair.patching import as_function, rebind_everywhere, replace_function

    changed = []
    for function, target in todo:
        if target.get("kind") == "rebind":
            rebind_everywhere(function, as_function(str(target["source"]), function.__globals__))
        else:
            replace_function(function, str(target["source"]))
        changed.append(f"{target['module']}.{target['qualname']}")
    return changed


def bound(record: dict[str, Any], *, namespace: str, fingerprint: str | None, ttl: float) -> None:
    """Refuse ``record`` unless it was signed for this use: this fleet's namespace, this failure
    (``fingerprint``; None: applied eagerly, for no failure in particular) and within its time
    to live. A signed record copied under another key or namespace, or kept past its time,
    means nothing here."""
    if record.get("namespace") != namespace:
        raise Refused("made for another namespace (or by a version that did not bind it)")
    if fingerprint is not None and record.get("fingerprint") != fingerprint:
        raise Refused("made for another failure: a record is valid only for its own")
    at = record.get("at")
    if not isinstance(at, int | float) or not 0 <= time.time() - at <= ttl:
        raise Refused("expired, or from no time it could have been made")


async def receive(
    stored: str | bytes,
    key: bytes,
    owner: Owner,
    *,
    namespace: str,
    fingerprint: str | None,
    ttl: float,
) -> tuple[dict[str, Any], list[str]]:
    """Verify, check, approve and apply a stored record: (the record, the names changed).

    Nothing changed when this process runs the fix already. Applying it is agent code, so it
    passes the gate (``run_agent_code``) as one ``apply_fix`` call: ``owner``'s mode, its
    approver (which sees the code first), its audit trail. ``Refused`` when any rule says no.
    """
    from crashoverride._security.audit import ApprovalRequest
    from crashoverride._security.gate import run_agent_code
    from crashoverride._security.text import format_tool_error

    record = verify(stored, key)
    bound(record, namespace=namespace, fingerprint=fingerprint, ttl=ttl)
    if isinstance(record.get("revokes"), str):
        raise Revoked(record)
    if was_revoked(record.get("id")):
        # Even if Redis says otherwise (not written yet, or restored by someone without the
        # key): a revocation this process saw stands.
        raise Refused(f"fix record {record.get('id')} was revoked; it is never applied again here")
    todo = check(record)
    if not record["targets"] and not record.get("recipe") and record.get("files"):
        raise Refused(
            f"nothing to apply here: the record carries only persisted file edits "
            f"({', '.join(not_applied(record))}), which other processes never apply (the "
            "processes of one host share the file; other hosts get it with their next deployment)"
        )
    if not todo and not record.get("recipe"):
        return record, []
    names = [f"{t['module']}.{t['qualname']}" for t in record["targets"]]
    request = ApprovalRequest(approval_text(record), tool="apply_fix", source="fleet",
                              arguments={"record": record.get("id"), "targets": names},
                              is_code=True)  # fmt: skip
    changed: list[str] = []

    async def execute() -> tuple[str, bool]:
        try:
            changed.extend(apply(todo))
        except Exception as exc:
            return format_tool_error(exc), False
        return f"changed: {', '.join(changed) or 'nothing (the recipe is kept for later)'}", True

    ran = await run_agent_code(owner, request, execute)
    if not ran.allowed:
        raise Refused(ran.approved_by[:200])
    if not ran.ok:
        raise Refused(f"applying it failed: {ran.output}"[:300])
    return record, changed


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


def not_applied(record: dict[str, Any]) -> list[str]:
    """What a record carries that this process does not apply: its persisted file edits."""
    return [
        f"{edit['path']} (persisted file edit: not applied)" for edit in record.get("files", [])
    ]


def approved_by(records: list[Any], approver: Approver | None) -> str:
    """Who approved the code of a recovery: the approver named by its code-running tool calls."""
    if approver is None:
        return "not required (no approve= configured)"
    names = {r.approved_by for r in records if r.ok and r.tool == "exec_python"}
    return ", ".join(sorted(names)) or "unknown"
