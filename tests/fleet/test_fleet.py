"""Fleet coordination through a real Redis, within one process.

Each ``CrashOverride`` with its own ``RedisCoordination`` coordinates like a separate process
would (its own lease holder id, its own client); a "process started later" is an app created
after the fix, with the function's original code put back. Tests across real processes are in
tests/integrations/test_fleet_processes.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis
from structlog.testing import capture_logs

from crashoverride import ApprovalRequest, ConfigurationError, CrashOverride, RedisCoordination
from crashoverride._admission.coordination import InProcess
from crashoverride.testing import done, exec_python, give_up, script
from tests.e2e.test_import import _run as run_python
from tests.fleet.support import (
    FLEET_KEY,
    assert_skipped_for_budget,
    clean,
    close_fleet,
    fleet_redis,
    free_port,
    leader_then_others,
    new_namespace,
    private_redis,
)
from tests.helpers import await_for

PATCH = (
    "import anyio\n"
    "await anyio.sleep(0.3)\n"  # long enough for the other app's failures to find the lease
    "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\n"
    "rerun()"
)


def transform(value: int) -> int:
    raise NotImplementedError("transform")


ORIGINAL = transform.__code__
RELEASE = threading.Event()  # agent code of a test waits for it
HELD_PATCH = (  # PATCH once the test says so (RELEASE): the other app's failures wait by then
    "import anyio\n"
    "await anyio.to_thread.run_sync(RELEASE.wait, abandon_on_cancel=True)\n"
    "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\n"
    "rerun()"
)


# In a dict: rebind_everywhere() rebinds module globals, and this must stay the original.
DEPLOYED = {"transform": transform}


def as_deployed() -> None:
    """The code as a process that was never fixed has it (rebound names included)."""
    globals()["transform"] = DEPLOYED["transform"]
    DEPLOYED["transform"].__code__ = ORIGINAL


@pytest.fixture(autouse=True)
def _fresh_code() -> Iterator[None]:
    as_deployed()  # every test starts as a process that was never fixed
    yield
    as_deployed()


NS = {"current": "unit"}  # the running test's namespace (set by the ``url`` fixture)


@pytest.fixture
def url() -> Iterator[str]:
    with fleet_redis() as found:
        NS["current"] = new_namespace()
        try:
            yield found
        finally:
            clean(found, NS["current"])


def fleet(url: str, **options: Any) -> RedisCoordination:
    options.setdefault("key", FLEET_KEY)
    # A loaded test machine is no slow Redis: degradation is tested with dead ones instead.
    options.setdefault("op_timeout", 2.0)
    return RedisCoordination(url, namespace=NS["current"], **options)


def ns_keys(pattern: str) -> str:
    """A key pattern in the running test's namespace."""
    return f"co:{NS['current']}:{pattern}"


def app(url: str, model: Any, **options: Any) -> CrashOverride:
    return CrashOverride(model=model, timeout=20, coordination=fleet(url, **options))


def fixed_elsewhere(url: str) -> CrashOverride:
    """An app that recovered once (and published its fix); the code is then put back as a
    process started later has it. Close the returned app at the end."""
    leader = app(url, script(exec_python(PATCH), done("patched")))

    @leader.handler()
    def job(i: int) -> int:
        return transform(i)

    assert job(1) == 10
    as_deployed()
    return leader


def async_jobs(*apps: CrashOverride) -> list[Any]:
    """For each app, an async call of ``transform`` it protects."""
    jobs = []
    for co in apps:

        @co.handler()
        async def job(i: int) -> int:
            return transform(i)

        jobs.append(job)
    return jobs


async def gather(calls: list[tuple[Any, int]]) -> dict[int, int]:
    """Protected calls run concurrently: their results by argument."""
    results: dict[int, int] = {}

    async def one(job: Any, i: int) -> None:
        results[i] = await job(i)

    async with anyio.create_task_group() as tg:
        for job, i in calls:
            tg.start_soon(one, job, i)
    return results


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


# ------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"url": "http://localhost:6379"}, "url"),
        ({"url": "redis://"}, "url"),
        ({"url": 6379}, "url"),
        ({"url": None}, "url"),
        ({"namespace": ""}, "namespace"),
        ({"namespace": "my{app}"}, "namespace"),
        ({"key": 1234}, "key"),
        ({"key": "short"}, "key"),
        ({"key": None}, "key"),
        ({"apply_fixes": "sometimes"}, "apply_fixes"),
        ({"lease": 0}, "lease"),
        ({"max_agent_runs_per_minute": 0}, "max_agent_runs_per_minute"),
        ({"cluster": "yes"}, "cluster"),
        ({"url": "unix:///run/redis.sock", "cluster": True}, "cluster"),
        ({"url": "redis://localhost:6379/3", "cluster": True}, "cluster"),
    ],
)
def test_bad_options_fail_at_construction_and_name_the_argument(
    arguments: dict[str, Any], named: str
) -> None:
    given: dict[str, Any] = {"url": "redis://localhost:6379/0", "key": FLEET_KEY, **arguments}
    with pytest.raises(ConfigurationError) as caught:
        RedisCoordination(given.pop("url"), **given)
    assert caught.value.argument == named


def test_propagation_off_needs_no_key_and_a_url_with_a_password_is_never_echoed() -> None:
    option = RedisCoordination("redis://:pw@localhost:6379/0", apply_fixes="never")
    assert option.key is None and "pw" not in repr(option)
    with pytest.raises(ConfigurationError) as caught:
        RedisCoordination("http://:secret@localhost", key=FLEET_KEY)
    assert "secret" not in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        CrashOverride(coordination="redis://localhost:6379/0")  # type: ignore[arg-type]
    assert caught.value.argument == "coordination"


@pytest.mark.parametrize(
    "url", ["redis://localhost:6379/0", "rediss://:pw@redis.example:6380/2", "unix:///run/r.sock"]
)
def test_tls_and_unix_socket_urls_are_accepted(url: str) -> None:
    assert RedisCoordination(url, key=FLEET_KEY).url == url


def test_a_client_factory_replaces_the_url() -> None:
    option = RedisCoordination(client_factory=lambda: None, key=FLEET_KEY)
    assert option.url is None and "client_factory" in repr(option)
    with pytest.raises(ConfigurationError):
        RedisCoordination("redis://localhost", client_factory=lambda: None, key=FLEET_KEY)
    with pytest.raises(ConfigurationError) as caught:  # it builds a client of its own
        RedisCoordination(client_factory=lambda: None, cluster=True, key=FLEET_KEY)
    assert caught.value.argument == "cluster"


@pytest.mark.parametrize("url", ["redis://node-0:7000", "rediss://:pw@node-1:7001/0"])
def test_a_cluster_is_any_nodes_url(url: str) -> None:
    option = RedisCoordination(url, cluster=True, key=FLEET_KEY)
    assert option.cluster and "cluster=True" in repr(option) and "pw" not in repr(option)


def test_default_is_in_process() -> None:
    co = CrashOverride()
    assert isinstance(co._limits().coordination, InProcess)


def test_the_happy_path_imports_no_redis_and_starts_nothing() -> None:
    port = free_port()  # nothing listens there: any connection attempt would be seen failing
    code = (
        "import sys, json, threading\n"
        "from crashoverride import CrashOverride, RedisCoordination\n"
        f"fleet = RedisCoordination('redis://127.0.0.1:{port}/0', key='k' * 16)\n"
        "co = CrashOverride(coordination=fleet)\n"
        "threads = threading.active_count()\n"
        "@co.handler()\n"
        "def f():\n"
        "    return 1\n"
        "for _ in range(100):\n"
        "    f()\n"
        "    with co.handler():\n"
        "        pass\n"
        "print(json.dumps({'redis': 'redis' in sys.modules,\n"
        "                  'threads': threading.active_count() - threads}))\n"
    )
    assert run_python(code) == {"redis": False, "threads": 0}


# ------------------------------------------------------------------------- fleet single-flight


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["in-process", "redis", "client_factory"])
async def test_both_backends_give_one_agent_run_for_a_burst(url: str, backend: str) -> None:
    import redis.asyncio

    model = script(exec_python(PATCH), done("patched"))
    coordination = {
        "in-process": None,
        "redis": fleet(url),
        "client_factory": RedisCoordination(
            client_factory=lambda: redis.asyncio.Redis.from_url(url), namespace=NS["current"],
            key=FLEET_KEY, op_timeout=2.0,
        ),
    }[backend]  # fmt: skip
    co = CrashOverride(model=model, timeout=20, coordination=coordination)
    (job,) = async_jobs(co)
    with capture_logs() as logs:
        results = await gather([(job, i) for i in range(20)])
    close_fleet(co)
    assert results == {i: i * 10 for i in range(20)} and len(model.calls) == 2
    roles = {e.get("fleet_role", "") for e in events(logs, "recovery.succeeded")}
    assert roles == ({""} if backend == "in-process" else {"leader", "waiter"})


@pytest.mark.anyio
async def test_two_processes_one_agent_run_and_every_unit_replays(url: str) -> None:
    first, second = script(exec_python(HELD_PATCH), done("patched")), script()
    leader, other = app(url, first), app(url, second)
    with capture_logs() as logs:
        results = await leader_then_others(*async_jobs(leader, other), 10, logs, release=RELEASE,
                                           waiting=lambda: _subscribers(url) == 1)  # fmt: skip
    close_fleet(leader, other)
    assert results == {i: i * 10 for i in range(10)}
    assert len(first.calls) == 2 and len(second.calls) == 0  # one agent run, two turns
    assert len(events(logs, "recovery.started")) == 1
    reports = events(logs, "recovery.succeeded")
    roles = sorted({e["fleet_role"] for e in reports})
    assert roles == ["leader", "waiter"]
    (taken,) = events(logs, "fleet.lease_taken")
    assert {e["fencing_token"] for e in reports if "fencing_token" in e} == {taken["fencing_token"]}
    (published,) = events(logs, "fleet.fix_published")
    assert published["targets"] == [f"{__name__}.transform"]


def test_a_unit_that_failed_before_another_apps_fix_replays_without_a_lease(url: str) -> None:
    """Two apps in one process (or an eager process): the unit raised in the old code, and the
    other app's recovery fixed it and published before this unit's recovery began. It replays
    through the code running here; it neither leads nor runs an agent."""
    first_model, second_model = script(exec_python(PATCH), done("patched")), script()
    leader, other = app(url, first_model), app(url, second_model)
    concurrent: list[int] = []

    @leader.handler()
    def first(i: int) -> int:
        return transform(i)

    @other.handler()
    def late(i: int) -> int:
        try:
            return transform(i)
        finally:
            if not concurrent:
                concurrent.append(first(1))

    with capture_logs() as logs:
        assert late(2) == 20
    close_fleet(leader, other)
    assert concurrent == [10] and len(first_model.calls) == 2 and len(second_model.calls) == 0
    assert len(events(logs, "fleet.lease_taken")) == 1  # the other app took no lease
    (replayed,) = [e for e in events(logs, "recovery.succeeded") if e["via"] == "replay"]
    assert replayed["reason"] == "replayed after a concurrent recovery"


class FixedWhileAsking:
    """A Redis client that, the first time it is asked for a lease, lets ``meanwhile`` run to
    its end first (in a thread): something that happens while a recovery talks to Redis."""

    def __init__(self, client: Any, meanwhile: list[Any]) -> None:
        self._client, self._meanwhile = client, meanwhile

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def eval(self, script: str, *args: Any) -> Any:
        import asyncio

        from crashoverride._fleet.scripts import ACQUIRE

        if script == ACQUIRE and self._meanwhile:
            await asyncio.get_running_loop().run_in_executor(None, self._meanwhile.pop())
        return await self._client.eval(script, *args)


def test_a_fix_made_here_while_a_leader_asks_redis_is_replayed_not_run_again(url: str) -> None:
    """The failure raised in the old code; while its recovery asked Redis for the lease,
    another app of this process recovered the same failure, fixed it and published. The
    lease is free again, but the failure replays through the code running here now."""
    import redis.asyncio

    first_model, second_model = script(exec_python(PATCH), done("patched")), script()
    leader = app(url, first_model)

    @leader.handler()
    def first(i: int) -> int:
        return transform(i)

    meanwhile = [lambda: first(1)]
    other = CrashOverride(model=second_model, timeout=60, coordination=RedisCoordination(
        client_factory=lambda: FixedWhileAsking(redis.asyncio.Redis.from_url(url), meanwhile),
        namespace=NS["current"], key=FLEET_KEY, op_timeout=30.0,
    ))  # fmt: skip

    @other.handler()
    def late(i: int) -> int:
        return transform(i)

    with capture_logs() as logs:
        assert late(2) == 20
    close_fleet(leader, other)
    assert meanwhile == [] and len(first_model.calls) == 2 and len(second_model.calls) == 0
    assert [e["fleet_role"] for e in events(logs, "fleet.lease_taken")] == ["leader"]
    (replayed,) = [e for e in events(logs, "recovery.succeeded") if e["via"] == "replay"]
    assert replayed["reason"] == "replayed after a concurrent recovery"


REBIND = (
    "def transform(value):\n    return value * 10\n"
    "rebind_everywhere(globals()['transform'], transform)\n"
    "rerun()"
)


@pytest.mark.parametrize("fix", [PATCH, REBIND], ids=["replace_function", "rebind_everywhere"])
def test_a_process_started_after_the_fix_handles_the_bug_with_no_model_call(
    url: str, fix: str
) -> None:
    leader = app(url, script(exec_python(fix), done("fixed")))
    seen: list[Any] = []

    @leader.handler()
    def job(i: int) -> int:
        return transform(i)

    assert job(2) == 20
    as_deployed()  # a new process: the code as deployed
    later_model = script()
    later = CrashOverride(model=later_model, coordination=fleet(url), on_recovery=seen.append)

    @later.handler()
    def later_job(i: int) -> int:
        return transform(i)

    with capture_logs() as logs:
        assert later_job(3) == 30
    close_fleet(leader, later)
    assert len(later_model.calls) == 0
    (report,) = seen
    assert (report.outcome, report.via, report.fleet_role) == ("recovered", "replay",
                                                               "replayed-fix")  # fmt: skip
    assert report.fix_record.startswith("fix_")
    (applied,) = events(logs, "fleet.fix_applied")
    assert applied["targets"] == [f"{__name__}.transform"]
    assert applied["model_calls_saved"] == 2  # the leader's two model turns
    if fix == REBIND:  # the names now lead to a new function; the deployed one is untouched
        assert transform is not DEPLOYED["transform"]
        assert DEPLOYED["transform"].__code__ is ORIGINAL


def _stored_fix(url: str) -> tuple[redis.Redis, str, dict[str, Any]]:
    client = redis.Redis.from_url(url)
    (name,) = client.keys(ns_keys("*:fix"))
    return client, name.decode(), json.loads(client.get(name) or b"")


def _refused_then_recovered_here(url: str, leader: CrashOverride) -> str:
    """A later process fails as the leader did: the stored record is refused and its own agent
    recovers (two model calls, nothing applied). The refusal's reason."""
    model = script(exec_python(PATCH), done("patched"))
    later = app(url, model)

    @later.handler()
    def later_job(i: int) -> int:
        return transform(i)

    with capture_logs() as logs:
        assert later_job(4) == 40  # by its own agent run, not by the record
    close_fleet(leader, later)
    (refused,) = events(logs, "fleet.fix_refused")
    assert events(logs, "fleet.fix_applied") == [] and len(model.calls) == 2
    return str(refused["reason"])


@pytest.mark.parametrize("tamper", ["source", "code_hash", "signature"])
def test_a_tampered_record_is_refused_and_logged(url: str, tamper: str) -> None:
    leader = fixed_elsewhere(url)
    client, name, envelope = _stored_fix(url)
    target = envelope["record"]["targets"][0]
    if tamper == "source":  # someone with write access to Redis plants code: the signature fails
        target["source"] = "def transform(value):\n    return 666\n"
    elif tamper == "code_hash":  # a record made against other code, re-signed with the key
        from crashoverride._fleet import records

        target["code_hash"] = "0" * 32
        envelope = json.loads(records.sign(envelope["record"], FLEET_KEY.encode()))
    else:
        envelope["sig"] = "0" * 64
    client.set(name, json.dumps(envelope))
    client.close()
    expected = "other code" if tamper == "code_hash" else "bad signature"
    assert expected in _refused_then_recovered_here(url, leader)


@pytest.mark.parametrize("signal", ["asyncio.CancelledError()", "GeneratorExit()", "Halt()"])
def test_a_fix_that_raises_a_control_signal_cannot_replace_the_failure(
    url: str, signal: str
) -> None:
    # A signed record whose code, while it is defined, raises what only the runtime may raise:
    # it is refused like any fix that raises, and the failure is recovered here as usual.
    from crashoverride._fleet import records

    leader = fixed_elsewhere(url)
    client, name, envelope = _stored_fix(url)
    envelope["record"]["targets"][0]["source"] = (
        "import asyncio\nclass Halt(BaseException): pass\n"
        f"raise {signal}\ndef transform(value):\n    return 666\n"
    )
    client.set(name, records.sign(envelope["record"], FLEET_KEY.encode()))
    client.close()
    assert "only the runtime may raise" in _refused_then_recovered_here(url, leader)


def authorise(amount: int) -> int:
    raise LookupError("authorise")  # another failure than ``transform``'s


def test_a_record_copied_under_another_failures_key_is_refused(url: str) -> None:
    # Without the key, anyone who can write to Redis can still copy a signed record: the
    # record is bound to the failure it was made for, and another failure never runs it.
    from crashoverride._fleet.scripts import keys_for
    from crashoverride.integration import fingerprint

    leader = fixed_elsewhere(url)
    client, _, envelope = _stored_fix(url)
    try:
        authorise(1)
    except LookupError as exc:
        other = fingerprint(exc)
    client.set(keys_for(NS["current"], other)["fix"], json.dumps(envelope))
    client.close()
    model = script(give_up("no authorisation service"))
    later = app(url, model)

    @later.handler()
    def pay(amount: int) -> int:
        return authorise(amount)

    with capture_logs() as logs, pytest.raises(LookupError):
        pay(4)
    close_fleet(leader, later)
    (refused,) = events(logs, "fleet.fix_refused")
    assert "another failure" in refused["reason"]
    assert events(logs, "fleet.fix_applied") == [] and len(model.calls) == 1


def test_a_record_nested_too_deep_is_refused_and_the_recovery_goes_on(url: str) -> None:
    # Anyone who can write to Redis can store anything: a malformed value is refused, it never
    # becomes an internal error that leaves the failure unrecovered in every process.
    leader = fixed_elsewhere(url)
    client, name, _ = _stored_fix(url)
    client.set(name, "[" * 100_000 + "]" * 100_000)
    client.close()
    model = script(exec_python(PATCH), done("patched"))
    later = app(url, model)

    @later.handler()
    def later_job(i: int) -> int:
        return transform(i)

    with capture_logs() as logs:
        assert later_job(4) == 40  # by its own agent run
    close_fleet(leader, later)
    (refused,) = events(logs, "fleet.fix_refused")
    assert "not a fix record" in refused["reason"]
    assert [e for e in logs if "internal error" in str(e.get("reason", ""))] == []


def test_a_lease_value_that_is_no_token_is_no_lease(url: str) -> None:
    model = script(exec_python(PATCH), done("patched"))
    co = app(url, model)

    @co.handler()
    def job(i: int) -> int:
        return transform(i)

    # The lease key of this failure, planted with a value no process of ours writes.
    from crashoverride._fleet.scripts import keys_for
    from crashoverride.integration import fingerprint

    try:
        transform(1)
    except NotImplementedError as exc:
        print_ = fingerprint(exc)
    client = redis.Redis.from_url(url)
    lease = keys_for(NS["current"], print_)["lease"]
    client.set(lease, "not-a-token", px=60_000)
    with capture_logs() as logs:
        assert job(4) == 40
    client.delete(lease)
    client.close()
    close_fleet(co)
    assert [e for e in logs if "internal error" in str(e.get("reason", ""))] == []
    assert events(logs, "recovery.succeeded")


@pytest.mark.parametrize("approver", ["denies", "raises"])
def test_approve_sees_a_propagated_fix_before_it_runs(url: str, approver: str) -> None:
    leader = fixed_elsewhere(url)
    shown: list[Any] = []

    def approve(code: Any) -> str:
        shown.append(code)
        if approver == "raises":
            return str(code.no_such_attribute)
        return "not on a Friday"

    model = script(give_up("no"))
    later = CrashOverride(model=model, approve=approve, coordination=fleet(url))

    @later.handler()
    def later_job(i: int) -> int:
        return transform(i)

    with capture_logs() as logs, pytest.raises(NotImplementedError) as caught:
        later_job(5)
    close_fleet(leader, later)
    assert "return value * 10" in shown[0]
    assert (shown[0].tool, shown[0].source, shown[0].is_code) == ("apply_fix", "fleet", True)
    expected = "AttributeError" if approver == "raises" else "not on a Friday"
    assert expected in events(logs, "fleet.fix_refused")[0]["reason"]
    assert "internal error" not in caught.value.__notes__[0]  # the agent ran instead


def _trail(calls: Any) -> list[tuple[Any, ...]]:
    return [(c["tool"], c["source"], c["ok"], c["approved_by"]) if isinstance(c, dict)
            else (c.tool, c.source, c.ok, c.approved_by) for c in calls]  # fmt: skip


def test_a_fix_applied_on_failure_passes_the_handlers_approver_and_is_audited(url: str) -> None:
    leader = fixed_elsewhere(url)
    seen: list[ApprovalRequest] = []

    def reviewer(request: ApprovalRequest) -> bool:
        seen.append(request)
        return True

    reports: list[Any] = []
    later = CrashOverride(model=script(), coordination=fleet(url), on_recovery=reports.append)

    @later.handler(approve=reviewer)  # the handler's approver, the application has none
    def later_job(i: int) -> int:
        return transform(i)

    with capture_logs() as logs:
        assert later_job(3) == 30
    close_fleet(leader, later)
    assert [(r.tool, r.source) for r in seen] == [("apply_fix", "fleet")]
    (report,) = reports
    trail = [("apply_fix", "fleet", True, f"approved by {reviewer.__qualname__}")]
    assert _trail(report.tool_calls) == trail
    assert "return value * 10" in report.tool_calls[0].code  # the code that ran
    assert _trail(events(logs, "recovery.tool_called")) == trail


def test_diagnose_mode_never_applies_a_fleet_fix(url: str) -> None:
    leader = fixed_elsewhere(url)
    model = script(done("the diagnosis"))
    later = CrashOverride(model=model, coordination=fleet(url), mode="diagnose")

    @later.handler()
    def later_job(i: int) -> int:
        return transform(i)

    with capture_logs() as logs, pytest.raises(NotImplementedError):
        later_job(3)
    close_fleet(leader, later)
    assert transform.__code__ is ORIGINAL  # nothing was changed
    (refused,) = events(logs, "fleet.fix_refused")
    assert "diagnose" in refused["reason"]
    assert len(model.calls) == 1  # the diagnosis ran instead


# --------------------------------------------------------------------- takeover and breakers


@pytest.mark.anyio
async def test_a_lease_whose_holder_died_is_taken_over(url: str) -> None:
    co = app(url, script(exec_python(PATCH), done("patched")), lease=0.3)
    keys = co._limits().coordination.keys  # type: ignore[attr-defined]

    @co.handler()
    async def job(i: int) -> int:
        return transform(i)

    # A leader that died mid-recovery: its lease runs out, no outcome is ever published.
    client = redis.Redis.from_url(url)
    try:
        names = keys(_fingerprint())
        client.set(names["fence"], 41)
        client.set(names["lease"], "41|dead", px=300)
        with capture_logs() as logs:
            assert await job(6) == 60
    finally:
        client.close()
        close_fleet(co)
    (taken,) = events(logs, "fleet.lease_taken")
    assert taken["takeover"] is True and taken["fencing_token"] == 42


def _fingerprint() -> str:
    from crashoverride._core.recovery import fingerprint

    try:
        transform(0)
    except NotImplementedError as exc:
        return fingerprint(exc)
    raise AssertionError("unreachable")


def test_the_fleet_breaker_skips_recoveries_that_failed_elsewhere(url: str) -> None:
    first = CrashOverride(model=script(give_up("cannot")), breaker_threshold=1,
                          coordination=fleet(url))  # fmt: skip
    second_model = script()
    second = CrashOverride(model=second_model, breaker_threshold=1, coordination=fleet(url))
    seen: list[Any] = []
    for co in (first, second):

        @co.handler()
        def job(i: int) -> int:
            return transform(i)

        with capture_logs(), pytest.raises(NotImplementedError) as caught:
            job(1)
        seen.append(caught.value)
    close_fleet(first, second)
    assert len(second_model.calls) == 0
    assert "fleet circuit breaker open" in "".join(seen[1].__notes__)


def test_the_fleet_budget_skips_with_a_clear_note(url: str) -> None:
    cost = {"max_agent_runs_per_minute": 1}
    first = app(url, script(exec_python(PATCH), done("patched")), **cost)
    second_model = script()
    second = app(url, second_model, **cost)

    @first.handler()
    def job(i: int) -> int:
        return transform(i)

    assert job(1) == 10

    @second.handler()
    def other(i: int) -> int:
        raise KeyError(i)  # another failure: the fleet already spent this minute's run

    with capture_logs() as logs, pytest.raises(KeyError) as caught:
        other(1)
    close_fleet(first, second)
    assert len(second_model.calls) == 0
    assert_skipped_for_budget(caught.value, logs)


# -------------------------------------------------------------------------------- degradation


@pytest.mark.anyio
async def test_an_unreachable_redis_degrades_to_in_process(anyio_backend: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: connections are refused
    model = script(exec_python(PATCH), done("patched"))
    co = app(url, model)

    @co.handler()
    async def job(i: int) -> int:
        return transform(i)

    results: list[int] = []

    async def run(i: int) -> None:
        results.append(await job(i))

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(run, i)
    close_fleet(co)
    assert sorted(results) == [0, 10, 20, 30, 40]
    assert len(model.calls) == 2  # in-process single-flight still holds
    (degraded,) = events(logs, "coordination.degraded")
    assert "Unavailable" not in degraded["reason"] and degraded["retry_after"] == 5.0
    assert {e["fleet_role"] for e in events(logs, "recovery.succeeded")} >= {"degraded"}


@pytest.mark.anyio
async def test_redis_killed_mid_run_degrades_and_nothing_hangs() -> None:
    RELEASE.clear()
    slow_patch = (
        "import anyio\n"
        "await anyio.to_thread.run_sync(RELEASE.wait, abandon_on_cancel=True)\n"
        "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\n"
        "rerun()"
    )
    with private_redis() as (url, server):
        first_model = script(exec_python(slow_patch), done("patched"))
        second_model = script(exec_python(PATCH), done("patched"))
        first, second = app(url, first_model), app(url, second_model)
        holder: dict[str, Any] = {}
        on_first, on_second = async_jobs(first, second)

        async def run(job: Any, i: int) -> None:
            holder[i] = await job(i)

        with capture_logs() as logs, anyio.fail_after(15):  # nothing hangs
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, on_first, 1)
                await await_for(lambda: events(logs, "fleet.lease_taken"))
                tg.start_soon(run, on_second, 2)
                await await_for(lambda: _subscribers(url) == 1)  # the second one waits in Redis
                server.kill()
                server.wait(10)
                await await_for(lambda: events(logs, "coordination.degraded"))
                RELEASE.set()
    close_fleet(first, second)
    assert holder == {1: 10, 2: 20}
    degraded = events(logs, "coordination.degraded")
    assert len(degraded) == 2  # the waiter (it then ran its own agent) and the leader's outcome
    assert len(second_model.calls) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("closed", ["leader", "waiter"])
async def test_an_app_closed_mid_recovery_leaves_no_connection_open(closed: str) -> None:
    """Closing an app (a server shutting down) while its recovery leads (renewing its lease)
    or waits in Redis: the recovery goes on, and nothing it still runs reopens a connection
    on the client closed under it (one would stay open, owned by no one, until the garbage
    collector warns of it)."""
    RELEASE.clear()
    with private_redis() as (url, _):
        holder = app(url, script(exec_python(HELD_PATCH), done("patched")), lease=1.5)
        waiter = app(url, script(exec_python(PATCH), done("patched")), lease=1.5)
        on_holder, on_waiter = async_jobs(holder, waiter)
        results: dict[int, int] = {}

        async def run(job: Any, i: int) -> None:
            results[i] = await job(i)

        try:
            with capture_logs() as logs, anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run, on_holder, 1)
                    await await_for(lambda: events(logs, "fleet.lease_taken"))
                    tg.start_soon(run, on_waiter, 2)
                    await await_for(lambda: _subscribers(url) == 1)
                    shut = holder if closed == "leader" else waiter
                    await anyio.to_thread.run_sync(close_fleet, shut)  # mid-recovery
                    await anyio.sleep(1.5)  # a lease renewal, a waiter's wake-up (MAX_WAKE)
                    RELEASE.set()
        finally:
            RELEASE.set()
            close_fleet(holder, waiter)
        assert results == {1: 10, 2: 20}
        await await_for(lambda: _clients(url) == 0)  # every client closed its connections


def _clients(url: str) -> int:
    """Clients connected to that Redis, besides the one asking."""
    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list()) - 1
    finally:
        client.close()


def _subscribers(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return len(client.pubsub_channels(ns_keys("*")))
    finally:
        client.close()


# ------------------------------------------------------------------------------ eager fixes


def _publish_by_hand(url: str, source: str) -> str:
    """A record as a leader elsewhere would publish it, made against this deployment's code."""
    import asyncio

    from crashoverride._fleet import records
    from crashoverride._fleet.scripts import announce
    from crashoverride._repair import journal

    new: dict[str, Any] = {}
    exec(compile(source, "<elsewhere>", "exec"), globals(), new)
    target = {"module": __name__, "qualname": "transform", "source": source,
              "code_hash": journal.digest(ORIGINAL),
              "new_hash": journal.digest(new["transform"].__code__)}  # fmt: skip
    record = records.make(namespace=NS["current"], fingerprint="elsewhere", targets=[target],
                              recovery_id="rec_elsewhere01", approved_by="a test")  # fmt: skip
    option = fleet(url)
    fix_key = ns_keys("{elsewhere}:fix")

    async def store() -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)
        await client.set(fix_key, records.sign(record, FLEET_KEY.encode()))
        await announce(client, option, fix_key)
        await client.aclose()

    asyncio.run(store())
    return str(record["id"])


@pytest.mark.anyio
async def test_eager_processes_apply_published_fixes_without_failing(url: str) -> None:
    eager = app(url, script(), apply_fixes="eager")
    with capture_logs() as logs:
        await eager.awarm_up()  # listens from now on
        await await_for(lambda: _subscribers(url) == 1)
        source = "def transform(value):\n    return value * 7\n"
        record_id = await anyio.to_thread.run_sync(_publish_by_hand, url, source)
        with anyio.fail_after(10):
            await await_for(lambda: events(logs, "fleet.fix_applied"))
    close_fleet(eager)
    assert transform(3) == 21  # never failed here: the fix arrived
    (applied,) = events(logs, "fleet.fix_applied")
    assert (applied["fix_record"], applied["fleet_role"]) == (record_id, "eager")


@pytest.mark.anyio
async def test_an_eager_process_takes_each_record_once(url: str) -> None:
    # A record announced while the subscriber reads the index arrives twice (index and
    # channel); so does one announced again. Either way it is judged and applied once.
    asked: list[str] = []

    def approve(request: ApprovalRequest) -> bool:
        asked.append(str(request))
        return False  # refused: a refused record is not offered again either

    eager = CrashOverride(model=script(), timeout=20, approve=approve,
                          coordination=fleet(url, apply_fixes="eager"))  # fmt: skip
    with capture_logs() as logs:
        await eager.awarm_up()
        await await_for(lambda: _subscribers(url) == 1)
        source = "def transform(value):\n    return value * 7\n"
        await anyio.to_thread.run_sync(_publish_by_hand, url, source)
        await anyio.to_thread.run_sync(_announce_again, url)
        with anyio.fail_after(10):
            await await_for(lambda: events(logs, "fleet.fix_refused"))
        await anyio.sleep(0.5)  # the second announcement has arrived by now
    close_fleet(eager)
    assert len(asked) == 1, asked
    assert len(events(logs, "fleet.fix_refused")) == 1


@pytest.mark.anyio
async def test_an_eager_fix_passes_the_approver_and_is_audited_as_an_event(url: str) -> None:
    def reviewer(request: ApprovalRequest) -> bool:
        return request.tool == "apply_fix"

    eager = CrashOverride(model=script(), timeout=20, approve=reviewer,
                          coordination=fleet(url, apply_fixes="eager"))  # fmt: skip
    with capture_logs() as logs:
        await eager.awarm_up()
        await await_for(lambda: _subscribers(url) == 1)
        source = "def transform(value):\n    return value * 7\n"
        await anyio.to_thread.run_sync(_publish_by_hand, url, source)
        with anyio.fail_after(10):
            await await_for(lambda: events(logs, "fleet.fix_applied"))
    close_fleet(eager)
    assert transform(3) == 21
    (called,) = events(logs, "fleet.tool_called")  # no report: the event is the audit line
    assert _trail([called]) == [
        ("apply_fix", "fleet", True, f"approved by {reviewer.__qualname__}")
    ]
    assert "return value * 7" in called["code"] and called["fleet_role"] == "eager"


@pytest.mark.anyio
async def test_an_eager_process_in_diagnose_mode_applies_nothing(url: str) -> None:
    eager = CrashOverride(model=script(), timeout=20, mode="diagnose",
                          coordination=fleet(url, apply_fixes="eager"))  # fmt: skip
    with capture_logs() as logs:
        await eager.awarm_up()
        await await_for(lambda: _subscribers(url) == 1)
        source = "def transform(value):\n    return value * 7\n"
        await anyio.to_thread.run_sync(_publish_by_hand, url, source)
        with anyio.fail_after(10):
            await await_for(lambda: events(logs, "fleet.fix_refused"))
    close_fleet(eager)
    assert transform.__code__ is ORIGINAL
    assert "diagnose" in events(logs, "fleet.fix_refused")[0]["reason"]
    assert events(logs, "fleet.fix_applied") == []


def _announce_again(url: str) -> None:
    import asyncio

    from crashoverride._fleet.scripts import announce

    async def again() -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)
        await announce(client, fleet(url), ns_keys("{elsewhere}:fix"))
        await client.aclose()

    asyncio.run(again())


def test_an_eager_process_started_later_catches_up(url: str) -> None:
    leader = fixed_elsewhere(url)
    late = app(url, script(), apply_fixes="eager")
    with capture_logs() as logs:
        late.warm_up()
        anyio.run(_until_applied, logs)
    close_fleet(leader, late)
    assert transform(4) == 40


async def _until_applied(logs: list[dict[str, Any]]) -> None:
    with anyio.fail_after(10):
        await await_for(lambda: events(logs, "fleet.fix_applied"))


# ------------------------------------------------------------------ deadlines, renewal, fencing


def test_a_waiter_never_waits_past_its_own_deadline(url: str) -> None:
    co = CrashOverride(model=script(), timeout=0.5, coordination=fleet(url))
    keys = co._limits().coordination.keys  # type: ignore[attr-defined]
    client = redis.Redis.from_url(url)
    try:
        names = keys(_fingerprint())
        client.set(names["lease"], "7|alive-elsewhere", px=30_000)  # a long recovery elsewhere

        @co.handler()
        def job(i: int) -> int:
            return transform(i)

        with pytest.raises(NotImplementedError) as caught:
            job(1)
    finally:
        client.close()
        close_fleet(co)
    assert "timed out after 0.5s waiting for a concurrent recovery" in caught.value.__notes__[0]


@pytest.mark.anyio
async def test_the_lease_is_renewed_while_a_long_recovery_runs(url: str) -> None:
    slow = PATCH.replace("anyio.sleep(0.3)", "anyio.sleep(1.2)")  # four leases long
    first, second = script(exec_python(slow), done("patched")), script()
    leader, other = app(url, first, lease=0.3), app(url, second, lease=0.3)
    on_leader, on_other = async_jobs(leader, other)

    results: list[int] = []

    async def run(job: Any, i: int) -> None:
        results.append(await job(i))

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, on_leader, 1)
            await await_for(lambda: events(logs, "recovery.started"))
            tg.start_soon(run, on_other, 2)
    close_fleet(leader, other)
    assert sorted(results) == [10, 20] and len(second.calls) == 0
    assert [e["takeover"] for e in events(logs, "fleet.lease_taken")] == [False]


def bump_fence(url: str) -> None:
    """Agent code of a test: another process took the lease over meanwhile."""
    client = redis.Redis.from_url(url)
    try:
        (fence,) = client.keys(ns_keys("*:fence"))
        client.incr(fence)
    finally:
        client.close()


def test_a_leader_that_lost_its_lease_cannot_publish(url: str) -> None:
    fenced = f"bump_fence({url!r})\n" + PATCH
    co = app(url, script(exec_python(fenced), done("patched")))

    @co.handler()
    def job(i: int) -> int:
        return transform(i)

    with capture_logs() as logs:
        assert job(1) == 10  # its own unit is recovered all the same
    close_fleet(co)
    (taken,) = events(logs, "fleet.lease_taken")
    lost = [e for e in events(logs, "fleet.lease_lost") if e["recovery_id"] == taken["recovery_id"]]
    assert [e["reason"] for e in lost] == [
        "a newer leader took over: this outcome was not published"
    ]
    assert events(logs, "fleet.fix_published") == []
    client = redis.Redis.from_url(url)
    try:
        assert client.keys("co:unit:*:outcome") == [] and client.keys(ns_keys("*:fix")) == []
    finally:
        client.close()


@pytest.mark.anyio
async def test_a_cancelled_leader_hands_the_lease_on_at_once(url: str) -> None:
    hang = "import anyio\nawait anyio.sleep(30)"
    leader = app(url, script(exec_python(hang)), lease=30)  # its lease would last 30 s
    other_model = script(exec_python(PATCH), done("patched"))
    other = app(url, other_model, lease=30)
    on_leader, on_other = async_jobs(leader, other)
    results: list[int] = []

    async def cancelled_leader(scope: anyio.CancelScope) -> None:
        with scope:
            await on_leader(1)

    async def run_other() -> None:
        results.append(await on_other(2))

    # The whole test may take a while on a loaded machine (the first recovery of the process
    # imports the SDK); what matters is the time from the cancellation to the other's result,
    # far below the 30 s the lease would otherwise last.
    with capture_logs() as logs, anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()
            tg.start_soon(cancelled_leader, scope)
            await await_for(lambda: events(logs, "recovery.started"))
            tg.start_soon(run_other)
            await await_for(lambda: _subscribers(url) == 1)
            scope.cancel()
            cancelled_at = anyio.current_time()
    handed_on_within = anyio.current_time() - cancelled_at
    close_fleet(leader, other)
    assert results == [20] and len(other_model.calls) == 2
    assert handed_on_within < 20  # not the lease's 30 s
    taken = events(logs, "fleet.lease_taken")
    assert [e["takeover"] for e in taken] == [False, True]
