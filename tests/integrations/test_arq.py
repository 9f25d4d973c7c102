"""arq: recovery inside a real worker on a real Redis; arq's control flow and failures untouched.

Each test runs an ``arq.worker.Worker`` in this process (burst mode: until its queue is empty)
on a queue of its own; only the model is scripted.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

try:
    import arq  # noqa: F401
except ImportError as missing:  # not in `.[all,dev]`: its redis pin conflicts with Celery's
    raise ImportError(
        "the arq tests need arq: pip install --no-deps 'arq>=0.28' (`make test` does; see the "
        "arq extra in pyproject.toml)"
    ) from missing

from arq.jobs import Job, JobStatus
from arq.worker import Retry, func
from structlog.testing import capture_logs

from crashoverride import CrashOverride
from crashoverride.integrations.arq import FOLLOWUP_FUNCTION, ArqRunner, install, recovered
from crashoverride.testing import Script, done, exec_python, give_up, script
from tests.integrations.arq_support import Queue, burst, queue

# arq passes redis-py a keyword redis 6+ deprecates (``retry_on_timeout``) and its worker closes
# its pool with the deprecated ``close()``: not ours to fix, and warnings are errors here.
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Call to '__init__' function with deprecated usage of input argument/s "
        "'retry_on_timeout':DeprecationWarning"
    ),
    pytest.mark.filterwarnings("ignore:Call to deprecated close:DeprecationWarning"),
]

# Filled by code the scripted agents run inside the worker.
FOLLOWUP_SEEN: list[Any] = []
CHARGES: list[int] = []


@recovered("Return the order total in cents.")
async def order_total(ctx: dict[str, Any], order_id: int) -> int:
    payload = {"amount_cents": 4200}
    return int(payload["total"])  # the upstream renamed the field


async def retry_once(ctx: dict[str, Any]) -> str:
    if ctx["job_try"] == 1:
        raise Retry(defer=0)
    return f"try {ctx['job_try']}"


@recovered(followups=["open a ticket"])
async def with_followup(ctx: dict[str, Any]) -> int:
    raise LookupError("missing rate")


def _charge(order: int) -> str:
    CHARGES.append(order)
    return f"ch_{order}_{len(CHARGES)}"


# Declared once, as an application does at import time; the journal a call is written to is
# the one of the unit of work it runs in: the job's, named by the job id.
charge = CrashOverride().effect(_charge, key=lambda order: f"charge order {order}")


async def pay_then_retry(ctx: dict[str, Any], order: int) -> str:
    receipt: str = charge(order)
    if ctx["job_try"] == 1:  # the mail server was down: arq tries the job again
        raise Retry(defer=0)
    return receipt


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def q() -> Any:
    with queue() as made:
        yield made


def test_a_recovered_job_returns_its_value_to_arqs_result(q: Queue) -> None:
    model = script(
        exec_python(
            "assert job['function'] == 'order_total' and job['args'] == (7,)\n"
            "assert job['try'] == 1 and job['id'] == ctx['job_id']\n"
            "set_result(caller['payload']['amount_cents'])"
        ),
        done("read amount_cents instead of total"),
    )
    settings = q.settings([order_total])
    install(settings, CrashOverride(model=model))

    async def main() -> tuple[Any, Any, JobStatus]:
        pool = await q.pool()
        try:
            job = await q.enqueue(pool, "order_total", 7)
            await burst(settings)
            fresh = Job(job.job_id, pool)  # a fresh handle reads Redis
            return await fresh.result(timeout=30), await fresh.result_info(), await fresh.status()
        finally:
            await pool.aclose()

    value, info, status = run(main())
    assert value == 4200
    assert (info.success, info.job_try, status) == (True, 1, JobStatus.complete)
    assert len(model.calls) == 2


def test_retry_passes_untouched(q: Queue) -> None:
    model = script()  # no steps: any agent run would fail the job
    settings = q.settings([retry_once])
    install(settings, CrashOverride(model=model))

    async def main() -> Any:
        pool = await q.pool()
        try:
            job = await q.enqueue(pool, "retry_once")
            worker = await burst(settings)
            assert (worker.jobs_retried, worker.jobs_complete) == (1, 1)
            return await job.result_info()
        finally:
            await pool.aclose()

    info = run(main())
    assert (info.success, info.result, info.job_try) == (True, "try 2", 2)
    assert not model.calls


# ------------------------------------------------------------------------------ transparency


async def fails(ctx: dict[str, Any]) -> None:
    raise ValueError("original")


async def retries_then_fails(ctx: dict[str, Any]) -> None:
    if ctx["job_try"] == 1:
        raise Retry(defer=0)
    raise LookupError(f"still missing on try {ctx['job_try']}")


async def always_retries(ctx: dict[str, Any]) -> None:
    raise Retry(defer=0)


async def succeeds(ctx: dict[str, Any], x: int) -> int:
    return x * 2


TRANSPARENCY_JOBS = [
    ("fails", ()),
    ("retries_then_fails", ()),
    ("always_retries", ()),
    ("succeeds", (21,)),
]


def _observed(q: Queue, settings: dict[str, Any]) -> tuple[list[Any], tuple[int, int, int]]:
    """What arq shows of each job after a burst: result, failure, tries, state; the counters."""

    async def main() -> tuple[list[Any], tuple[int, int, int]]:
        pool = await q.pool()
        try:
            jobs = [await q.enqueue(pool, name, *args) for name, args in TRANSPARENCY_JOBS]
            worker = await burst(settings)
            seen = []
            for job in jobs:
                info = await job.result_info()
                assert info is not None
                result = info.result
                shown = (type(result), result.args) if isinstance(result, BaseException) else result
                seen.append((info.function, info.success, shown, info.job_try, await job.status()))
            return seen, (worker.jobs_complete, worker.jobs_failed, worker.jobs_retried)
        finally:
            await pool.aclose()

    return run(main())  # type: ignore[no-any-return]


def test_a_give_up_leaves_arqs_behaviour_as_without_crashoverride(q: Queue) -> None:
    functions = [fails, retries_then_fails, func(always_retries, max_tries=2), succeeds]
    # One job at a time, in both runs: the order of tries is then the same.
    plain = _observed(q, q.settings(functions, max_jobs=1))

    model = Script(give_up("no source for the value")).run(give_up("nothing to recover")).model()
    settings = q.settings(functions, max_jobs=1)
    install(settings, CrashOverride(model=model))
    protected = _observed(q, settings)

    assert protected == plain
    # The failures reached the agent (once each); the retries never did.
    assert len(model.calls) == 2
    # And the runs were the interesting ones: failures, a retry, retries exhausted, a success.
    seen, _ = plain
    assert [success for _, success, _, _, _ in seen] == [False, False, False, True]
    assert seen[1][3] == 2 and seen[2][2][0].__name__ == "JobExecutionFailed"


def test_the_stored_failure_is_the_original_exception_with_a_note(q: Queue) -> None:
    settings = q.settings([fails])
    install(settings, CrashOverride(model=script(give_up("no source for the value"))))

    async def main() -> BaseException:
        pool = await q.pool()
        try:
            job = await q.enqueue(pool, "fails")
            await burst(settings)
            with pytest.raises(ValueError, match="original") as raised:
                await job.result(timeout=30)
            return raised.value
        finally:
            await pool.aclose()

    error = run(main())
    assert any("gave up" in note for note in getattr(error, "__notes__", ()))


# -------------------------------------------------------------------------------- follow-ups


def test_a_followup_runs_as_an_arq_job_on_the_workers_queue(q: Queue) -> None:
    FOLLOWUP_SEEN.clear()
    model = (
        Script(exec_python("set_result(0)"), done("used 0"))
        # The follow-up agent, in the worker, reports what it was given.
        .run(
            exec_python(
                "import tests.integrations.test_arq as t\n"
                "t.FOLLOWUP_SEEN.append((objective, report.exc_type))"
            ),
            done("ticket opened"),
        )
        .model()
    )
    settings = q.settings([with_followup])
    runner = install(settings, CrashOverride(model=model))
    assert (runner.queue_name, FOLLOWUP_FUNCTION) == (q.name, "crashoverride.followup")

    async def main() -> tuple[Any, Any]:
        pool = await q.pool()
        try:
            job = await q.enqueue(pool, "with_followup")
            with capture_logs() as logs:
                await burst(settings)  # runs until the queue is empty: the follow-up too
            (submitted,) = [e for e in logs if e["event"] == "followup.submitted"]
            assert submitted["runner"] == "ArqRunner"
            q.job_ids.append(submitted["followup_id"])
            followup = Job(submitted["followup_id"], pool)
            return await job.result(timeout=30), await followup.result_info()
        finally:
            await pool.aclose()

    value, followup = run(main())
    assert value == 0
    assert FOLLOWUP_SEEN == [("open a ticket", "builtins.LookupError")]
    assert (followup.function, followup.queue_name, followup.success) == (
        FOLLOWUP_FUNCTION, q.name, True,
    )  # fmt: skip
    assert followup.result["outcome"] == "succeeded"


def test_a_followup_sent_where_no_worker_listens_waits_for_one(q: Queue) -> None:
    FOLLOWUP_SEEN.clear()
    model = (
        Script(exec_python("set_result(1)"), done("used 1"))
        .run(
            exec_python(
                "import tests.integrations.test_arq as t\nt.FOLLOWUP_SEEN.append(objective)"
            ),
            done("noted"),
        )
        .model()
    )
    co = CrashOverride(model=model)
    runner = ArqRunner(q.redis_settings, queue_name=q.name)
    # Outside any worker (a web process, a script): the handler names the runner itself.
    guard = co.handler(followups=["check the feed"], followup_runner=runner)

    @guard
    def read_feed() -> int:
        raise OSError("feed down")

    with capture_logs() as logs:
        assert read_feed() == 1
    (submitted,) = [e for e in logs if e["event"] == "followup.submitted"]
    (unconsumed,) = [e for e in logs if e["event"] == "followup.unconsumed"]
    assert unconsumed["followup_id"] == submitted["followup_id"]
    assert unconsumed["queue"] == q.name
    q.job_ids.append(submitted["followup_id"])
    assert FOLLOWUP_SEEN == []

    # The job waited in Redis; a worker started later on that queue runs it.
    settings = q.settings([succeeds])
    install(settings, co)
    run(burst(settings))
    assert FOLLOWUP_SEEN == ["check the feed"]


# ----------------------------------------------------------------------------------- effects


def test_a_retried_job_does_not_charge_again(q: Queue) -> None:
    CHARGES.clear()
    model = script()  # no agent: Retry is arq's control flow
    settings = q.settings([pay_then_retry])
    install(settings, CrashOverride(model=model))

    async def main() -> Any:
        pool = await q.pool()
        try:
            job = await q.enqueue(pool, "pay_then_retry", 31)
            with capture_logs() as logs:
                await burst(settings)
            return await job.result_info(), logs
        finally:
            await pool.aclose()

    info, logs = run(main())
    assert (info.result, info.job_try) == ("ch_31_1", 2)  # the second try got the first receipt
    assert CHARGES == [31]
    assert [e["event"] for e in logs if e["event"].startswith("effect.")] == ["effect.replayed"]
    assert not model.calls


def test_without_crashoverride_the_retry_charges_again(q: Queue) -> None:
    # The control for the test above: the same job on a plain worker pays twice.
    CHARGES.clear()

    async def main() -> Any:
        pool = await q.pool()
        try:
            job = await q.enqueue(pool, "pay_then_retry", 32)
            await burst(q.settings([pay_then_retry]))
            return await job.result_info()
        finally:
            await pool.aclose()

    info = run(main())
    assert (info.result, CHARGES) == ("ch_32_2", [32, 32])


# ------------------------------------------------------------------------------------ wiring


def test_install_protects_every_function_once_and_keeps_arqs_names(q: Queue) -> None:
    async def plain(ctx: dict[str, Any]) -> None: ...

    @recovered(recover=False)
    async def opted_out(ctx: dict[str, Any]) -> None: ...

    settings = q.settings([
        order_total, func(plain, name="renamed", max_tries=3), opted_out,
        "tests.integrations.test_arq.succeeds",  # arq imports it by name; so does install
    ])  # fmt: skip
    install(settings, CrashOverride(model=script()))
    install(settings, CrashOverride(model=script()))  # twice: nothing wrapped twice
    names = [f if isinstance(f, str) else getattr(f, "name", None) or f.__qualname__
             for f in settings["functions"]]  # fmt: skip
    assert names == [
        "order_total",
        "renamed",
        "test_install_protects_every_function_once_and_keeps_arqs_names.<locals>.opted_out",
        "tests.integrations.test_arq.succeeds",
        FOLLOWUP_FUNCTION,
    ]
    assert settings["functions"][3].coroutine.__wrapped__ is succeeds
    assert settings["functions"][4].timeout_s is None  # the worker's job_timeout
    renamed = settings["functions"][1]
    assert renamed.max_tries == 3 and renamed.coroutine.__wrapped__ is plain
    assert order_total.__wrapped__.__name__ == "order_total"  # type: ignore[attr-defined]


def test_a_settings_class_is_configured_in_place(q: Queue) -> None:
    co = CrashOverride(model=script())

    class WorkerSettings:
        functions: ClassVar[list[Any]] = [succeeds]
        queue_name = q.name
        redis_settings = q.redis_settings

    runner = install(WorkerSettings, co, followup_job_timeout=900)
    assert WorkerSettings.ctx == {"crashoverride": co, "crashoverride_followup_runner": runner}  # type: ignore[attr-defined]
    followup = WorkerSettings.functions[-1]
    assert (followup.name, followup.timeout_s) == (FOLLOWUP_FUNCTION, 900)
    assert runner.queue_name == q.name


def test_a_job_function_must_be_a_coroutine_function() -> None:
    from crashoverride import ConfigurationError

    def sync_job(ctx: dict[str, Any]) -> None: ...

    with pytest.raises(ConfigurationError, match="coroutine function"):
        recovered()(sync_job)  # type: ignore[type-var]


# ----------------------------------------------------------------------------------- example


def test_the_arq_worker_example_runs(q: Queue) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "REDIS_URL": q.url, "ARQ_QUEUE": q.name, "NO_COLOR": "1"}
    ran = subprocess.run(
        [sys.executable, str(root / "examples" / "arq_worker.py")],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert "invoice 4 total: 5000 cents" in ran.stdout
    assert "invoice 9: mailed receipt 9-1; card charged 1 time(s)" in ran.stdout
    assert "tickets: " in ran.stdout
    assert "billing: total_cents renamed to amount_due_cents" in ran.stdout.split("tickets: ")[1]


# ------------------------------------------------------------------------------ killed worker


def test_a_job_whose_worker_is_killed_mid_recovery_is_tried_again_without_a_second_charge(
    q: Queue, tmp_path: Any
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.fleet.support import clean

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ, "ARQ_TEST_REDIS_URL": q.url, "ARQ_TEST_QUEUE": q.name,
        "ARQ_TEST_NS": q.name, "ARQ_TEST_DIR": str(tmp_path), "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)]),
    }  # fmt: skip
    command = [sys.executable, "-m", "tests.integrations.arq_procs"]

    async def enqueue() -> str:
        pool = await q.pool()
        try:
            return (await q.enqueue(pool, "pay", 7)).job_id
        finally:
            await pool.aclose()

    async def outcome(job_id: str) -> Any:
        pool = await q.pool()
        try:
            return await Job(job_id, pool).result_info()
        finally:
            await pool.aclose()

    job_id = run(enqueue())
    try:
        first = subprocess.Popen(
            [*command, "1"], env=env, cwd=root, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (tmp_path / "recovering").exists():
                assert first.poll() is None, first.stderr.read().decode()[-4000:]  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "worker 1 never began a recovery"
                time.sleep(0.1)
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate(timeout=30)
        assert (tmp_path / "charges").read_text().split() == ["7"]

        # arq sees the job abandoned once its in-progress key expires, and runs it again.
        second = subprocess.run(
            [*command, "2"], env=env, cwd=root, capture_output=True, text=True, timeout=240
        )
        assert second.returncode == 0, second.stderr[-4000:]
        info = run(outcome(job_id))
        assert (info.success, info.result, info.job_try) == (True, "ch_1 mailed", 2)
        assert (tmp_path / "charges").read_text().split() == ["7"]  # charged once
        assert "effect.replayed" in second.stdout + second.stderr
    finally:
        clean(q.url, q.name)


def test_the_jobs_timeout_cuts_a_recovery_short_as_it_would_the_job(q: Queue) -> None:
    # The recovery runs inside the job: arq's timeout cancels it, and the job fails with arq's
    # TimeoutError, as one that ran out of time; the cancellation is never caught.
    model = script(exec_python("import asyncio\nawait asyncio.sleep(120)"), done("too late"))
    settings = q.settings([func(fails, timeout=3)])
    install(settings, CrashOverride(model=model))

    async def main() -> Any:
        pool = await q.pool()
        try:
            job = await q.enqueue(pool, "fails")
            with capture_logs() as logs:
                worker = await burst(settings)
            assert (worker.jobs_failed, worker.jobs_complete) == (1, 0)
            return await job.result_info(), logs
        finally:
            await pool.aclose()

    info, logs = run(main())
    assert (info.success, type(info.result), info.job_try) == (False, TimeoutError, 1)
    assert "recovery.cancelled" in [e["event"] for e in logs]


def test_without_arq_the_import_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    for name in [n for n in sys.modules if n == "arq" or n.startswith("arq.")]:
        monkeypatch.setitem(sys.modules, name, None)  # what an absent package looks like
    monkeypatch.setitem(sys.modules, "arq", None)
    monkeypatch.delitem(sys.modules, "crashoverride.integrations.arq")
    with pytest.raises(ImportError, match=r"pip install 'crashoverride\[arq\]'"):
        importlib.import_module("crashoverride.integrations.arq")


CRON_SEEN: list[Any] = []


@recovered("Return the number of rows synced.")
async def nightly_sync(ctx: dict[str, Any]) -> int:
    raise KeyError("rows")


def test_a_cron_jobs_decorated_coroutine_is_recovered_with_installs_instance(q: Queue) -> None:
    from arq.cron import cron

    CRON_SEEN.clear()
    model = script(
        exec_python(
            "import tests.integrations.test_arq as t\nt.CRON_SEEN.append(job['id'])\nset_result(5)"
        ),
        done("synced 5"),
    )
    # At startup, then next New Year's midnight: one run in this burst.
    once = cron(nightly_sync, run_at_startup=True, month=1, day=1, hour=0, minute=0, second=0)
    settings = q.settings([succeeds], cron_jobs=[once])
    install(settings, CrashOverride(model=model))  # cron_jobs untouched; ctx has the instance
    run(burst(settings))
    assert len(CRON_SEEN) == 1 and str(CRON_SEEN[0]).startswith("cron:nightly_sync")
    assert len(model.calls) == 2
