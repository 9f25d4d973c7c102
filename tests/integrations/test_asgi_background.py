"""Failures after the response: background tasks (recovered) and streams (repaired, opt-in).

A real uvicorn server and a real HTTP client; only the model is scripted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import httpx
import pytest
from starlette.background import BackgroundTask, BackgroundTasks

from crashoverride import ConfigurationError, CrashOverride, RecoveryReport
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.integrations.asgi._after import BackgroundRecovery, locate, task_names
from crashoverride.testing import Script, done, exec_python, give_up, script, tool_outputs
from tests.helpers import wait_for
from tests.integrations import background_apps
from tests.integrations.asgi_support import first_input, named, serve

REPAIR = """
def mail_host():
    return CONFIG["mail_host"]
globals()["mail_host"] = mail_host
"""
RERUN = REPAIR + "rerun()"
QUOTA_RERUN = """
def daily_quota():
    return QUOTAS["per_day"]
globals()["daily_quota"] = daily_quota
rerun()
"""
EMAIL = "ann@example.test"


@pytest.fixture(autouse=True)
def probe(monkeypatch: pytest.MonkeyPatch) -> background_apps.Probe:
    # Agents patch ``mail_host`` in the app module: put the broken one back after each test.
    monkeypatch.setattr(background_apps, "mail_host", background_apps.mail_host)
    monkeypatch.setattr(background_apps, "daily_quota", background_apps.daily_quota)
    fresh = background_apps.Probe()
    monkeypatch.setattr(background_apps, "PROBE", fresh)
    return fresh


def recovery_events(logs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if e["event"].startswith("recovery.")]


def server_errors(caplog: pytest.LogCaptureFixture) -> list[BaseException]:
    """Exceptions uvicorn logged as 'Exception in ASGI application'."""
    return [
        r.exc_info[1]
        for r in caplog.records
        if r.name == "uvicorn.error" and r.exc_info and r.exc_info[1] is not None
    ]


@pytest.mark.parametrize("path", ["/signup", "/asignup"])
def test_failed_background_task_is_rerun_and_the_rest_run_in_order(
    path: str,
    probe: background_apps.Probe,
    logs: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = script(
        exec_python("function.__qualname__, args, kwargs"),
        exec_python(RERUN),
        done("mail_host reads 'mail_host' now; re-ran the welcome mail"),
    )
    app = background_apps.fastapi_app(crash_override=CrashOverride(model=model))
    with caplog.at_level(logging.ERROR), serve(app) as server:
        response = httpx.post(server.url + path, params={"email": EMAIL}, timeout=30)
        assert (response.status_code, response.json()) == (200, {"queued": EMAIL})
        assert probe.ran == []  # the client got its answer before any background task ran
        probe.release.set()
        assert probe.done.wait(30)
    assert probe.ran == [
        f"audit {EMAIL}",
        f"welcome {EMAIL} via smtp.example.test: Welcome!",
        f"count {EMAIL}",
    ]
    assert model.remaining_steps == 0
    name = "asend_welcome" if path == "/asignup" else "send_welcome"
    assert tool_outputs(model)[0] == f"('{name}', ('{EMAIL}',), {{'subject': 'Welcome!'}})"
    # The task's name and the ones queued after it are values: fenced, under their labels.
    assert f'source="task">\n{name}\n' in first_input(model)
    assert "count_signup" in first_input(model)  # the agent is told what waits behind it
    assert recovery_events(logs)[0] == "recovery.started"
    assert recovery_events(logs)[-1] == "recovery.succeeded"
    [started] = named(logs, "recovery.started")
    [succeeded] = named(logs, "recovery.succeeded")
    for event in (started, succeeded):
        assert (event["method"], event["path"]) == ("POST", path)
        assert event["background_task"] == name
        assert event["remaining_tasks"] == ["count_signup"]
    assert not named(logs, "recovery.skipped")
    assert server_errors(caplog) == []  # nothing propagated: the server logged no error


def test_give_up_behaves_as_starlette_alone_and_names_the_dropped_tasks(
    probe: background_apps.Probe,
    logs: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def run(app: Any) -> tuple[list[str], list[BaseException]]:
        fresh = background_apps.Probe()
        monkeypatch.setattr(background_apps, "PROBE", fresh)
        caplog.clear()
        with caplog.at_level(logging.ERROR), serve(app) as server:
            response = httpx.post(server.url + "/signup", params={"email": EMAIL}, timeout=30)
            assert response.status_code == 200
            fresh.release.set()
            wait_for(lambda: server_errors(caplog))
        return fresh.ran, server_errors(caplog)

    model = script(give_up("no mail host is configured under any name I can verify"))
    protected_ran, [protected] = run(
        background_apps.fastapi_app(crash_override=CrashOverride(model=model))
    )
    alone_ran, [alone] = run(
        background_apps.fastapi_app(crash_override=CrashOverride(model=script()), exclude="/*")
    )
    assert protected_ran == alone_ran == [f"audit {EMAIL}"]  # the rest do not run
    assert type(protected) is type(alone) is KeyError
    assert protected.args == alone.args == ("smtp_host",)
    notes = getattr(protected, "__notes__", [])
    assert any("gave up: no mail host is configured" in note for note in notes)
    assert any("not run" in note and "count_signup" in note for note in notes)
    [failed] = named(logs, "recovery.failed")
    assert failed["remaining_tasks"] == ["count_signup"]
    assert failed["background_task"] == "send_welcome"
    assert model.remaining_steps == 0


@pytest.mark.parametrize("sync", [True, False])
def test_starlette_background_task_is_recovered(
    sync: bool, probe: background_apps.Probe, logs: list[dict[str, Any]]
) -> None:
    reports: list[RecoveryReport] = []
    model = script(exec_python(RERUN), done("re-ran it"))
    co = CrashOverride(model=model, on_recovery=reports.append)
    app = background_apps.starlette_app(crash_override=co)
    with serve(app) as server:
        params = {"email": EMAIL, **({"sync": "1"} if sync else {})}
        response = httpx.post(server.url + "/welcome", params=params, timeout=30)
        assert response.text == "queued"
        wait_for(lambda: reports)
    assert probe.ran == [f"welcome {EMAIL} via smtp.example.test: Hi"]
    [report] = reports
    assert report.outcome == "recovered"
    [succeeded] = named(logs, "recovery.succeeded")
    assert succeeded["remaining_tasks"] == []
    assert succeeded["background_task"] == ("send_welcome" if sync else "asend_welcome")


def test_starlette_background_tasks_run_on_after_the_recovery(
    probe: background_apps.Probe, logs: list[dict[str, Any]]
) -> None:
    model = script(exec_python(RERUN), done("re-ran it"))
    app = background_apps.starlette_app(crash_override=CrashOverride(model=model))
    with serve(app) as server:
        response = httpx.post(server.url + "/welcome-many", params={"email": EMAIL}, timeout=30)
        assert (response.text, probe.ran) == ("queued", [])
        probe.release.set()
        assert probe.done.wait(30)
    assert probe.ran == [
        f"audit {EMAIL}",
        f"welcome {EMAIL} via smtp.example.test: Hi",
        f"count {EMAIL}",
    ]
    assert recovery_events(logs).count("recovery.started") == 1


def test_a_later_task_that_fails_too_is_recovered_in_its_turn(
    probe: background_apps.Probe, logs: list[dict[str, Any]]
) -> None:
    model = (
        Script(exec_python(RERUN), done("mail host repaired"))
        .run(exec_python(QUOTA_RERUN), done("quota repaired"))
        .model()
    )
    app = background_apps.starlette_app(crash_override=CrashOverride(model=model))
    with serve(app) as server:
        response = httpx.post(server.url + "/welcome-all", params={"email": EMAIL}, timeout=30)
        assert response.text == "queued"
        assert probe.done.wait(30)
    assert probe.ran == [
        f"welcome {EMAIL} via smtp.example.test: Hi",
        f"quota {EMAIL}: 3",
        f"count {EMAIL}",
    ]
    first, second = named(logs, "recovery.succeeded")
    assert (first["background_task"], first["remaining_tasks"]) == (
        "asend_welcome",
        ["check_quota", "count_signup"],
    )
    assert (second["background_task"], second["remaining_tasks"]) == (
        "check_quota",
        ["count_signup"],
    )
    assert model.remaining_steps == 0


def test_a_decorated_background_function_is_recovered_once(
    probe: background_apps.Probe,
    logs: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = script(give_up("no mail host I can verify"))
    co = CrashOverride(model=model)
    guarded = co.handler("Send the welcome mail once.")(background_apps.send_welcome)
    monkeypatch.setattr(background_apps, "send_welcome", guarded)
    app = background_apps.fastapi_app(crash_override=co)
    with caplog.at_level(logging.ERROR), serve(app) as server:
        httpx.post(server.url + "/signup", params={"email": EMAIL}, timeout=30)
        probe.release.set()
        wait_for(lambda: server_errors(caplog))
    # The decorator's recovery is the only one: the middleware lets its failure pass.
    assert recovery_events(logs) == ["recovery.started", "recovery.tool_called", "recovery.failed"]
    [error] = server_errors(caplog)
    assert any("count_signup" in note for note in error.__notes__)
    assert probe.ran == [f"audit {EMAIL}"]


def test_raise_instead_replaces_the_background_failure(
    probe: background_apps.Probe, caplog: pytest.LogCaptureFixture
) -> None:
    model = script(exec_python("raise_instead(RuntimeError('the mail relay is down'))"))
    app = background_apps.fastapi_app(crash_override=CrashOverride(model=model))
    with caplog.at_level(logging.ERROR), serve(app) as server:
        httpx.post(server.url + "/asignup", params={"email": EMAIL}, timeout=30)
        probe.release.set()
        wait_for(lambda: server_errors(caplog))
    [error] = server_errors(caplog)
    assert isinstance(error, RuntimeError) and isinstance(error.__cause__, KeyError)
    assert probe.ran == [f"audit {EMAIL}"]  # the rest do not run


def _noop_a() -> None:
    pass


async def _noop_b() -> None:
    pass


def _boom() -> None:
    raise LookupError("boom")


@pytest.mark.anyio
async def test_locate_follows_nested_groups(anyio_backend: str) -> None:
    leaf = BackgroundTask(_boom)
    inner = BackgroundTasks([BackgroundTask(_noop_a), leaf, BackgroundTask(_noop_b)])
    outer = BackgroundTasks([inner, BackgroundTask(_noop_a)])
    with pytest.raises(LookupError) as info:
        await outer()
    queued = locate(info.value)
    assert queued is not None and queued.task is leaf
    # The rest of the inner group first, then the rest of the outer one.
    assert task_names(queued.after) == ["_noop_b", "_noop_a"]


@pytest.mark.anyio
async def test_locate_guesses_nothing(anyio_backend: str) -> None:
    leaf = BackgroundTask(_boom)
    twice = BackgroundTasks([leaf, BackgroundTask(_noop_a), leaf])
    with pytest.raises(LookupError) as info:
        await twice()
    assert locate(info.value) is None  # which of the two failed is unknowable
    with pytest.raises(LookupError) as info:
        _boom()
    assert locate(info.value) is None  # not raised in a background task at all


def test_stream_failure_repaired_for_later_requests_when_opted_in(
    logs: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    reports: list[RecoveryReport] = []
    model = script(
        exec_python(REPAIR + "r = await replay_request()\nr.status, r.text"),
        done("mail_host repaired; a replay streams the whole digest"),
    )
    co = CrashOverride(model=model, on_recovery=reports.append)
    app = background_apps.starlette_app(crash_override=co, repair_after_start=True)
    with caplog.at_level(logging.ERROR), serve(app) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            with client.stream("GET", "/digest") as response:
                assert response.status_code == 200
                with pytest.raises(httpx.RemoteProtocolError):  # still truncated, as before
                    b"".join(response.iter_bytes())
            later = client.get("/digest")
    assert (later.status_code, later.text) == (200, "digest for\nhost smtp.example.test\n")
    assert model.remaining_steps == 0  # the later request needed no recovery
    assert "(200, 'digest for\\nhost smtp.example.test\\n')" in tool_outputs(model)[0]
    assert "already started" in first_input(model)
    assert recovery_events(logs) == ["recovery.started", "recovery.tool_called",
                                     "recovery.repaired"]  # fmt: skip
    [report] = reports
    assert (report.outcome, report.recovered) == ("repaired", False)
    [error] = server_errors(caplog)  # the failed response itself is still a failure
    assert isinstance(error, KeyError)
    assert any(f"{report.recovery_id} repaired" in note for note in error.__notes__)


def test_concurrent_stream_failures_share_one_repair(logs: list[dict[str, Any]]) -> None:
    model = script(
        exec_python(f"await PROBE.wait_for_failures(2)\n{REPAIR}(await replay_request()).status"),
        done("repaired once for both"),
    )
    app = background_apps.starlette_app(
        crash_override=CrashOverride(model=model), repair_after_start=True
    )

    async def both(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def one() -> None:
                async with client.stream("GET", "/digest") as response:
                    with pytest.raises(httpx.RemoteProtocolError):
                        await response.aread()

            await asyncio.gather(one(), one())

    with serve(app) as server:
        asyncio.run(both(server.url))
    assert len(named(logs, "recovery.started")) == 1
    # The waiter learns the code is repaired from the leader; nothing is replayed for it.
    assert sorted(e["via"] for e in named(logs, "recovery.repaired")) == ["agent", "replay"]
    assert model.remaining_steps == 0


def test_stream_failure_by_default_is_only_logged(logs: list[dict[str, Any]]) -> None:
    model = script()
    app = background_apps.starlette_app(crash_override=CrashOverride(model=model))
    with serve(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(2):
            with client.stream("GET", "/digest") as response:
                with pytest.raises(httpx.RemoteProtocolError):
                    b"".join(response.iter_bytes())
    assert model.calls == ()
    assert recovery_events(logs) == ["recovery.skipped", "recovery.skipped"]
    assert "already started" in named(logs, "recovery.skipped")[0]["reason"]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_repair_after_start_must_be_a_bool(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="repair_after_start"):
        CrashOverrideMiddleware(
            background_apps.starlette_app,
            crash_override=CrashOverride(model=script()),
            repair_after_start=value,
        )


@pytest.mark.anyio
async def test_a_queued_partial_is_described_as_the_call_it_makes(anyio_backend: str) -> None:
    task = BackgroundTask(functools.partial(background_apps.send_welcome, EMAIL), subject="Hi")
    with pytest.raises(KeyError) as info:
        await task()
    queued = locate(info.value)
    assert queued is not None
    recovery = BackgroundRecovery(CrashOverride(model=script()).handler(), {"path": "/"})
    block = recovery._block(queued, info.value)
    assert block.bindings["function"] is background_apps.send_welcome
    assert (block.bindings["args"], block.bindings["kwargs"]) == ((EMAIL,), {"subject": "Hi"})
    assert block.globals is vars(background_apps)  # the agent works in the function's module
    assert block.fields["background_task"] == "send_welcome"
    block.release()
