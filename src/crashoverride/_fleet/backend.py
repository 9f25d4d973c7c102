"""Fleet coordination through Redis: single-flight with a lease, breaker, budget, fix records.

Only the in-process leader of a fingerprint talks to Redis (``InProcess.join`` first), so a
burst of identical failures costs one Redis conversation per process. That leader:

1. reads, in one round trip, the fingerprint's stored fix record and the fleet breaker;
2. with a stored fix (``apply_fixes`` not ``"never"``) it applies it and replays: no agent;
3. else it takes the lease (``SET NX PX`` with a fencing token from ``INCR``, in one script):
   the lease holder counts against the fleet budget, if any, runs the agent and renews the
   lease while it runs (one that runs no agent after all hands it on); the others subscribe
   to the outcome channel, THEN read the stored outcome (a notification sent in between is
   not missed), and wait. When the lease lapses with no outcome (its holder died), a waiter
   takes it over. Every wait is inside the recovery's one deadline;
4. the holder's outcome is stored and published (only if its token is still the newest: a
   leader that lost its lease cannot overwrite a newer one's outcome), with the signed fix
   record when the recovery changed code or made a recipe (``_repair.recipes``); the fleet breaker
   learns the result of the agent run.

Any Redis error or an answer slower than ``op_timeout`` ends the fleet part: the recovery goes
on in-process (``coordination.degraded``), and Redis is left alone for ``retry_after`` seconds.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from crashoverride._admission.coordination import LEAD, InProcess, Joined
from crashoverride._config.coordination import RedisCoordination
from crashoverride._fleet import records, revocation
from crashoverride._fleet.eager import Eager
from crashoverride._fleet.link import Link, Unavailable
from crashoverride._fleet.scripts import (
    ACQUIRE,
    BUDGET,
    FAILED,
    LAND,
    OUTCOME_MS,
    RENEW,
    announce,
    keys_for,
    ms,
    release,
    token_of,
)
from crashoverride._fleet.waiter import wait_outcome
from crashoverride._observe import events
from crashoverride._repair import journal, recipes, watch
from crashoverride._security.redact import fixed

if TYPE_CHECKING:
    from crashoverride._admission.limits import Admission
    from crashoverride._config.settings import Settings
    from crashoverride._core.recovery import Decision, Recovery
    from crashoverride._placement.bridge import Dispatch


NOT_VERIFIED = fixed(
    "not verified: the unit never ran through the changed code (no rerun(), replay_request() "
    "or single-flight replay) and no postcondition held; the fix runs in this process only"
)


def _has_fix(rec: Recovery) -> bool:
    return journal.has_changes(rec.id) or recipes.pending(rec.id)


class _Lease:
    __slots__ = ("keys", "renewal", "token", "value")

    def __init__(self, keys: dict[str, str], token: int, value: str, renewal: Any) -> None:
        self.keys, self.token, self.value, self.renewal = keys, token, value, renewal


class Fleet:
    """The Redis backend of ``Coordination`` for one ``CrashOverride``."""

    def __init__(self, option: RedisCoordination, local: InProcess, settings: Settings) -> None:
        self.option = option
        self.local = local
        self.link = Link(option)
        self.eager = Eager(self.link, settings)
        self._lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}
        self._down_until = 0.0

    def start(self) -> None:
        self.eager.start()

    @property
    def holder(self) -> str:
        """Who holds a lease, as its value says: this process (pid) and this ``CrashOverride``."""
        return f"{os.getpid()}-{id(self):x}"

    # -- the protocol ------------------------------------------------------------------------

    def admit(self, rec: Recovery) -> Admission:
        return self.local.admit(rec)

    async def join(self, rec: Recovery, call: Dispatch) -> Joined:
        self.start()  # eager: listen from this process's first failure on
        joined = await self.local.join(rec, call)
        if not joined.leading:
            rec.tag(fleet_role="waiter")
            return joined  # this process's leader speaks for it (and applied any fix)
        if time.monotonic() < self._down_until:
            rec.tag(fleet_role="degraded")
            return LEAD
        try:
            return await self._join(rec, call)
        except Unavailable as problem:
            self._degrade(rec, str(problem))
            return LEAD

    def report_fields(self, rec: Recovery) -> dict[str, Any]:
        publishes = self.option.key is not None and rec.id in self._leases
        if publishes and rec.state.verified_by is None and _has_fix(rec):
            # The agent's word that it worked (set_result, respond, caller[...]) is evidence
            # enough for this occurrence, not for code every other process would then run.
            events.emit("warning", events.FIX_WITHHELD, reason=NOT_VERIFIED, **rec.fields())
            journal.take(rec.id)
            journal.take_files(rec.id)
            return {}
        withheld = journal.withhold_secrets(rec.id, rec.redact) if publishes else []
        if withheld:
            events.emit("warning", events.FIX_WITHHELD, targets=[rec.redact(t) for t in withheld],
                      reason=fixed("its new source holds a secret: it runs in this process only"),
                      **rec.fields())  # fmt: skip
        if publishes and _has_fix(rec):
            return {"fix_record": journal.record_id(rec.id)}
        return {}

    async def land(self, rec: Recovery, decision: Decision) -> None:
        try:
            await self._land(rec, decision)
        except Exception as problem:  # the outcome stands: a bug here must not replace it
            self._degrade(rec, f"publishing the outcome failed: {problem!r}")

    async def _land(self, rec: Recovery, decision: Decision) -> None:
        with self._lock:
            lease = self._leases.pop(rec.id, None)
        changes = journal.take(rec.id)
        report = decision.report
        if lease is None or report is None:
            return
        lease.renewal.cancel()
        succeeded = report.outcome in ("recovered", "repaired")
        stored = ""
        # Its report names a record when it changed code or made a recipe (``report_fields``).
        recipe = self.local.limits.recipes.get(rec.fingerprint) if report.fix_record else None
        if succeeded and report.fix_record and self.option.key is not None:
            record = records.make(
                namespace=self.option.namespace, fingerprint=rec.fingerprint, targets=changes,
                recovery_id=rec.id,
                approved_by=records.approved_by(list(report.tool_calls), rec.settings.approve),
                recipe=recipe.snippets if recipe is not None else (), turns=report.turns,
            )  # fmt: skip
            stored = records.sign(record, self.option.key)
        heard = {"token": lease.token, "recovered": succeeded, "fix": report.fix_record or None}
        outcome = json.dumps(heard)
        # The waiters hear the record with the outcome: applied at once, not read first.
        message = json.dumps(heard | {"record": stored}) if stored else outcome
        keys, option, settings = lease.keys, self.option, rec.settings
        ran = rec.running
        if not ran and not succeeded:
            # No agent ran here (no free slot, say): that says nothing about the failure, so
            # another process takes over rather than hearing "not recovered".
            await self.link.run(lambda client: release(client, keys, lease.value))
            return

        async def publish(client: Any) -> int:
            # The fleet breaker learns the result of every agent run: a failure before the
            # waiters hear it (the next failure finds the breaker as it now is), a success
            # after (the waiters do not wait for a round trip that is not theirs).
            if ran and not succeeded:
                await client.eval(FAILED, 2, keys["fails"], keys["open"],
                                  ms(settings.breaker_window), settings.breaker_threshold,
                                  ms(settings.breaker_cooldown))  # fmt: skip
            landed: int = await client.eval(
                LAND, 4, keys["lease"], keys["fence"], keys["outcome"], keys["fix"],
                lease.value, lease.token, outcome, keys["channel"], stored, OUTCOME_MS,
                ms(option.record_ttl), message,
            )  # fmt: skip
            if ran and succeeded:
                await client.delete(keys["fails"], keys["open"])
            if landed and stored:
                await announce(client, option, keys["fix"])  # for eager and late processes
            return landed

        try:
            landed = await self.link.run(publish, bound=4 * option.op_timeout)
        except Unavailable as problem:
            self._degrade(rec, str(problem))
            return
        if not landed:
            reason = fixed("a newer leader took over: this outcome was not published")
            events.emit("warning", events.LEASE_LOST, reason=reason, **rec.fields())
        elif stored:
            targets = [rec.redact(f"{c['module']}.{c['qualname']}") for c in changes]
            events.emit("info", events.FIX_PUBLISHED, targets=targets, **rec.fields())
            # Its patches here are watched: reverted, they revoke it; revoked elsewhere, they
            # are reverted here (so this process listens for revocations from now on).
            watch.attach(rec.id, revocation.revoker(self.link, stored, record))
            self.eager.listen()

    def abandon(self, rec: Recovery) -> None:
        with self._lock:
            lease = self._leases.pop(rec.id, None)
        journal.take(rec.id)
        if lease is None:
            return
        lease.renewal.cancel()
        keys, value = lease.keys, lease.value
        # Hand the lease on now rather than make the waiters sit out its expiry.
        self.link.fire(lambda client: release(client, keys, value))

    # -- steps -------------------------------------------------------------------------------

    def keys(self, fingerprint: str) -> dict[str, str]:
        return keys_for(self.option.namespace, fingerprint)

    async def _join(self, rec: Recovery, call: Dispatch) -> Joined:
        keys, option = self.keys(rec.fingerprint), self.option

        async def first(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.get(keys["fix"])
            pipe.pttl(keys["open"])
            found: list[Any] = await pipe.execute()
            return found

        stored, open_ms = await self.link.run(first)
        if open_ms is not None and open_ms > 0:
            return Joined(False, skip=f"fleet circuit breaker open for this failure "
                                      f"({open_ms / 1000:.0f}s of cool-down left)")  # fmt: skip
        if stored is not None:
            rec.tag(fleet_role="replayed-fix")  # unless it leads or waits after all (below)
            if await self._apply(rec, stored, call):
                return Joined(False, True)
        takeover = False
        while True:
            acquired, held = await self.link.run(
                lambda client: client.eval(
                    ACQUIRE, 2, keys["lease"], keys["fence"], self.holder, ms(option.lease)
                )
            )
            if acquired:
                if journal.ran_superseded(rec.exc):
                    # While this recovery asked Redis, the code that raised was fixed here
                    # (another app of this process, an eager record): it replays, as a waiter
                    # does, and hands the lease straight on.
                    value = f"{int(held)}|{self.holder}"
                    self.link.fire(functools.partial(release, keys=keys, value=value))
                    return Joined(False, True)
                return await self._lead(rec, keys, int(held), takeover)
            token = token_of(held)
            if token is None:  # no lease of ours: recover here, as when Redis is unreachable
                rec.tag(fleet_role="degraded")
                events.emit("warning", events.COORDINATION_DEGRADED,
                          reason=fixed("the lease holds a value no process of ours wrote"),
                          **rec.fields())  # fmt: skip
                return LEAD
            rec.tag(fleet_role="waiter", fencing_token=token)
            began = time.monotonic()
            outcome = await self.link.run(
                functools.partial(
                    wait_outcome, keys=keys, token=token, bound=self.option.op_timeout
                ),
                bound=None,
            )
            rec.waited += time.monotonic() - began
            if outcome is None:
                takeover = True  # the lease lapsed without an outcome: its holder died
                continue
            fix = outcome.get("fix")
            if outcome["recovered"] and fix:
                stored = outcome.get("record")  # heard with the outcome, verified all the same
                if isinstance(stored, str):
                    stored = stored.encode()
                else:  # read from the stored outcome: the record is the fix key's
                    stored = await self.link.run(lambda client: client.get(keys["fix"]))
                if stored is not None:
                    await self._apply(rec, stored, call)
            return Joined(False, bool(outcome["recovered"]))

    async def _lead(
        self, rec: Recovery, keys: dict[str, str], token: int, takeover: bool
    ) -> Joined:
        option = self.option
        value = f"{token}|{self.holder}"
        over = await self._over_budget(keys, token, value, rec.id)
        if over is not None:
            return Joined(False, skip=over)

        rec.tag(fleet_role="leader", fencing_token=token)
        fields = rec.fields()

        async def renew(client: Any) -> None:
            import asyncio

            while True:  # until the recovery lands (cancelled) or the lease is gone
                await asyncio.sleep(option.lease / 3)
                try:
                    async with asyncio.timeout(option.lease / 3):
                        held = await client.eval(RENEW, 1, keys["lease"], value, ms(option.lease))
                except Exception:  # a slow or failing Redis: try again at the next beat
                    continue
                if not held:  # it lapsed: another process may be running the agent as well
                    reason = fixed("the lease lapsed before it could be renewed")
                    events.emit("warning", events.LEASE_LOST, reason=reason, **fields)
                    return

        renewal = self.link.submit(renew, None)
        with self._lock:
            self._leases[rec.id] = _Lease(keys, token, value, renewal)
        events.emit("info", events.LEASE_TAKEN, takeover=takeover, **fields)
        return LEAD

    async def _over_budget(
        self, keys: dict[str, str], token: int, value: str, rec_id: str
    ) -> str | None:
        """Count this agent run against the fleet's budget; why it may not run, if over."""
        budget = self.option.max_agent_runs_per_minute
        if budget is None:
            return None
        bucket = f"co:{self.option.namespace}:budget"
        member = f"{value}|{rec_id}"
        if await self.link.run(lambda client: client.eval(BUDGET, 1, bucket, budget, member)):
            return None
        # Hand the lease on at once, with a "not recovered" outcome for this episode's waiters.
        outcome = json.dumps({"token": token, "recovered": False, "fix": None})
        await self.link.run(
            lambda client: client.eval(
                LAND, 4, keys["lease"], keys["fence"], keys["outcome"], keys["fix"], value,
                token, outcome, keys["channel"], "", OUTCOME_MS, 1,
            )
        )  # fmt: skip
        return (
            f"fleet budget reached: at most {budget} agent runs per minute across the fleet "
            "(max_agent_runs_per_minute); no agent ran for this failure"
        )

    async def _apply(self, rec: Recovery, stored: bytes, call: Dispatch) -> bool:
        """Apply a stored fix record here; whether code changed now."""
        key = self.option.key
        if key is None or self.option.apply_fixes == "never":
            return False
        try:
            record, changed = await records.receive(
                stored, key, rec.code_owner(call), namespace=self.option.namespace,
                fingerprint=rec.fingerprint, ttl=self.option.record_ttl,
            )  # fmt: skip
        except records.Revoked as revoked:  # revert what it changed here, recover afresh
            revocation.heard(revoked.revocation)
            events.emit("warning", events.FIX_REFUSED, reason=rec.redact(str(revoked)),
                      **rec.fields())  # fmt: skip
            return False
        except records.Refused as refusal:
            events.emit("warning", events.FIX_REFUSED, reason=rec.redact(str(refusal)),
                      **rec.fields())  # fmt: skip
            return False
        if record.get("recipe"):  # verified and for this code: the state repair, for later
            recipe = recipes.Recipe(tuple(record["recipe"]), int(record.get("turns", 0)))
            self.local.limits.recipes.save(rec.fingerprint, recipe)
        if not changed:
            return False  # this process runs the fix already: it did not help here
        watch.attach(rec.id, revocation.revoker(self.link, stored, record), tuple(changed))
        self.eager.listen()
        rec.tag(fix_record=str(record.get("id", "")), model_calls_saved=record.get("turns", 0))
        events.emit("info", events.FIX_APPLIED, targets=[rec.redact(t) for t in changed],
                  not_applied=[rec.redact(n) for n in records.not_applied(record)],
                  **rec.fields())  # fmt: skip
        return True

    def _degrade(self, rec: Recovery, reason: str) -> None:
        self._down_until = time.monotonic() + self.option.retry_after
        rec.tag(fleet_role="degraded")
        events.emit("warning", events.COORDINATION_DEGRADED, reason=rec.redact(reason),
                  retry_after=self.option.retry_after, **rec.fields())  # fmt: skip
