"""Revoked fix records: a fix that made things worse somewhere is taken back everywhere.

When the patch watch (``_repair.watch``) reverts a fix that came from, or went to, the fleet,
it calls the record's revocation (``revoker``): this process remembers the record as revoked at
once (its own next failure must not apply it again, whatever Redis says yet), then the record
is replaced in Redis by a *revocation*: a record of its own, naming the revoked one and the
functions to put back, signed with the fleet key like any record and announced on the same
index and channel. Every process that listens (``_fleet.eager``: eager ones always, the others
from the moment they publish or apply a record) verifies it, remembers it, and reverts the
functions it changed for that record; a process that fails later finds the revocation under
the failure's key instead of the fix, and recovers afresh.

Tamper-proof as records are: a revocation verifies under the fleet key or is refused, so
someone who can write to Redis but has no key can neither revoke a record nor make one up.
Deleting the revocation (or restoring the record's bytes over it) does not bring the fix back
to a process that heard of it: it remembers the ids it saw revoked (``records.was_revoked``).
A process that never heard of it is in the position any process is with a copied record
(whoever can write to Redis can store again a record it read there): the record is bound
to its failure, namespace and ``record_ttl``, and the revocation lasts as long.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from crashoverride._fleet import records
from crashoverride._fleet.scripts import REVOKE, announce, keys_for, ms
from crashoverride._repair import watch

if TYPE_CHECKING:
    from crashoverride._fleet.link import Link


def is_revocation(record: dict[str, Any]) -> bool:
    return isinstance(record.get("revokes"), str)


def make(record: dict[str, Any], reason: str) -> dict[str, Any]:
    """The revocation of ``record``: no targets (a version that does not know revocations
    applies nothing), the functions to put back under ``reverts``."""
    reverts = [{key: str(target.get(key, "")) for key in ("module", "qualname", "code_hash",
                                                           "new_hash")}
               for target in record.get("targets", [])]  # fmt: skip
    return {"id": "revoke_" + str(record.get("id", "")), "revokes": str(record.get("id", "")),
            "namespace": record.get("namespace"), "fingerprint": record.get("fingerprint"),
            "at": time.time(), "reason": reason[:300], "targets": [], "reverts": reverts,
            "recipe": [], "files": []}  # fmt: skip


def revoker(link: Link, stored: str | bytes, record: dict[str, Any]) -> watch.Record:
    """What the watch calls to revoke ``record`` (stored as ``stored``) fleet-wide."""
    option = link.option
    record_id = str(record.get("id", ""))

    def revoke(reason: str) -> None:
        records.remember_revoked(record_id)  # first: this process never applies it again
        key = option.key
        if key is None:
            return
        signed = records.sign(make(record, reason), key)
        fix = keys_for(option.namespace, str(record.get("fingerprint", "")))["fix"]

        async def write(client: Any) -> None:
            if await client.eval(REVOKE, 1, fix, stored, signed, ms(option.record_ttl)):
                await announce(client, option, fix)

        link.fire(write)  # from the failure path: never waits for Redis

    return record_id, revoke


def heard(record: dict[str, Any]) -> list[str]:
    """A verified revocation arrived: remember it, put back what its record changed here."""
    revoked = str(record["revokes"])
    records.remember_revoked(revoked)
    reason = f"fix record {revoked} was revoked by the fleet: {record.get('reason', '')}"
    return watch.revoked(revoked, reason[:400])
