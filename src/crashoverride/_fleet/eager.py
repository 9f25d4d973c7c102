"""``apply_fixes="eager"``: apply fix records as they are published, and catch up at start.

Every published record is also announced: its key goes into a namespace-wide index (a sorted
set by time, trimmed to ``record_ttl``) and onto a namespace-wide channel. An eager process
subscribes to that channel, THEN reads the index (nothing published in between is missed), and
applies each record by the same rules as on failure: signature, code digests, the mode and
``approve=``, through the gate; with no report to hold its audit line, each application is a
``fleet.tool_called`` event.

Which approver: no failure has happened, so no handler owns the fix; the application's mode and
``approve=`` are the only ones that can be asked. A handler that declares a stricter rule of its
own (its own ``approve=``, a read-only ``mode=``) would be bypassed: the fix would replace the
code its block runs before the failure it would have judged. Such a handler is refused when it
is declared (``check_handler``), so every rule in force is one eager application asks.

It runs on the fleet's helper loop, from the first failure or ``warm_up()`` of a process on; a
forked child starts its own. Redis going away only pauses it: the link tries again every
``retry_after`` (``Link.background``), and the outage is reported once, not at every try.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from crashoverride._fleet import records, revocation
from crashoverride._fleet.link import Link
from crashoverride._fleet.scripts import MAX_INDEXED, index_key
from crashoverride._observe import events
from crashoverride._placement.bridge import run_job
from crashoverride._repair import watch
from crashoverride._security.audit import ToolCallRecord
from crashoverride._security.redact import clip, fixed, scanned

if TYPE_CHECKING:
    from crashoverride._config.settings import Settings
    from crashoverride._security.gate import Owner


def check_handler(app: Settings, handler: Settings) -> None:
    """Refuse a handler whose own rules eager application would bypass (see the docstring).

    Raises:
        ConfigurationError: names ``approve`` or ``mode``.
    """
    from crashoverride._errors import ConfigurationError
    from crashoverride._security.gate import changes_allowed

    coordination = app.coordination
    if coordination is None or coordination.apply_fixes != "eager" or not changes_allowed(app.mode):
        return  # nothing is applied eagerly here
    why = (
        'with apply_fixes="eager" fleet fixes are applied before any handler fails, so '
        "only the application's {} can decide them; set it on the CrashOverride, or use "
        'apply_fixes="on-failure"'
    )
    if handler.approve is not app.approve and handler.approve != app.approve:  # a bound method
        raise ConfigurationError("approve", why.format("approve="))
    if not changes_allowed(handler.mode):
        raise ConfigurationError("mode", why.format("mode="))


EAGER = fixed("eager")  # the fleet role of the eager subscriber's events


class Eager:
    """The eager subscriber of one ``CrashOverride`` (one per process)."""

    def __init__(self, link: Link, settings: Settings) -> None:
        self.link = link
        self.option = link.option
        self.settings = settings  # the application's: its mode, approver and redaction
        self._owner: Owner | None = None
        self._pid = 0
        # Records already judged here, applied or refused: a record announced while the
        # index is read arrives twice (index and channel), and one announced again must not
        # be asked about again. Bounded like the index itself.
        self._taken: OrderedDict[bytes, None] = OrderedDict()
        self._outage = False  # reported, and not listening again since

    def start(self) -> None:
        """Start listening in this process, once (cheap to call on every failure)."""
        if self.option.apply_fixes == "eager":
            self.listen()

    def listen(self) -> None:
        """Listen in this process, once: for revocations in every mode (a process that runs a
        fleet fix, published or applied, must hear it revoked), for records when eager."""
        if self._pid == os.getpid():
            return
        self._pid, self._outage = os.getpid(), False
        self.link.background(self._listen)

    async def _listen(self, client: Any) -> None:
        """One subscription, until Redis goes away; the link then calls it again (after
        ``retry_after``, with its client of the moment), unless it was closed meanwhile."""
        index = index_key(self.option.namespace)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(index)
            for name in await client.zrange(index, 0, -1):
                await self._once(client, name)
            self._outage = False  # listening again: the next outage is news
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=30)
                if message is not None:
                    await self._once(client, message["data"])
        except Exception as problem:  # Redis went away: reported once per outage
            if not self._outage:
                self._outage = True
                events.emit("warning", events.COORDINATION_DEGRADED, fleet_role=EAGER,
                          reason=clip(scanned(f"{type(problem).__name__}: {problem}"), 300),
                          retry_after=self.option.retry_after)  # fmt: skip
            raise
        finally:
            try:
                async with asyncio.timeout(self.option.op_timeout):
                    await pubsub.aclose()
            except Exception:  # a dead connection: nothing left to close cleanly
                pass

    async def _once(self, client: Any, name: bytes) -> None:
        stored = await client.get(name)
        if stored is None:
            return
        # By content, not key: a later record for the same failure is stored under the same
        # key, and it is a new record to judge.
        seen = hashlib.sha256(stored).digest()
        if seen in self._taken:
            return
        self._taken[seen] = None
        while len(self._taken) > MAX_INDEXED:
            self._taken.popitem(last=False)
        await self._take(stored)

    async def _take(self, stored: bytes | None) -> None:
        key = self.option.key
        if stored is None or key is None:
            return
        if self.option.apply_fixes != "eager":  # listening for revocations only
            try:
                found = records.verify(stored, key)
                records.bound(found, namespace=self.option.namespace, fingerprint=None,
                              ttl=self.option.record_ttl)  # fmt: skip
            except records.Refused:
                return  # forged or stale: nothing to act on (eager processes report it)
            if revocation.is_revocation(found):
                revocation.heard(found)
            return
        try:
            record, changed = await records.receive(
                stored, key, self.owner(), namespace=self.option.namespace, fingerprint=None,
                ttl=self.option.record_ttl,
            )  # fmt: skip
        except records.Revoked as revoked:
            revocation.heard(revoked.revocation)
            return
        except records.Refused as refusal:
            events.emit("warning", events.FIX_REFUSED, reason=scanned(str(refusal)),
                      fleet_role=EAGER)  # fmt: skip
            return
        if changed:
            # Watched like a fix made here; the application's window (no handler owns it).
            watch.arm(None, self.settings.patch_watch,
                      revocation.revoker(self.link, stored, record))  # fmt: skip
            # No recovery here, so no recovery's redactor: the rules every redactor applies.
            events.emit("info", events.FIX_APPLIED, targets=[scanned(t) for t in changed],
                      fleet_role=EAGER,
                      not_applied=[scanned(n) for n in records.not_applied(record)],
                      fix_record=scanned(str(record.get("id", ""))))  # fmt: skip

    def owner(self) -> Owner:
        """Who answers for the fixes applied here: the application (built when first needed)."""
        if self._owner is None:
            from crashoverride._security.gate import Owner
            from crashoverride._security.redact import Redactor

            settings = self.settings
            self._owner = Owner(
                mode=settings.mode,
                approve=settings.approve,
                dispatch=run_job,
                redact=Redactor.for_settings(settings),
                audit=_audited,
            )
        return self._owner


def _audited(record: ToolCallRecord) -> None:
    events.emit("info", events.FLEET_TOOL_CALLED, **record.event_fields(), fleet_role=EAGER)
