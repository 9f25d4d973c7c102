"""The fleet through the Redis deployments users run: a Cluster, a Sentinel-managed master, TLS.

Each deployment is real ``redis-server`` processes of this module's own on loopback
(``topology_servers``), configured as the docs say ("Running a fleet"). Two ``CrashOverride``
apps, each with its own ``RedisCoordination`` (its own client and lease holder), stand for two
processes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride, RedisCoordination
from crashoverride.testing import done, exec_python, give_up, script
from tests.fleet.support import (
    FLEET_KEY,
    assert_skipped_for_budget,
    close_fleet,
    leader_then_others,
    new_namespace,
)
from tests.helpers import await_for
from tests.integrations.topology_servers import redis_cluster, redis_sentinel, redis_tls

PATCH = (
    "import anyio\n"
    "await anyio.sleep(0.3)\n"  # long enough for the other app's failures to find the lease
    "replace_function(transform, 'def transform(value):\\n    return value * 10\\n')\n"
    "rerun()"
)
HELD_PATCH = PATCH.replace(  # once the test says so: the other app's failures wait by then
    "await anyio.sleep(0.3)", "await anyio.to_thread.run_sync(RELEASE.wait, abandon_on_cancel=True)"
)
RELEASE = threading.Event()
TOPOLOGIES = ["cluster", "cluster_url", "sentinel", "tls"]


def transform(value: int) -> int:
    raise NotImplementedError("transform")


ORIGINAL = transform.__code__


@pytest.fixture(autouse=True)
def _fresh_code() -> Iterator[None]:
    transform.__code__ = ORIGINAL  # every test starts as a process that was never fixed
    yield
    transform.__code__ = ORIGINAL


class Deployment:
    """How the docs tell users to reach one kind of Redis: async clients for the fleet,
    a sync one for the test's own look at the data."""

    def __init__(
        self, make: Callable[[], Any], make_sync: Callable[[], Any], *, url: str | None = None,
        cluster: bool = False,
    ) -> None:  # fmt: skip
        self.make, self.make_sync, self.url, self.cluster = make, make_sync, url, cluster

    def coordination(self, namespace: str, **options: Any) -> RedisCoordination:
        options.setdefault("key", FLEET_KEY)
        options.setdefault("op_timeout", 2.0)  # a loaded test machine is no slow Redis
        if self.url is not None:
            return RedisCoordination(self.url, namespace=namespace, cluster=self.cluster,
                                     **options)  # fmt: skip
        return RedisCoordination(client_factory=self.make, namespace=namespace, **options)


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[str]:
    with redis_cluster() as url:
        yield url


@pytest.fixture(scope="module")
def cluster(cluster_node: str) -> Deployment:
    """A client of the user's own making (``client_factory``)."""
    import redis
    import redis.asyncio

    url = cluster_node
    return Deployment(lambda: redis.asyncio.RedisCluster.from_url(url),
                      lambda: redis.RedisCluster.from_url(url), cluster=True)  # fmt: skip


@pytest.fixture(scope="module")
def cluster_url(cluster_node: str) -> Deployment:
    """``RedisCoordination(url, cluster=True)``: the fleet builds the Cluster client."""
    import redis
    import redis.asyncio

    url = cluster_node
    return Deployment(lambda: redis.asyncio.RedisCluster.from_url(url),
                      lambda: redis.RedisCluster.from_url(url), url=url, cluster=True)  # fmt: skip


@pytest.fixture(scope="module")
def sentinel() -> Iterator[Deployment]:
    import redis.asyncio.sentinel
    import redis.sentinel

    with redis_sentinel() as (service, port):
        where = [("127.0.0.1", port)]
        yield Deployment(
            lambda: redis.asyncio.sentinel.Sentinel(where).master_for(service),
            lambda: redis.sentinel.Sentinel(where).master_for(service),
        )


@pytest.fixture(scope="module")
def tls() -> Iterator[Deployment]:
    import redis
    import redis.asyncio

    with redis_tls() as url:
        yield Deployment(lambda: redis.asyncio.Redis.from_url(url),
                         lambda: redis.Redis.from_url(url), url=url)  # fmt: skip


@pytest.fixture(params=TOPOLOGIES)
def deployment(request: pytest.FixtureRequest) -> Deployment:
    found: Deployment = request.getfixturevalue(request.param)
    return found


def async_job(co: CrashOverride) -> Any:
    @co.handler()
    async def job(i: int) -> int:
        return transform(i)

    return job


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


@pytest.mark.anyio
async def test_a_burst_across_two_processes_runs_one_agent(
    deployment: Deployment, anyio_backend: str
) -> None:
    namespace = new_namespace()
    first, second = script(exec_python(HELD_PATCH), done("patched")), script()
    leader = CrashOverride(model=first, timeout=20,
                           coordination=deployment.coordination(namespace))  # fmt: skip
    other = CrashOverride(model=second, timeout=20,
                          coordination=deployment.coordination(namespace))  # fmt: skip
    channel = _keys(leader)["channel"]

    def waiting() -> bool:  # the other app's leader waits in Redis for the outcome
        return _waiters(deployment, channel) == 1

    with capture_logs() as logs, anyio.fail_after(30):
        results = await leader_then_others(
            async_job(leader), async_job(other), 20, logs, release=RELEASE, waiting=waiting
        )
    close_fleet(leader, other)
    assert results == {i: i * 10 for i in range(20)}
    assert len(first.calls) == 2 and len(second.calls) == 0  # one agent run, two turns
    assert events(logs, "coordination.degraded") == []
    assert sorted({e["fleet_role"] for e in events(logs, "recovery.succeeded")}) == [
        "leader", "waiter",
    ]  # fmt: skip
    waiters = [e for e in events(logs, "recovery.succeeded") if e["fleet_role"] == "waiter"]
    assert len(waiters) == 19  # every other unit replayed through the fixed code
    (published,) = events(logs, "fleet.fix_published")
    assert published["targets"] == [f"{__name__}.transform"]


def _fixed_elsewhere(deployment: Deployment, namespace: str) -> CrashOverride:
    """An app that recovered and published its fix; the code is then as deployed again."""
    leader = CrashOverride(model=script(exec_python(PATCH), done("patched")),
                           coordination=deployment.coordination(namespace))  # fmt: skip

    @leader.handler()
    def job(i: int) -> int:
        return transform(i)

    assert job(1) == 10
    transform.__code__ = ORIGINAL
    return leader


def _later_job(co: CrashOverride) -> Callable[[int], int]:
    @co.handler()
    def job(i: int) -> int:
        return transform(i)

    return job


@pytest.mark.parametrize("tampered", [False, True], ids=["signed", "tampered"])
def test_a_fix_reaches_a_later_process_unless_tampered_with(
    deployment: Deployment, tampered: bool
) -> None:
    namespace = new_namespace()
    leader = _fixed_elsewhere(deployment, namespace)
    if tampered:  # someone who can write to Redis plants code: the signature no longer holds
        client = deployment.make_sync()
        try:
            fix_key = _fix_key(leader)
            envelope = json.loads(client.get(fix_key))
            envelope["record"]["targets"][0]["source"] = "def transform(value):\n    return 6\n"
            client.set(fix_key, json.dumps(envelope))
        finally:
            client.close()
    model = script(exec_python(PATCH), done("patched")) if tampered else script()
    later = CrashOverride(model=model, coordination=deployment.coordination(namespace))
    with capture_logs() as logs:
        assert _later_job(later)(4) == 40
    close_fleet(leader, later)
    if tampered:  # refused and logged; recovered by an agent run of its own
        (refused,) = events(logs, "fleet.fix_refused")
        assert "bad signature" in refused["reason"] and len(model.calls) == 2
        assert events(logs, "fleet.fix_applied") == []
    else:  # applied: no model call
        (applied,) = events(logs, "fleet.fix_applied")
        assert applied["targets"] == [f"{__name__}.transform"] and len(model.calls) == 0


def _fix_key(co: CrashOverride) -> str:
    return _keys(co)["fix"]


def _keys(co: CrashOverride) -> dict[str, str]:
    """The fleet's keys for the failure of ``transform``."""
    from crashoverride._core.recovery import fingerprint

    try:
        transform(0)
    except NotImplementedError as exc:
        keys: dict[str, str] = co._limits().coordination.keys(fingerprint(exc))  # type: ignore[attr-defined]
        return keys
    raise AssertionError("unreachable")


def _waiters(deployment: Deployment, channel: str) -> int:
    """How many subscribe to a failure's outcome channel (on any node of a Cluster)."""
    import redis

    client = deployment.make_sync()
    try:
        every = {"target_nodes": redis.RedisCluster.ALL_NODES} if deployment.cluster else {}
        return sum(count for _, count in client.pubsub_numsub(channel, **every))
    finally:
        client.close()


def test_the_fleet_budget_holds_across_processes(deployment: Deployment) -> None:
    namespace = new_namespace()
    cost = {"max_agent_runs_per_minute": 1}
    first = CrashOverride(model=script(exec_python(PATCH), done("patched")),
                          coordination=deployment.coordination(namespace, **cost))  # fmt: skip
    second_model = script()
    second = CrashOverride(model=second_model,
                           coordination=deployment.coordination(namespace, **cost))  # fmt: skip
    assert _later_job(first)(1) == 10

    @second.handler()
    def other(i: int) -> int:
        raise KeyError(i)  # another failure (another slot): the fleet spent this minute's run

    with capture_logs() as logs, pytest.raises(KeyError) as caught:
        other(1)
    close_fleet(first, second)
    assert len(second_model.calls) == 0
    assert_skipped_for_budget(caught.value, logs)


def test_the_cluster_spreads_the_fleet_over_its_masters(cluster: Deployment) -> None:
    """The test cluster is a real one (three masters sharing the slots), and one fingerprint's
    keys share a slot while different fingerprints' keys land on different ones."""
    from crashoverride._fleet.scripts import keys_for

    client = cluster.make_sync()
    try:
        masters = [n for n in client.get_nodes() if n.server_type == "primary"]
        slots = {name: {client.keyslot(key) for key in keys_for("ns", name).values()
                        if not key.endswith(":done")} for name in ("a", "b", "c", "d")}  # fmt: skip
    finally:
        client.close()
    assert len(masters) == 3
    assert all(len(found) == 1 for found in slots.values())
    assert len(set.union(*slots.values())) > 1


def test_the_fleet_breaker_holds_across_processes(deployment: Deployment) -> None:
    namespace = new_namespace()
    first = CrashOverride(model=script(give_up("cannot")), breaker_threshold=1,
                          coordination=deployment.coordination(namespace))  # fmt: skip
    second_model = script()
    second = CrashOverride(model=second_model, breaker_threshold=1,
                           coordination=deployment.coordination(namespace))  # fmt: skip
    notes = []
    for co in (first, second):
        with capture_logs(), pytest.raises(NotImplementedError) as caught:
            _later_job(co)(1)
        notes.append("".join(caught.value.__notes__))
    close_fleet(first, second)
    assert len(second_model.calls) == 0
    assert "fleet circuit breaker open" in notes[1]


@pytest.mark.anyio
async def test_eager_processes_get_a_fix_live_and_a_later_one_catches_up(
    deployment: Deployment, anyio_backend: str
) -> None:
    namespace = new_namespace()
    eager = CrashOverride(
        model=script(), coordination=deployment.coordination(namespace, apply_fixes="eager")
    )
    late = CrashOverride(
        model=script(), coordination=deployment.coordination(namespace, apply_fixes="eager")
    )
    try:
        with capture_logs() as logs:
            await eager.awarm_up()  # listens from now on
            await await_for(lambda: _listening(deployment, namespace))
            await anyio.to_thread.run_sync(_publish_elsewhere, deployment, namespace)
            await await_for(lambda: events(logs, "fleet.fix_applied"))  # live, from the channel
            assert transform(2) == 14  # it never failed here
            transform.__code__ = ORIGINAL
            await late.awarm_up()  # a process started later
            await await_for(lambda: len(events(logs, "fleet.fix_applied")) == 2)  # from the index
    finally:
        close_fleet(eager, late)  # their listeners stop
    assert transform(3) == 21
    assert {e["fleet_role"] for e in events(logs, "fleet.fix_applied")} == {"eager"}


def _publish_elsewhere(deployment: Deployment, namespace: str) -> None:
    """A fix record as a leader in another process publishes it (in this process, a leader's
    fix would be applied here already), through the deployment's own async client."""
    import asyncio

    from crashoverride._fleet import records
    from crashoverride._fleet.link import _aclose
    from crashoverride._fleet.scripts import announce, keys_for
    from crashoverride._repair import journal

    source = "def transform(value):\n    return value * 7\n"
    new: dict[str, Any] = {}
    exec(compile(source, "<elsewhere>", "exec"), {}, new)
    target = {"module": __name__, "qualname": "transform", "source": source,
              "code_hash": journal.digest(ORIGINAL),
              "new_hash": journal.digest(new["transform"].__code__)}  # fmt: skip
    record = records.make(namespace=namespace, fingerprint="elsewhere", targets=[target],
                              recovery_id="rec_elsewhere01", approved_by="a test")  # fmt: skip
    fix_key = keys_for(namespace, "elsewhere")["fix"]

    async def store() -> None:
        client = deployment.make()
        try:
            await client.set(fix_key, records.sign(record, FLEET_KEY.encode()))
            await announce(client, deployment.coordination(namespace), fix_key)
        finally:
            await _aclose(client)  # the Sentinel's connections too

    asyncio.run(store())


def _listening(deployment: Deployment, namespace: str) -> bool:
    """Whether someone subscribed to the namespace's fix channel (on any node of a Cluster)."""
    import redis

    from crashoverride._fleet.scripts import index_key

    client = deployment.make_sync()
    try:
        every = {"target_nodes": redis.RedisCluster.ALL_NODES} if deployment.cluster else {}
        return any(count for _, count in client.pubsub_numsub(index_key(namespace), **every))
    finally:
        client.close()
