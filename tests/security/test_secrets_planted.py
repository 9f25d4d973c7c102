"""Planted secrets never leave: every byte sent to a model, every event, report, note, cassette.

The model is a local OpenAI-compatible server (``MockServer``) reached through a recording
proxy (a second ``MockServer`` in recording mode), so the test sees the request bodies exactly as
the client sent them and the cassette exactly as it would be committed. The scripted model
plays a curious agent: it reads the environment, the settings, every local, the exception.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from structlog.testing import capture_logs

from crashoverride import CrashOverride, Redaction
from crashoverride.followups import ThreadRunner
from crashoverride.integrations.asgi import CrashOverrideMiddleware
from crashoverride.testing import (
    MockServer,
    Script,
    done,
    eval_python,
    exec_python,
    give_up,
    script,
)
from tests.integrations.asgi_support import serve
from tests.security.test_secrets import (
    ANTHROPIC,
    AWS_ID,
    GITHUB,
    GITLAB,
    GOOGLE,
    JWT,
    OPENAI,
    PEM,
    PEM_BODY,
    SLACK_BOT,
    SLACK_HOOK,
    SLACK_HOOK_PATH,
    STRIPE,
    Account,
    Database,
)

API_KEY = "local-apikey-Zx81Qw4Rt"  # no known format: masked because crashoverride holds it
ENV_DB_PASSWORD = "Env-Db-Pa55word"
GH_PAT = "opaque-personal-access-9f3Kq"  # no known format: masked by its variable's name
TENANT_PIN = "tenant-pin-7Hq2"  # only the application's Redaction knows this one
DICT_PASSWORD = "Dict-Pa55-nested"
DATACLASS_PASSWORD = "Dataclass-Pa55"
PYDANTIC_KEY = "pydantic-api-key-77Lm"
HOLDER_KEY = "holder-private-9Qz"
BEARER = "opaque-bearer-8Kd2Lp"
BASIC_USER_PASSWORD = "YWRtaW46czNjcjN0LXBhc3N3b3Jk"
VISIBLE_UUID = "550e8400-e29b-41d4-a716-446655440000"
VISIBLE_SHA = "2afae40f1c0e5e3b1c5f1d7a7e2c1b0a9f8e7d6c"

PLANTED = [
    GITHUB, OPENAI, AWS_ID, JWT, PEM_BODY, ANTHROPIC, GITLAB, GOOGLE, SLACK_BOT, SLACK_HOOK_PATH,
    STRIPE, API_KEY, ENV_DB_PASSWORD, GH_PAT, TENANT_PIN, DICT_PASSWORD, DATACLASS_PASSWORD,
    PYDANTIC_KEY, HOLDER_KEY, BEARER, BASIC_USER_PASSWORD,
]  # fmt: skip

CO: Any = None  # the application object, a module global as in most applications


class Holder:
    def __init__(self) -> None:
        self.private_key = HOLDER_KEY

    def __repr__(self) -> str:
        return f"Holder(private_key={self.private_key!r})"  # shows its secret


def leaks(text: str) -> list[str]:
    """The planted secrets (or a 12-character piece of one) present in ``text``."""
    return [secret for secret in PLANTED if secret in text or secret[:12] in text]


CURIOUS_AGENT = [
    exec_python("import os\ndict(os.environ)"),
    eval_python("dict(os.environ)"),  # ``os`` is bound in the session by the snippet above
    eval_python("os.environ"),
    exec_python(
        "from urllib.parse import urlsplit\n"
        "print(os.environ['DATABASE_URL'])\n"
        "print(os.environ['GH_PAT'], os.environ['AWS_ACCESS_KEY_ID'], os.environ['ALERTS'])\n"
        "urlsplit(os.environ['DATABASE_URL']).password"
    ),
    eval_python("CO._settings.api_key"),
    eval_python("vars(CO._settings)"),
    eval_python("[cfg, label, access, session, signing, tenant]"),
    exec_python("print(cfg)\nprint(signing)\nprint(headers)"),
    eval_python("config"),
    eval_python("config['db']['db_password'], db.password, account.api_key"),
    eval_python("(db, account, holder, headers)"),
    eval_python("str(error)"),
    eval_python("error"),
    eval_python(f"'{VISIBLE_UUID} {VISIBLE_SHA}'"),
    # Process state handed on by agent code: the follow-up's input and the report carry it.
    exec_python("spawn_followup('rotate the pin', os.environ['TENANT_LABEL'] + str(error))"),
    exec_python("give_up('the upstream refused: ' + str(error) + ' for ' + tenant)"),
    # The follow-up's run:
    exec_python("import os\nos.environ['TENANT_LABEL'], os.environ['GH_PAT']"),
    eval_python("report.exception"),
    done("ticket filed"),
]


def failing_block(co: CrashOverride) -> None:
    # Innocent names, secret values.
    cfg = f"token={GITHUB}"
    label = OPENAI
    access = AWS_ID
    session = JWT
    signing = PEM
    tenant = TENANT_PIN
    # Secret names one level down.
    config = {"db": {"db_password": DICT_PASSWORD}, "region": "eu-west-1"}
    db = Database("db.internal", DATACLASS_PASSWORD)
    account = Account(user="ada", api_key=PYDANTIC_KEY)
    holder = Holder()
    headers = {"Authorization": f"Bearer {BEARER}", "X-Other": f"Basic {BASIC_USER_PASSWORD}"}
    more = [GITLAB, GOOGLE, SLACK_BOT, STRIPE]
    trace_id = VISIBLE_UUID
    with co.handler(prompt="Store the upload."):
        raise ValueError(f"upstream rejected key {ANTHROPIC} for {trace_id}")
    del cfg, label, access, session, signing, tenant, config, db, account, holder, headers, more


def test_planted_secrets_never_leave(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    global CO
    monkeypatch.setenv("DATABASE_URL", f"postgresql://app:{ENV_DB_PASSWORD}@db:5432/app")
    monkeypatch.setenv("GH_PAT", GH_PAT)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_ID)
    monkeypatch.setenv("ALERTS", SLACK_HOOK)
    monkeypatch.setenv("TENANT_LABEL", TENANT_PIN)
    cassette = tmp_path / "cassette.json"
    reports: list[Any] = []
    runner = ThreadRunner(grace=10)
    with (
        MockServer(CURIOUS_AGENT) as model,
        MockServer(upstream=model.base_url, record_to=cassette) as proxy,
        capture_logs() as logs,
    ):
        CO = proxy.crash_override(
            api_key=API_KEY,
            model="scripted",
            on_recovery=reports.append,
            followup_runner=runner,
            redaction=Redaction(values=[TENANT_PIN]),
        )
        try:
            with pytest.raises(ValueError) as raised:
                failing_block(CO)
            assert runner.join(30) == []
        finally:
            CO = None
        model.assert_complete()
        sent = json.dumps([request.body for request in model.requests])
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    events = json.dumps(logs, default=str)
    assert len(model.requests) == len(CURIOUS_AGENT)  # the follow-up's turns included
    assert any(event["event"] == "followup.succeeded" for event in logs)
    assert leaks(sent) == []
    assert leaks(events) == []
    assert leaks(repr(reports)) == []
    assert leaks(notes) == []
    assert leaks(cassette.read_text()) == []
    # Not blind: masks are visible, and what is not secret still reaches the agent.
    assert sent.count("[REDACTED]") > 20
    for visible in ("eu-west-1", "db.internal", VISIBLE_UUID, VISIBLE_SHA, "postgresql://app:"):
        assert visible in sent


RECOVERING_AGENT = [
    exec_python("import os\ndict(os.environ)"),
    eval_python("[cfg, label, access, session, signing, tenant]"),
    eval_python("(config, db, account, holder, headers, more)"),
    eval_python("str(error)"),
    exec_python("caller['stored'] = True"),
    done("stored the upload"),
]


def recovered_block(co: CrashOverride) -> None:
    # As ``failing_block``, but the agent recovers: crashoverride itself reports it to Sentry.
    cfg = f"token={GITHUB}"
    label = OPENAI
    access = AWS_ID
    session = JWT
    signing = PEM
    tenant = TENANT_PIN
    config = {"db": {"db_password": DICT_PASSWORD}, "region": "eu-west-1"}
    db = Database("db.internal", DATACLASS_PASSWORD)
    account = Account(user="ada", api_key=PYDANTIC_KEY)
    holder = Holder()
    headers = {"Authorization": f"Bearer {BEARER}", "X-Other": f"Basic {BASIC_USER_PASSWORD}"}
    more = [GITLAB, GOOGLE, SLACK_BOT, STRIPE]
    stored = False
    with co.handler(prompt="Store the upload."):
        raise ValueError(f"upstream rejected key {ANTHROPIC} for {tenant} ({cfg}, {label})")
    assert stored
    del cfg, label, access, session, signing, tenant, config, db, account, holder, headers, more


def _telemetry() -> Any:
    from tests.observe import test_otel

    if test_otel._telemetry is None:  # the global providers can be set once per process
        test_otel._telemetry = test_otel.Telemetry()
    return test_otel._telemetry


def _exported(spans: list[Any]) -> str:
    """Every text OpenTelemetry was handed: names, attributes, events, statuses."""
    return json.dumps(
        [
            [span.name, dict(span.attributes), span.status.description]
            + [[event.name, dict(event.attributes)] for event in span.events]
            for span in spans
        ],
        default=str,
    )


def test_planted_secrets_never_reach_sentry_otel_the_ledger_or_show(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sentry_sdk

    from crashoverride import JsonLinesLedger
    from crashoverride._cli.main import main
    from tests.observe.test_sentry import Sent, _init

    monkeypatch.setenv("DATABASE_URL", f"postgresql://app:{ENV_DB_PASSWORD}@db:5432/app")
    monkeypatch.setenv("GH_PAT", GH_PAT)
    telemetry = _telemetry()
    ledger = tmp_path / "ledger.jsonl"
    reports: list[Any] = []
    write = JsonLinesLedger(ledger)
    sent = Sent()
    _init(sent, default_integrations=False)
    try:
        with MockServer(RECOVERING_AGENT) as model:
            co = model.crash_override(
                api_key=API_KEY,
                on_recovery=lambda report: (reports.append(report), write(report)),
                redaction=Redaction(values=[TENANT_PIN]),
            )
            with sentry_sdk.isolation_scope() as scope:
                scope.set_extra("upload", f"for {TENANT_PIN} with {GITHUB}")
                recovered_block(co)
            model.assert_complete()
    finally:
        sentry_sdk.get_global_scope().set_client(None)
    [report] = reports
    assert report.recovered
    [event] = sent.events()
    assert event["exception"]["values"][0]["value"].startswith("upstream rejected key [REDACTED]")
    assert leaks(sent.raw().decode(errors="replace")) == []  # the event, report and transcript
    [span] = [
        s
        for s in telemetry.spans.get_finished_spans()
        if s.attributes.get("crashoverride.recovery_id") == report.recovery_id
    ]
    spans = [
        s
        for s in telemetry.spans.get_finished_spans()
        if s.context.trace_id == span.context.trace_id
    ]
    assert len(spans) == 1 + len(RECOVERING_AGENT) - 1  # the recovery and each tool call
    assert leaks(_exported(spans)) == []
    assert leaks(ledger.read_text()) == []
    html = tmp_path / "show.html"
    assert main(["show", report.recovery_id, "--ledger", str(ledger)]) == 0
    assert main(["show", report.recovery_id, "--ledger", str(ledger), "--html", str(html)]) == 0
    shown = capsys.readouterr().out
    assert report.recovery_id in shown and "[REDACTED]" in shown
    assert leaks(shown) == [] and leaks(html.read_text()) == []


async def signup(request: Request) -> JSONResponse:
    body = await request.json()
    password = body["password"]
    credentials = {"refresh": body["refresh_token"]}
    raise RuntimeError(f"storage unavailable for {body['user']} ({len(password)}, {credentials})")


QUERY_TOKEN = "q9Lm2Rt5Vw8Yz1Ab"
FORM_PASSWORD = "Sunny-Day-42x"
REFRESH_TOKEN = "rt-opaque-9f3Kq2Lm8Zx"


@pytest.mark.slow
def test_request_secrets_never_leave() -> None:
    reports: list[Any] = []
    steps = [
        eval_python("request"),
        eval_python("request.query, request.json(), request.body"),
        eval_python("body, password, credentials"),
        eval_python("str(error)"),
        exec_python("respond(503, {'error': 'storage unavailable'})"),
        done(),
    ]
    with MockServer(steps) as model:
        co = model.crash_override(on_recovery=reports.append)
        app = Starlette(routes=[Route("/signup", signup, methods=["POST"])])
        app.add_middleware(CrashOverrideMiddleware, crash_override=co)
        with capture_logs() as logs, serve(app) as served:
            response = httpx.post(
                f"{served.url}/signup?access_token={QUERY_TOKEN}&page=2",
                json={"user": "ada", "password": FORM_PASSWORD, "refresh_token": REFRESH_TOKEN},
                timeout=60,
            )
        model.assert_complete()
        sent = json.dumps([request.body for request in model.requests])
    assert response.status_code == 503
    everything = sent + json.dumps(logs, default=str) + repr(reports)
    for secret in (QUERY_TOKEN, FORM_PASSWORD, REFRESH_TOKEN):
        assert secret not in everything
    # The brief and the request object keep what is not secret.
    assert "page=2" in sent and "access_token=[REDACTED]" in sent and "ada" in sent


def test_a_failed_replay_logs_no_secret() -> None:
    # The leader recovers; the waiter's replay raises again with a key in the message.
    model = (
        Script(exec_python("import time\ntime.sleep(0.5)\nset_result(1)"), done("recovered"))
        .run(give_up("still failing"))
        .model()
    )
    co = CrashOverride(model=model, timeout=30)

    @co.handler()
    def call_upstream() -> int:
        raise ValueError(f"upstream rejected key {ANTHROPIC}")

    outcomes: list[object] = []

    def run() -> None:
        try:
            outcomes.append(call_upstream())
        except ValueError as exc:
            outcomes.append(exc)

    with capture_logs() as logs:
        leader = threading.Thread(target=run)
        leader.start()
        anyio.run(anyio.sleep, 0.2)
        run()
        leader.join(30)
    replays = [event for event in logs if event["event"] == "recovery.replay_failed"]
    assert len(replays) == 1 and "ValueError" in replays[0]["error"]
    assert ANTHROPIC[:12] not in json.dumps(logs, default=str)
    notes = [n for o in outcomes if isinstance(o, ValueError) for n in o.__notes__]
    assert notes and ANTHROPIC[:12] not in "".join(notes)


def test_a_follow_up_job_carries_no_secret_to_its_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # A job may travel through a broker or a subprocess's arguments: masked before it leaves.
    monkeypatch.setenv("GH_PAT", GH_PAT)
    jobs: list[dict[str, Any]] = []

    class Queue:
        def submit_job(self, job: Any) -> str:
            jobs.append(job.to_payload())
            return str(job.id)

    model = script(
        exec_python("import os\nspawn_followup('rotate ' + tenant, os.environ['GH_PAT'] + cfg)"),
        give_up("needs a person"),
    )
    co = CrashOverride(
        model=model, followup_runner=Queue(), redaction=Redaction(values=[TENANT_PIN])
    )
    tenant, cfg = TENANT_PIN, f"token={GITHUB}"
    with pytest.raises(KeyError):
        with co.handler():
            raise KeyError(tenant + cfg)
    assert len(jobs) == 1
    assert leaks(json.dumps(jobs, default=str)) == []
