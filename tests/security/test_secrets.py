"""Secrets are recognised by their value, and by secret names at any depth inside values."""

from __future__ import annotations

import dataclasses
import json
import os
import types
from pathlib import Path
from typing import Any, NamedTuple

import pydantic
import pytest

from crashoverride import Redaction
from crashoverride._security import secrets
from crashoverride._security.masking import secret_values
from crashoverride._security.redact import MASK, Redactor
from crashoverride._security.secrets import is_secret_name, mask
from crashoverride._security.text import render_value, summarize_locals

# Planted values: realistic shapes, made up. Each must disappear wherever it appears.
GITHUB = "ghp_" + "R8x2Lq9ZtV4mN7cB1kD5fG3hJ6sA0pW2eY8u"
GITHUB_FINE = "github_pat_11AB3CDEF0" + "gH4iJ5kL6mN7oP8qR9sT0uV1wX2yZ3aB4cD5eF6"
OPENAI = "sk-proj-" + "Vd93kLmQ2xT7bN4cR8sJ1hG6fP0aZ5wY_e2uK9oI3"
OPENAI_LEGACY = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0u1V2w3X4"
ANTHROPIC = "sk-ant-api03-" + "Qw7Er9Ty1Ui3Op5As7Df9Gh1Jk3Lz5Xc7Vb9Nm1Qw3Er5"
GITLAB = "glpat-" + "x7Yk2Lm9Pq4Rs8Tv1Wz3A"
SLACK_BOT = "xoxb-" + "2849571034-8472910384756-Ab3dE7gH1jK5mN9pQ2sT6vX"
SLACK_HOOK_PATH = "T024BE7LD/B01ABCD2EF3/" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2"
SLACK_HOOK = "https://hooks.slack.com/services/" + SLACK_HOOK_PATH
STRIPE = "sk_live_" + "51Hx7Lm2Kq9Rt4Vw8Yz3Ab6Cd"
STRIPE_RESTRICTED = "rk_live_" + "51Hx7Lm2Kq9Rt4Vw8Yz3Ab6Ef"
AWS_ID = "AKIA" + "Q3EXAMPLE7TOKN2Z"
AWS_SESSION_ID = "ASIA" + "Y7EXAMPLE4SESS9Q"
GOOGLE = "AIza" + "SyB3x9Kq7Lm2Rt5Vw8Yz1Ab4Cd6Ef0Gh3Ij"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiJ1c2VyLTQyIiwibmFtZSI6IkFkYSIsImlhdCI6MTUxNjIzOTAyMn0."
    "4Xq9Lm2Rt5Vw8Yz1Ab4Cd6Ef0Gh3Ij7Kl9Mn2Op5Qr"
)
PEM_BODY = "MIIEowIBAAKCAQEAx8Lm2Rt5Vw8Yz1Ab4Cd6Ef0Gh3Ij7Kl9Mn2Op5Qr3St6Uv9Wx"
PEM = (
    f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n{PEM_BODY[::-1]}\n"
    "-----END RSA PRIVATE KEY-----\n"
)
DB_PASSWORD = "Tr0ub4dor-and-3"
BASIC = "YWRtaW46czNjcjN0LXBhc3N3b3Jk"  # admin:s3cr3t-password


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f'cfg = "token={GITHUB}"', GITHUB),
        (f"token: {GITHUB_FINE}", GITHUB_FINE),
        (f"OPENAI={OPENAI}", OPENAI),
        (f"legacy key {OPENAI_LEGACY} expired", OPENAI_LEGACY),
        (f"x-api-key: {ANTHROPIC}", ANTHROPIC),
        (f"clone with {GITLAB}", GITLAB),
        (f"slack {SLACK_BOT}", SLACK_BOT),
        (f"post to {SLACK_HOOK}", SLACK_HOOK_PATH),
        (f"stripe.api_key = '{STRIPE}'", STRIPE),
        (f"restricted {STRIPE_RESTRICTED}", STRIPE_RESTRICTED),
        (f"aws {AWS_ID} and {AWS_SESSION_ID}", AWS_ID),
        (f"aws {AWS_ID} and {AWS_SESSION_ID}", AWS_SESSION_ID),
        (f"maps {GOOGLE}", GOOGLE),
        (f"ValueError: bad signature in {JWT}", JWT),
        (PEM, PEM_BODY),
        (repr(PEM), PEM_BODY),
        (f"postgres://app:{DB_PASSWORD}@db.internal:5432/app", DB_PASSWORD),
        ("Authorization: Bearer opaque-7f3Kq9Lm2Rt5Vw8Y", "opaque-7f3Kq9Lm2Rt5Vw8Y"),
        (f"Authorization: Basic {BASIC}", BASIC),
        ("GET /items?access_token=q9Lm2Rt5Vw8Yz1Ab&page=2", "q9Lm2Rt5Vw8Yz1Ab"),
        ("user=ada&password=correcthorse", "correcthorse"),
        ('{"password": "hunter22", "user": "ada"}', "hunter22"),
        ("{'db_password': 'hunter22'}", "hunter22"),
        ('"refresh_token": "def50200a1b2c3d4e5f6a7b8"', "def50200a1b2c3d4e5f6a7b8"),
        ("client_secret: 'abc'", "abc"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ],
)
def test_secret_values_are_masked(text: str, secret: str) -> None:
    masked = mask(text, MASK)
    assert secret not in masked
    assert MASK in masked


@pytest.mark.parametrize(
    "text",
    [
        "request 550e8400-e29b-41d4-a716-446655440000 failed",
        "commit 2afae40f1c0e5e3b1c5f1d7a7e2c1b0a9f8e7d6c (2afae40)",
        "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "password = get_password()",
        "connect(user=user, password=password)",
        "password=self.settings.password",
        "max_tokens=4000, token_type: 'bearer', tokens: 12",
        "Basic authentication is required; a Bearer token authenticates the client",
        "https://example.com/path?page=2&sort=name",
        "https://user@example.com/repo.git",
        "the key is in the vault",
        "secret_name = 'prod-db'",  # ``_name``: what the secret is called, not the secret
        "api_key_path: /etc/app/key.pem",
        "[REDACTED] already masked: token=[REDACTED]",
        "sk-learn and desk-top and risk-averse",
    ],
)
def test_ordinary_values_are_left_alone(text: str) -> None:
    assert mask(text, MASK) == text


@pytest.mark.parametrize("name", ["GH_PAT", "AWS_ACCESS_KEY_ID", "db_pwd", "X_AUTH", "dsn"])
def test_more_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["max_tokens", "token_type", "api_key_path", "secret_name", "PWD", "idempotency_key"],
)
def test_names_of_counts_kinds_and_places_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


@dataclasses.dataclass
class Database:
    host: str
    password: str


class Account(pydantic.BaseModel):
    user: str
    api_key: str


class Login(NamedTuple):
    user: str
    token: str


class Holder:
    def __init__(self) -> None:
        self.name = "holder"
        self.private_key = "opaque-Holder-9f3Kq"

    def __repr__(self) -> str:
        return f"Holder({self.name!r}, {self.private_key!r})"  # a repr that shows its secret


def nested_locals() -> dict[str, Any]:
    return {
        "config": {"db": {"db_password": "hunter22-nested"}, "region": "eu-west-1"},
        "db": Database("db.internal", "dataclass-pw-77"),
        "account": Account(user="ada", api_key="pydantic-key-88"),
        "login": Login("ada", "namedtuple-token-99"),
        "holder": Holder(),
        "environ": types.MappingProxyType({"STRIPE_SECRET": "mapping-secret-11"}),
        "cfg": f"token={GITHUB}",
        "max_tokens": 4000,
    }


HIDDEN = [
    "hunter22-nested",
    "dataclass-pw-77",
    "pydantic-key-88",
    "namedtuple-token-99",
    "mapping-secret-11",
    GITHUB,
]


def test_locals_summary_masks_secret_names_inside_values() -> None:
    text = summarize_locals(nested_locals())
    for secret in HIDDEN:
        assert secret not in text
    # What is not secret stays visible: the agent needs it.
    for visible in ("eu-west-1", "db.internal", "ada", "max_tokens (int) = 4000"):
        assert visible in text


def test_tool_results_mask_secret_names_inside_values() -> None:
    text = render_value(nested_locals())
    for secret in HIDDEN:
        assert secret not in text
    assert "eu-west-1" in text


def test_values_under_secret_names_are_collected_at_any_depth() -> None:
    found = secret_values([nested_locals()], is_secret_name)
    for secret in [*HIDDEN, "opaque-Holder-9f3Kq"]:
        assert secret in found
    # ... so a custom ``__repr__`` that shows them is masked by value afterwards.
    redact = Redactor(found)
    assert "opaque-Holder-9f3Kq" not in redact(repr(Holder()))


def test_collecting_is_bounded_and_survives_cycles_and_broken_objects() -> None:
    cycle: dict[str, Any] = {"password": "cyclic-pw-1"}
    cycle["self"] = cycle

    class Broken:
        @property
        def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
            raise RuntimeError("no")

    deep: Any = {"token": "deep-token-12345"}
    for _ in range(50):
        deep = {"next": deep}
    found = secret_values([{"cycle": cycle, "broken": Broken(), "deep": deep}], is_secret_name)
    assert "cyclic-pw-1" in found


def test_credentials_in_any_environment_variable_are_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    password = "Env-Db-Pa55word"
    monkeypatch.setenv("DATABASE_URL", f"postgresql://app:{password}@db:5432/app")
    monkeypatch.setenv("GH_PAT", "opaque-pat-value-1234")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_ID)
    monkeypatch.setenv("NOTIFY_URL", SLACK_HOOK)
    monkeypatch.setenv("BUILD_SHA", "2afae40f1c0e5e3b1c5f1d7a7e2c1b0a9f8e7d6c")
    redact = Redactor()
    text = redact(repr(dict(os.environ)) + f" bare password: {password} ")
    for secret in (password, "opaque-pat-value-1234", AWS_ID, SLACK_HOOK_PATH):
        assert secret not in text
    assert "2afae40f1c0e5e3b1c5f1d7a7e2c1b0a9f8e7d6c" in text
    # The structured view of the environment masks secret names as well.
    rendered = render_value(dict(os.environ))
    assert "opaque-pat-value-1234" not in rendered and AWS_ID not in rendered


def test_policy_names_apply_to_values_in_text() -> None:
    redact = Redactor((), Redaction(names=[r"^tenant_pin$"]))
    assert "Zq81-pin-value" not in redact("tenant_pin=Zq81-pin-value")


def test_values_are_masked_before_a_long_string_is_shortened() -> None:
    long = "x" * 100 + f" key {OPENAI} " + "y" * 400
    text = summarize_locals({"blob": long})
    assert OPENAI[:12] not in text


def test_every_event_field_is_scanned() -> None:
    from structlog.testing import capture_logs

    from crashoverride._observe import events

    with capture_logs() as logs:
        events.emit("error", events.BACKGROUND_FAILED, error=f"ValueError('bad key {STRIPE}')", n=1)
    assert STRIPE not in str(logs) and MASK in logs[0]["error"] and logs[0]["n"] == 1


def test_request_query_form_and_json_fields_are_masked() -> None:
    from crashoverride.integration import mask_fields, mask_query

    query, values = mask_query("page=2&access_token=q9Lm2Rt5&api%5Fkey=a%2Bb&flag")
    assert query == f"page=2&access_token={MASK}&api%5Fkey={MASK}&flag"
    assert set(values) == {"q9Lm2Rt5", "a%2Bb", "a+b"}
    data = {"user": "ada", "login": {"refresh_token": "rt-1", "expires_in": 3600}, "items": [1]}
    assert mask_fields(data) == {
        "user": "ada",
        "login": {"refresh_token": MASK, "expires_in": 3600},
        "items": [1],
    }


def test_the_environment_object_itself_is_rendered_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_PASSWORD", "opaque-environ-pw")
    assert "opaque-environ-pw" not in render_value(os.environ)
    assert "opaque-environ-pw" not in summarize_locals({"env": os.environ}, limit=100_000)


@pytest.mark.parametrize("limit", [300, 1_000, 4_000])
@pytest.mark.parametrize("side", ["head", "tail"])
def test_a_cut_never_leaves_half_a_key(limit: int, side: str) -> None:
    from crashoverride._security.text import clip

    keep = limit - 60
    filler = "x " * 5_000
    # The key straddles where ``clip`` cuts the head, or where the kept tail begins.
    at = keep * 2 // 3 - 10 if side == "head" else len(filler) - (keep - keep * 2 // 3) - 10
    text = filler[:at] + OPENAI + filler[at:]
    kept = mask(clip(text, limit), MASK)
    assert not any(OPENAI[i : i + 8] in kept for i in range(len(OPENAI) - 8))


def test_policy_patterns_keep_their_case_insensitivity() -> None:
    redact = Redactor((), Redaction(patterns=[r"tenant-[0-9]{4}"]))
    assert redact("TENANT-1234 and tenant-5678") == f"{MASK} and {MASK}"


def _all_alternatives_spans(text: str) -> list[tuple[int, int]]:
    """``spans`` as the pattern with every alternative finds them (no guard left any out)."""
    full = secrets._compiled(tuple(range(len(secrets._alternatives_cached()))))
    found: list[tuple[int, int]] = []
    for match in full.finditer(text):
        span = secrets._span(match, text, secrets.is_secret_name)
        if span is not None and (not found or span[0] >= found[-1][1]):
            found.append(span)
    return found


def test_guards_only_leave_out_alternatives_that_could_not_match() -> None:
    # The scan skips alternatives whose literal a text lacks; it must find exactly what the
    # whole pattern finds: over this project's own source (planted test secrets included).
    root = Path(__file__).resolve().parents[2]
    chunks = 0
    for path in sorted([*root.glob("src/crashoverride/**/*.py"), *root.glob("tests/**/*.py")]):
        source = path.read_text()
        for start in range(0, len(source), 2000):
            chunk = source[start : start + 2000]
            assert list(secrets.spans(chunk)) == _all_alternatives_spans(chunk), path
            chunks += 1
    assert chunks > 300


TOKEN_LINES = {
    "config text inside a value": ('cfg = "token=ghp_PLANTED0123456789"', "ghp_PLANTED0123456789"),
    "a .env line, hex value": (
        "GITHUB_TOKEN=fa3b9c1d2e3f4a5b6c7d8e9f0a1b2c3d",
        "fa3b9c1d2e3f4a5b6c7d8e9f0a1b2c3d",
    ),
}


@pytest.mark.parametrize(("text", "secret"), list(TOKEN_LINES.values()), ids=list(TOKEN_LINES))
def test_a_token_under_a_secret_name_is_masked_even_when_it_looks_like_an_identifier(
    text: str, secret: str
) -> None:
    assert secret not in mask(text, MASK)


@pytest.mark.parametrize("code", ["token: anyio.Token", "password=self.password", "key=KEY_NAME"])
def test_code_naming_a_secret_is_left_alone(code: str) -> None:
    assert mask(code, MASK) == code


def test_config_text_in_a_local_never_reaches_the_model() -> None:
    from crashoverride import CrashOverride
    from crashoverride.testing import MockServer, done, eval_python

    with MockServer([eval_python("cfg"), done("read it")]) as server:
        co = CrashOverride(model="scripted", base_url=server.base_url, api_key="k", timeout=20)
        cfg = "token=ghp_PLANTED0123456789\nregion=eu"
        with pytest.raises(KeyError), co.handler(prompt="read the config"):
            raise KeyError(cfg[:5])
        sent = json.dumps([request.body for request in server.requests])
    assert len(server.requests) == 2
    assert "ghp_PLANTED0123456789" not in sent
