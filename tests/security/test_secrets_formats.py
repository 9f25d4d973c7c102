"""A secret written after a secret-looking name is masked whatever the format around it.

Issue 22 item 12: ``cfg = "token=ghp_..."`` and a ``.env`` line with a hex value reached the
model. The class is the one detect-secrets' keyword detector covers: a secret-looking name, a
separator and a value, in every syntax text takes (``name=value``, ``name: value``, JSON and
escaped JSON, YAML, headers, query strings, connection URLs, shell ``export``, subscripts,
comparisons, keyword arguments, byte reprs, header tuples, XML) and whatever the value looks
like (hex, base64, one long identifier, an opaque word with digits, a pass phrase). Checked on
the detector (every redactor uses it) and then on every channel a recovery has.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from crashoverride import CrashOverride
from crashoverride._security.redact import MASK, Redactor
from crashoverride.testing import MockServer, done, eval_python, exec_python, give_up, script

VALUES = {
    "hex": "fa3b9c1d2e3f4a5b6c7d8e9f0a1b2c3d",
    "base64": base64.b64encode(b"\x8a\x13random-bytes\xff\x01\x07").decode(),
    "identifier": "Zq8vW3xK9pL2mN7bQr4T",
    "opaque": "corp-7Q2mXk9Lp4Rt8Vw3Zb6N",
}

FORMATS = {
    "name=value": "token={v}",
    "name = value": "api_key = {v}",
    "name: value": "secret: {v}",
    "JSON": '{"client_secret": "{v}", "region": "eu"}',
    "JSON, camelCase": '{"accessToken":"{v}"}',
    "JSON inside JSON": json.dumps({"body": json.dumps({"password": "{v}"})}),
    "YAML": "db:\n  host: db.internal\n  password: {v}\n  port: 5432\n",
    "YAML, quoted": "db:\n  password: '{v}'\n",
    "INI": "[auth]\nclient_secret = {v}\n",
    "properties": "spring.datasource.password={v}",
    "TOML": 'secret_key = "{v}"',
    "X-Api-Key header": "X-Api-Key: {v}",
    "X-Auth-Token header in a command": "curl -H 'X-Auth-Token: {v}' https://api.example.com",
    "Authorization: Bearer": "Authorization: Bearer {v}",
    "Authorization, another scheme": "Authorization: ApiKey {v}",
    "Authorization: Token token=": "Authorization: Token token={v}",
    "headers dict repr": "{'authorization': 'Bearer {v}', 'accept': '*/*'}",
    "ASGI header tuples": "[(b'host', b'api'), (b'x-api-key', b'{v}')]",
    "bytes repr": "b'password={v}'",
    "bytes dict repr": "{b'api_key': b'{v}'}",
    "query string": "https://api.example.com/v1?api_key={v}&page=2",
    "request line": "GET /items?page=2&access_token={v} HTTP/1.1",
    "cookie": "Cookie: sessionid={v}; theme=dark",
    "connection URL": "postgres://app:{v}@db.internal:5432/app",
    "connection URL, no user": "redis://:{v}@cache:6379/0",
    "export": "export GITHUB_TOKEN={v}",
    "export, quoted": 'export AWS_SECRET_ACCESS_KEY="{v}"',
    "command-line flag": "mysql -u root --password={v} app",
    "command-line flag and word": "deploy --api-key {v} --region eu",
    "connection string": "Server=db;Database=app;User Id=app;Password={v};",
    "camelCase key": '{"accountKey": "{v}", "accountName": "app"}',
    "privkey": "privkey: {v}",
    "db_pass": "db_pass={v}",
    "env var before a command": "PGPASSWORD={v} psql -h db",
    ".env text": "REGION=eu\nDB_PASSWORD={v}\nDEBUG=1\n",
    ".env text, repr": repr("REGION=eu\nSTRIPE_KEY={v}\nDEBUG=1\n"),
    "subscript": 'os.environ["GITHUB_TOKEN"] = "{v}"',
    "subscript, single quotes": "config['api_key'] = '{v}'",
    "keyword argument": 'connect(host="db", password="{v}")',
    "keyword argument, key": 'Client(api_key="{v}")',
    "comparison": 'if password == "{v}":',
    "walrus": 'if (token := "{v}"):',
    "XML": "<settings><password>{v}</password></settings>",
    "URL in a DSN": "SENTRY_DSN=https://{v}@o1.ingest.sentry.io/1",
}

CASES = {
    f"{fmt} / {shape}": (template.replace("{v}", value), value)
    for fmt, template in FORMATS.items()
    for shape, value in VALUES.items()
    # A base64 value holds ``/``, which a URL's password cannot (it would end the host).
    if not (shape == "base64" and "://" in template)
}
PASS_PHRASE = "correct horse battery staple"
CASES.update(
    {
        "pass phrase, JSON": (json.dumps({"password": PASS_PHRASE}), PASS_PHRASE),
        "pass phrase, .env": (f'DB_PASSWORD="{PASS_PHRASE}"', PASS_PHRASE),
        "pass phrase, YAML": (f"password: '{PASS_PHRASE}'", PASS_PHRASE),
        "password holding a quote": ("""{"password": "it's-Me-42"}""", "it's-Me-42"),
        "URL password holding @": ("postgres://app:p@ss-W0rd9x@db/app", "ss-W0rd9x"),
        "short value, env style": ("PRIVATE_KEY=hunter2x", "hunter2x"),
        "short value, header": ("X-Api-Key: hunter2x", "hunter2x"),
        "short value, export": ("export GITHUB_TOKEN=hunter2x", "hunter2x"),
        "short value, flag": ("deploy --token=hunter2x", "hunter2x"),
        "short value, Authorization": ("Authorization: ApiKey hunter2x", "hunter2x"),
        "word, connection string": ("Server=db;Password=sunshine;", "sunshine"),
        "word, .env": ("DB_PASSWORD=sunshine", "sunshine"),
        "word, flag": ("psql --password=sunshine", "sunshine"),
    }
)


@pytest.mark.parametrize(("text", "secret"), list(CASES.values()), ids=list(CASES))
def test_a_secret_after_a_secret_name_is_masked_in_every_format(text: str, secret: str) -> None:
    masked = Redactor()(text)
    assert secret not in masked and secret[:8] not in masked, masked
    assert MASK in masked


ORDINARY = [
    # Code that names a secret without holding one.
    "password = get_password()",
    "token = self.tokens[0]",
    'api_key = os.environ["API_KEY"]',
    "SECRET_KEY = settings.SECRET_KEY",
    "if password == confirm_password:",
    "authorization = request.headers.get('Authorization')",
    "authorization: str | None = None",
    'headers = {"Authorization": f"Bearer {token}"}',
    'os.environ["GITHUB_TOKEN"] = token',
    "fields = ('user', 'email', 'created_at')",
    "token_type: bearer",
    "expires_in=3600",
    "usage: deploy --password PASSWORD --api-key-file /etc/app/key --token $DEPLOY_TOKEN",
    '{"tokenType": "Bearer", "eventKey": "Enter", "sortKey": "created_at"}',
    "x = {'hashKey': 'user_id', 'rangeKey': 'created_at'}",
    # Templates and placeholders.
    'password: "${DB_PASSWORD}"',
    "DB_PASSWORD={{ vault_db_password }}",
    "api_key=<your-api-key>",
    'password = "%s"',
    "<password>${env.PASSWORD}</password>",
    # Prose and identifiers.
    "Authorization: see the API docs",
    "request 550e8400-e29b-41d4-a716-446655440000 failed",
    "commit 2afae40f1c0e5e3b1c5f1d7a7e2c1b0a9f8e7d6c",
    "<title>Reset your password</title>",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_code_templates_and_prose_around_secret_names_are_left_alone(text: str) -> None:
    assert Redactor()(text) == text


# -- every channel ------------------------------------------------------------------------------


def _value(name: str, shape: str) -> str:
    """A value of ``shape`` unique to the format ``name``: a leak names its format."""
    digest = hashlib.sha1(name.encode()).hexdigest()
    mixed = "".join(c.upper() if i % 3 == 0 else c for i, c in enumerate(digest))
    return {
        "hex": digest[:32],
        "base64": base64.b64encode(bytes.fromhex(digest[:30]) + b"\xfb\xef").decode(),
        "identifier": "Qx" + mixed[:18],
        "opaque": "corp-" + mixed[:20],
    }[shape]


def _planted_text() -> tuple[str, list[str]]:
    lines, values = [], []
    for index, (name, template) in enumerate(FORMATS.items()):
        shape = list(VALUES)[index % len(VALUES)]
        value = _value(name, "hex" if "://" in template else shape)
        lines.append(template.replace("{v}", value))
        values.append(value)
    lines.append(f'DB_PASSWORD="{PASS_PHRASE}"')
    lines.append(repr("REGION=eu\nPRIVATE_KEY=hunter2x\nDEBUG=1\n"))
    return "\n".join(lines), [*values, PASS_PHRASE, "hunter2x"]


BLOB, BLOB_SECRETS = _planted_text()
CALLEE_PASSWORD = "Callee-Pw-8812-Qq"  # only a callee frame's local knows it


def _leaks(text: str) -> list[str]:
    return [secret for secret in [*BLOB_SECRETS, CALLEE_PASSWORD] if secret in text]


def _connect(password: str) -> None:
    # A callee frame: its secret-named local is what its message quotes.
    raise ConnectionError(f"authentication failed using {password!r}")


def _load(blob: str) -> None:
    # The configuration text reaches the exception chain: the cause quotes one of its lines,
    # and the cause's context quotes the password a callee frame held.
    try:
        try:
            _connect(CALLEE_PASSWORD)
        except ConnectionError:
            raise LookupError(blob.splitlines()[-3]) from None
    except LookupError as exc:
        raise ValueError(f"bad configuration line {blob.splitlines()[0]!r}") from exc


# What a curious model does with a configuration text held by an innocently named local.
READER = [
    exec_python("print(blob)"),  # multi-line stdout: .env, YAML, headers, JSON...
    eval_python("blob"),
    eval_python("blob.encode()"),  # one line of escapes
    eval_python("blob.splitlines()"),
    exec_python("import json\nprint(json.dumps({'config': blob}))"),  # JSON inside JSON
    eval_python("str(error.__cause__), str(error.__cause__.__context__)"),
    exec_python(f"probe = {BLOB.splitlines()[1]!r}"),  # a secret in the agent's own code
]


def _told(requests: list[Any]) -> str:
    """What the requests told the model: its own earlier turns, replayed, it knows already."""
    return json.dumps(
        [
            [m for m in request.body["messages"] if m.get("role") != "assistant"]
            for request in requests
        ]
    )


def test_a_configuration_text_never_leaves_through_any_channel(tmp_path: Path) -> None:
    from crashoverride import JsonLinesLedger

    reports: list[Any] = []
    ledger = tmp_path / "ledger.jsonl"
    write = JsonLinesLedger(ledger)
    steps = [*READER, give_up("cannot load: " + " | ".join(BLOB.splitlines()[2:6]))]
    with MockServer(steps) as model, capture_logs() as logs:
        co = model.crash_override(on_recovery=lambda r: (reports.append(r), write(r)))
        blob = BLOB
        with pytest.raises(ValueError) as raised, co.handler(prompt="Load the configuration."):
            _load(blob)
        model.assert_complete()
        sent = _told(model.requests)
    [report] = reports
    assert len(model.requests) == len(steps) and len(report.tool_calls) == len(steps)
    assert _leaks(sent) == []
    assert _leaks(repr(report)) == [] and _leaks(repr(report.tool_calls)) == []
    assert _leaks(json.dumps(logs, default=str)) == []
    assert _leaks("\n".join(raised.value.__notes__)) == []
    assert _leaks(ledger.read_text()) == []
    # Not blind: the names, the formats' other parts and what is not secret stay readable.
    for visible in ("GITHUB_TOKEN=", "X-Api-Key: ", "db.internal", "REGION=eu", "DEBUG=1"):
        assert visible in sent


def test_a_configuration_text_never_reaches_sentry_or_opentelemetry(tmp_path: Path) -> None:
    import sentry_sdk

    from tests.observe.test_sentry import Sent, _init
    from tests.security.test_secrets_planted import _exported, _telemetry

    telemetry = _telemetry()
    sent = Sent()
    _init(sent, default_integrations=False)
    reports: list[Any] = []
    try:
        with MockServer([*READER, exec_python("caller['loaded'] = True"), done()]) as model:
            co = model.crash_override(on_recovery=reports.append)
            blob = BLOB
            loaded = False
            with sentry_sdk.isolation_scope() as scope:
                scope.set_extra("config", blob)
                with co.handler(prompt="Load the configuration."):
                    _load(blob)
            model.assert_complete()
    finally:
        sentry_sdk.get_global_scope().set_client(None)
    [report] = reports
    assert report.recovered and loaded
    assert _leaks(sent.raw().decode(errors="replace")) == []
    [span] = [
        s
        for s in telemetry.spans.get_finished_spans()
        if s.attributes.get("crashoverride.recovery_id") == report.recovery_id
    ]
    assert _leaks(_exported(telemetry.trace_of(span.context.trace_id))) == []


class _Settings:
    """An object whose repr shows its key: Sentry serialises it after every event processor."""

    def __init__(self, key: str) -> None:
        self.api_key = key

    def __repr__(self) -> str:
        return f"Settings(api_key={self.api_key!r})"


def test_the_sentry_event_of_a_recovered_exception_is_redacted_as_sent() -> None:
    # Issue 22 item 13: the event is built from the live exception and the scope's data;
    # what goes out is the serialised event, every part of which passes the redactor:
    # chained messages, frame variables, extras, contexts and breadcrumbs, bytes and objects.
    import sentry_sdk

    from tests.observe.test_sentry import Sent, _init

    openai_key = "sk-proj-" + "Qw3rTy7uIo9pAs2dFg4hJk6l"
    db_password = "Db-Pa55-w0rd-XyZ"
    extra_secret, object_secret, crumb_secret, context_secret = (
        "Bytes-Secret-7781-Zz", "Obj-Secret-9931-Kk", "Crumb-Tok-5561-Mm", "Ctx-Api-4471-Jj",
    )  # fmt: skip
    planted = [openai_key, db_password, CALLEE_PASSWORD, extra_secret, object_secret]
    planted += [crumb_secret, context_secret]
    sent = Sent()
    _init(sent)  # the default integrations too (logging breadcrumbs, argv...)
    co = CrashOverride(model=script(exec_python("caller['ok'] = True"), done("ok")))
    try:
        with sentry_sdk.isolation_scope() as scope:
            scope.set_extra("raw", f"password={extra_secret}".encode())
            scope.set_extra("settings", _Settings(object_secret))
            scope.set_context("upstream", {"x-api-key": context_secret.encode(), "region": "eu"})
            sentry_sdk.add_breadcrumb(
                message="login", data={"payload": f"token={crumb_secret}".encode()}
            )
            ok = False
            with co.handler():
                try:
                    try:
                        _connect(CALLEE_PASSWORD)
                    except ConnectionError:
                        raise RuntimeError(
                            f"db at postgres://app:{db_password}@db:5432/app refused {openai_key}"
                        ) from None
                except RuntimeError as exc:
                    raise KeyError("config") from exc
    finally:
        sentry_sdk.get_global_scope().set_client(None)
    assert ok
    raw = sent.raw().decode(errors="replace")
    assert [secret for secret in planted if secret in raw] == []
    # Not blind: the event still says what happened.
    [event] = sent.events()
    values = [value["value"] for value in event["exception"]["values"]]
    assert "db at postgres://app:[REDACTED]@db:5432/app refused [REDACTED]" in values
    assert event["extra"]["raw"] and event["contexts"]["upstream"]["region"] == "eu"
