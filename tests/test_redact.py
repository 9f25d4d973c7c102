"""Secret-looking names and secret environment values are masked."""

from __future__ import annotations

import pytest

from crashoverride._redact import MASK, Redactor, is_secret_name
from crashoverride._text import summarize_locals


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
