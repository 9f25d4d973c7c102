"""Secret-looking names and secret environment values are masked."""

from __future__ import annotations

import pytest

from crashoverride import CrashOverride, Redaction
from crashoverride._security.redact import MASK, Redactor, is_secret_name
from crashoverride._security.text import summarize_locals


@pytest.mark.parametrize(
    "name",
    ["password", "db_password", "API_KEY", "api-key", "key", "auth_token", "client_secret",
     "Authorization", "cookie", "SESSION_ID", "passwd", "private_key"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["passenger", "compass", "monkey", "article", "payload", "keys"])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


def test_environment_values_are_masked_in_any_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRIPE_SECRET", "sk_live_abcdef123")
    monkeypatch.setenv("HOME_DIR", "/home/someone")  # not secret-named: left alone
    redact = Redactor()
    assert redact("url?k=sk_live_abcdef123&x=/home/someone") == f"url?k={MASK}&x=/home/someone"


def test_locals_summary_masks_values_and_stays_bounded() -> None:
    names = {"password": "hunter22", "big": b"x" * 10_000_000, "items": list(range(1000))}
    text = summarize_locals(names)
    assert "hunter22" not in text and MASK in text
    assert len(text) < 1_000


def test_a_placeholder_api_key_stays_readable_and_a_real_one_is_masked() -> None:
    # A local server's dummy key ("ollama") is an ordinary word in prompts and code.
    placeholder = CrashOverride(model="m", base_url="http://127.0.0.1:1/v1", api_key="ollama")
    real_key = "zq81Lk2m9XvB7rT4pQ6w"  # no known prefix: only holding it tells it is a key
    real = CrashOverride(model="m", api_key=real_key)
    text = f"the ollama server answered; key {real_key}"
    assert Redactor.for_settings(placeholder._settings)(text) == text
    assert Redactor.for_settings(real._settings)(text) == f"the ollama server answered; key {MASK}"


@pytest.mark.parametrize(
    "text",
    [
        "Inspect the frame. password=hunter22 and token ghp_" + "a1B2" * 9,
        "nothing secret here at all",
        "postgres://app:s3cr3t-pass@db:5432/x " * 50,
    ],
)
def test_constant_text_is_redacted_exactly_as_any_text(text: str) -> None:
    policy = Redaction(names=["pin"], values=["hunter22"])
    redactor = Redactor(["s3cr3t-pass"], policy)
    assert redactor.constant(text) == redactor(text)
    assert redactor.constant(text) == redactor(text)  # the remembered scan, the same answer
