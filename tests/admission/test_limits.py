"""Single-flight, circuit breaker and the concurrency limit."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride
from crashoverride.testing import Script, done, exec_python, give_up, script

PATCH_TRANSFORM = (
    "import anyio\n"
    "await anyio.sleep(0.2)\n"  # long enough for every other failure to queue up behind us
    "def transform(value):\n    return value * 10\n"
    "globals()['transform'] = transform\n"
    "rerun()"
)


def transform(value: int) -> int:
    raise NotImplementedError("transform")


@pytest.fixture(autouse=True)
def _restore_transform() -> Any:
    original = globals()["transform"]
    yield
    globals()["transform"] = original


@pytest.mark.anyio
async def test_fifty_concurrent_identical_failures_cost_one_agent_run(anyio_backend: str) -> None:
    model = script(exec_python(PATCH_TRANSFORM), done("patched transform"))
    co = CrashOverride(model=model, timeout=30)

    @co.handler()
    async def job(i: int) -> int:
        await anyio.lowlevel.checkpoint()
        return transform(i)

    results: dict[int, int] = {}

    async def run(i: int) -> None:
        results[i] = await job(i)

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(run, i)
    assert results == {i: i * 10 for i in range(50)}
    assert len(model.calls) == 2  # one agent run: a tool turn and the final message
    started = [e for e in logs if e["event"] == "recovery.started"]
    replayed = [e for e in logs if e["event"] == "recovery.succeeded" and e.get("via") == "replay"]
    assert len(started) == 1 and len(replayed) == 49


def test_single_flight_across_threads() -> None:
    model = script(exec_python(PATCH_TRANSFORM), done())
    co = CrashOverride(model=model)

    @co.handler()
    def job(i: int) -> int:
        return transform(i)

    results: dict[int, int] = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: job(i)})) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: i * 10 for i in range(8)}
    assert len(model.calls) == 2


@pytest.mark.anyio
async def test_waiters_reraise_at_once_when_the_leader_fails(anyio_backend: str) -> None:
    model = script(exec_python("import anyio\nawait anyio.sleep(0.2)\ngive_up('no')"))
    co = CrashOverride(model=model)

    @co.handler()
    async def job() -> int:
        raise KeyError("k")

    errors: list[BaseException] = []

    async def run() -> None:
        try:
            await job()
        except KeyError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(run)
    assert len(errors) == 5
    assert len(model.calls) == 1
    notes = [n for e in errors for n in e.__notes__]
    assert sum("did not recover it" in n for n in notes) == 4


def convert(value: int) -> int:
    raise NotImplementedError("convert")


CONVERT = convert.__code__
FIX_CONVERT = "replace_function(convert, 'def convert(value):\\n    return value * 10\\n')\nrerun()"


@pytest.fixture
def fresh_convert() -> Any:
    convert.__code__ = CONVERT
    yield
    convert.__code__ = CONVERT


def _late_units(co: CrashOverride) -> tuple[Any, Any, list[int]]:
    """Two units failing alike: ``late`` raises, and before its recovery begins, ``first``
    fails, is recovered and ends (on a loaded machine, a concurrent recovery can end between a
    unit's failure and its turn at single-flight)."""
    concurrent: list[int] = []

    @co.handler()
    def first(i: int) -> int:
        return convert(i)

    @co.handler()
    def late(i: int) -> int:
        try:
            return convert(i)
        finally:
            if not concurrent:  # its replay, if any, runs no other recovery
                concurrent.append(first(1))

    return first, late, concurrent


@pytest.mark.usefixtures("fresh_convert")
def test_a_failure_raised_before_a_concurrent_fix_replays_through_it() -> None:
    model = script(exec_python(FIX_CONVERT), done("fixed"))
    co = CrashOverride(model=model, timeout=30)
    _, late, concurrent = _late_units(co)
    with capture_logs() as logs:
        assert late(2) == 20
    assert concurrent == [10]
    assert len(model.calls) == 2  # one agent run: the concurrent recovery's
    (replayed,) = [e for e in logs if e["event"] == "recovery.succeeded" and e["via"] == "replay"]
    assert replayed["reason"] == "replayed after a concurrent recovery"


@pytest.mark.usefixtures("fresh_convert")
def test_a_failure_the_concurrent_fix_does_not_cover_gets_its_own_agent_run() -> None:
    partial = (
        "replace_function(convert, 'def convert(value):\\n    if value > 1:\\n"
        "        raise NotImplementedError(value)\\n    return value * 10\\n')\nrerun()"
    )
    model = (
        Script(exec_python(partial), done("fixed")).run(exec_python(FIX_CONVERT), done()).model()
    )
    co = CrashOverride(model=model, timeout=30)
    _, late, concurrent = _late_units(co)
    with capture_logs() as logs:
        assert late(2) == 20  # the replay failed again: this failure led, and its agent ran
    assert concurrent == [10] and len(model.calls) == 4
    assert [e["event"] for e in logs if e["event"].startswith("recovery.replay")] == [
        "recovery.replay_failed"
    ]


def test_breaker_opens_after_repeated_failures_and_skips_the_model() -> None:
    model = Script(give_up("a")).run(give_up("b")).model()
    co = CrashOverride(model=model, breaker_threshold=2, breaker_window=60, breaker_cooldown=60)

    def boom() -> None:
        raise KeyError("same place")  # one fingerprint: same type, same line

    for _ in range(2):
        with pytest.raises(KeyError), co.handler():
            boom()
    with capture_logs() as logs, pytest.raises(KeyError) as info, co.handler():
        boom()
    assert len(model.calls) == 2  # the third failure never reached the model
    assert any("circuit breaker open" in n for n in info.value.__notes__)
    assert [e["event"] for e in logs] == ["recovery.skipped"]


def test_breaker_half_opens_after_cool_down() -> None:
    model = Script(give_up("a")).run(exec_python("caller['fixed'] = True"), done()).model()
    co = CrashOverride(model=model, breaker_threshold=1, breaker_window=60, breaker_cooldown=0.2)

    def failing_block() -> None:
        with co.handler():
            raise KeyError("x")

    with pytest.raises(KeyError):
        failing_block()
    with pytest.raises(KeyError, match="x") as info:
        failing_block()
    assert any("circuit breaker" in n for n in info.value.__notes__)
    time.sleep(0.25)
    failing_block()  # half-open: a trial recovery runs and succeeds
    assert model.remaining_steps == 0


def test_concurrency_limit_skips_when_no_slot_frees_in_time() -> None:
    gate = threading.Event()
    model = (
        Script(exec_python("gate.wait(10)\ncaller['fixed'] = True"), done())
        .run(exec_python("caller['fixed'] = True"), done())
        .model()
    )
    co = CrashOverride(
        model=model, max_concurrent_recoveries=1, concurrency_wait=0.2, single_flight=False
    )
    outcomes: list[str] = []

    def first() -> None:
        assert gate is not None  # makes `gate` visible in this frame for the agent's code
        with co.handler():
            raise ValueError("first")
        outcomes.append("first recovered")

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.3)
    with pytest.raises(KeyError) as info, co.handler():
        raise KeyError("second")
    gate.set()
    t.join(10)
    assert outcomes == ["first recovered"]
    assert any("too many recoveries at once" in n for n in info.value.__notes__)


class FakeClock:
    """Stands in for ``time`` inside ``_admission.limits``: time moves only when a test says."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    from crashoverride._admission import limits

    fake = FakeClock()
    monkeypatch.setattr(limits, "time", fake)
    return fake


def test_breaker_forgets_failures_once_their_window_has_passed(clock: FakeClock) -> None:
    from crashoverride._admission.limits import Breaker

    breaker = Breaker(threshold=3, window=10, cooldown=30)
    for i in range(10_000):  # a long-running server meets many distinct failures
        breaker.record(f"fp{i}", False)
    assert len(breaker) == 10_000
    clock.now += 10 + 10 + 1  # the window, plus at most one sweep interval
    breaker.record("fresh", False)
    assert len(breaker) == 1
    assert breaker.check("fp0") is None


def test_breaker_forgets_open_circuits_a_window_after_their_cool_down(clock: FakeClock) -> None:
    from crashoverride._admission.limits import Breaker

    breaker = Breaker(threshold=1, window=10, cooldown=30)
    for i in range(10_000):
        breaker.record(f"fp{i}", False)
    assert breaker.check("fp0") == pytest.approx(30)
    clock.now += 30 + 10 + 10 + 1  # cool-down, a quiet window, at most one sweep interval
    assert breaker.check("somebody else") is None
    assert len(breaker) == 0


def test_breaker_keeps_at_most_max_entries_and_forgets_the_oldest(clock: FakeClock) -> None:
    from crashoverride._admission.limits import Breaker

    breaker = Breaker(threshold=2, window=60, cooldown=30, max_entries=100)
    for i in range(1_000):  # all within one window: only the cap can bound this
        breaker.record(f"fp{i}", False)
    assert len(breaker) == 100
    breaker.record("fp999", False)  # the newest are remembered: its second failure opens it
    assert breaker.check("fp999") == pytest.approx(30)
    breaker.record("fp0", False)  # the oldest was forgotten: this is its first failure again
    assert breaker.check("fp0") is None


def test_half_open_admits_one_trial_and_refuses_the_rest_until_it_records(
    clock: FakeClock,
) -> None:
    from crashoverride._admission.limits import Breaker

    breaker = Breaker(threshold=1, window=60, cooldown=10)
    breaker.record("f", False)
    assert breaker.check("f") == pytest.approx(10)
    clock.now += 10
    start = threading.Barrier(20)
    answers: list[float | None] = []

    def caller() -> None:
        start.wait()
        answers.append(breaker.check("f"))

    threads = [threading.Thread(target=caller) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert answers.count(None) == 1  # exactly one trial
    refused = breaker.admit("f").skip
    assert refused is not None and "trial recovery is in progress" in refused
    breaker.record("f", True)  # the trial recovered: the circuit closes for everyone
    assert breaker.check("f") is None and breaker.check("f") is None


def test_a_failed_trial_reopens_the_circuit(clock: FakeClock) -> None:
    from crashoverride._admission.limits import Breaker

    breaker = Breaker(threshold=3, window=60, cooldown=10)
    for _ in range(3):
        breaker.record("f", False)
    clock.now += 10
    assert breaker.check("f") is None  # the trial
    breaker.record("f", False)  # one failed trial is enough: no new count to the threshold
    assert breaker.check("f") == pytest.approx(10)
    skip = breaker.admit("f").skip
    assert skip == "circuit breaker open for this failure (10s of cool-down left)"


def test_a_trial_that_never_records_expires(clock: FakeClock) -> None:
    from crashoverride._admission.limits import Breaker

    breaker = Breaker(threshold=1, window=60, cooldown=10)
    breaker.record("f", False)
    clock.now += 10
    assert breaker.check("f") is None  # the trial, which then vanishes without a verdict
    clock.now += 9.5
    assert breaker.check("f") == pytest.approx(0.5)  # still its turn, for one more cool-down
    clock.now += 0.5
    assert breaker.check("f") is None  # the trial expired: the next caller is the new trial
    assert breaker.check("f") is not None


def test_trial_timeout_and_handing_a_trial_back(clock: FakeClock) -> None:
    from crashoverride._admission.limits import Breaker

    breaker = Breaker(threshold=1, window=60, cooldown=10, trial_timeout=100)
    breaker.record("f", False)
    clock.now += 10
    trial = breaker.admit("f")
    assert trial.skip is None and trial.trial
    refused = breaker.admit("f")
    assert refused.skip is not None and not refused.trial
    clock.now += 99
    breaker.abandon("f", refused.trial)  # not the trial: changes nothing
    assert breaker.check("f") == pytest.approx(1)
    breaker.abandon("f", trial.trial)  # e.g. no slot in time: the trial ran no agent
    again = breaker.admit("f")
    assert again.skip is None and again.trial and again.trial != trial.trial
    breaker.abandon("f", trial.trial)  # a stale hand-back does not free the new trial
    assert breaker.check("f") is not None


def test_a_failure_raised_during_a_flight_that_joins_after_it_landed_gets_its_answer() -> None:
    # A burst's failures pass the loop's lane one at a time: one raised while the leader ran
    # may reach the join after the leader landed. It is the leader's to answer, not a new run;
    # a failure raised after the landing starts a new flight.
    from crashoverride._admission.limits import SingleFlight

    flights = SingleFlight()
    raised_during = time.monotonic()
    leader, leads = flights.join("fp", raised_during)
    assert leads
    flights.land(leader, True)
    late, leads_late = flights.join("fp", raised_during)
    assert late is leader and not leads_late and late.done.result() is True
    fresh, leads_fresh = flights.join("fp", time.monotonic())
    assert fresh is not leader and leads_fresh
    unknown, leads_unknown = flights.join("other", raised_during)
    assert leads_unknown and unknown is not leader
