"""One recovery end to end through the real ``openai`` client, over HTTP on loopback.

Only the model is scripted: ``MockServer`` speaks chat completions on 127.0.0.1 and plays
the turns below; everything else (SDK, openai client, HTTP, our tools) is the real thing.
"""

from __future__ import annotations

import json

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import MockServer, done, exec_python


def extract_article(payload: dict[str, str]) -> str:
    return payload["article_text"]


def test_recovery_through_the_openai_client_and_http() -> None:
    fix = (
        "def extract_article(payload):\n"
        "    return payload['body']\n"
        "globals()['extract_article'] = extract_article\n"
        "caller['article'] = extract_article(payload)"
    )
    with MockServer([exec_python(fix), done("patched extract_article for `body`")]) as server:
        co = CrashOverride(
            project_prompt="A scraper; article text must come from the source.",
            model="local-model",
            base_url=server.base_url,
            api_key="sk-local-secret-value",
        )
        handler = co.handler(prompt="Leave `article` containing the article text.")
        payload = {"body": "The text."}
        article = None
        with handler:
            article = extract_article(payload)
        requests = server.requests
    assert article == "The text."
    assert extract_article({"body": "later"}) == "later"
    report = handler.report
    assert report is not None and report.outcome == "recovered"
    assert report.turns == 2 and report.usage.requests == 2
    first = requests[0].body
    assert first["model"] == "local-model"
    assert {t["function"]["name"] for t in first["tools"]} >= {
        "eval_python", "exec_python", "give_up"
    }  # fmt: skip
    prompt_text = json.dumps(first["messages"])
    assert "A scraper; article text must come from the source." in prompt_text
    assert "KeyError" in prompt_text and "article_text" in prompt_text
    # The second request carries the tool result of the patch back to the model.
    second = requests[1].body
    assert any(m.get("role") == "tool" for m in second["messages"])


def test_secrets_in_locals_and_environment_never_reach_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PAYMENT_API_TOKEN", "tok-very-secret-123")
    with MockServer([exec_python("print(os_token)\ncaller['seen'] = True"), done()]) as server:
        co = CrashOverride(model="m", base_url=server.base_url, api_key="k")
        password = "hunter2-is-my-password"
        os_token = "tok-very-secret-123"
        with co.handler():
            raise RuntimeError(f"login failed for {password}")
        bodies = " ".join(json.dumps(r.body) for r in server.requests)
    assert "tok-very-secret-123" not in bodies
    assert "hunter2" not in bodies  # not in the locals summary, nor in the exception message
    assert "password" in bodies  # the name is shown, its value is not
    assert "[REDACTED]" in bodies
    assert password and os_token
