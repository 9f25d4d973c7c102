"""The ``crashoverride`` command: the offline demo and the doctor."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from crashoverride.testing import MockServer, done, hang


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "crashoverride", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
    )


def test_demo_runs_offline_says_the_model_is_scripted_and_every_claim_holds() -> None:
    result = _run("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "The model is SCRIPTED" in out
    assert "14/14 checks passed: all claims held (scripted model" in out
    assert "FAIL" not in out
    for event in ("recovery.started", "recovery.tool_called", "recovery.succeeded",
                  "followup.succeeded"):  # fmt: skip
        assert event in out
    # Scene 3: the rate comes from the feed, the follow-up's patch is a real diff of the
    # application's file, and a rate no source holds is not made up.
    assert "convert(100.0, 'EUR') -> 92.31" in out
    assert "the follow-up proposed rates_app.py.fu_" in out
    assert "+    if isinstance(rates, list):" in out
    assert "convert(100.0, 'CHF') -> raised KeyError('CHF')" in out


def test_demo_live_without_credentials_refuses_clearly() -> None:
    result = _run("demo", "--live")
    assert result.returncode == 2
    assert "--live needs OPENAI_API_KEY or --base-url" in result.stderr


# ------------------------------------------------------------------------------------ doctor


class _Canned(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's canned status, content type and body."""

    def _answer(self) -> None:
        status, kind, body = self.server.canned  # type: ignore[attr-defined]
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _endpoint(status: int, body: bytes, kind: str = "application/json") -> Iterator[Any]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    server.canned = (status, kind, body)  # type: ignore[attr-defined]
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        server.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"  # type: ignore[attr-defined]
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _doctor(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = _run("doctor", "--json", *args, env=env)
    report = dict(json.loads(result.stdout))
    assert result.returncode == (0 if report["healthy"] else 1), result.stderr
    assert not result.stderr, result.stderr
    return report


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in report["checks"] if c["name"] == name]
    return dict(found)


def test_doctor_without_model_access_is_unhealthy() -> None:
    result = _run("doctor")
    assert result.returncode == 1
    first, *rest = result.stdout.splitlines()
    assert first.startswith("NOT healthy")
    assert "no API key: set OPENAI_API_KEY or pass api_key= (or base_url=)" in result.stdout
    assert any("caller locals write-through" in line for line in rest)


def test_doctor_against_no_reachable_endpoint_is_unhealthy() -> None:
    report = _doctor("--base-url", "http://127.0.0.1:9/v1")
    endpoint = _check(report, "endpoint")
    assert (report["healthy"], endpoint["status"]) == (False, "fail")
    assert endpoint["verdict"] == "unreachable"
    assert "127.0.0.1:9" in endpoint["detail"]


def _error(message: str, code: str) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("status", "body", "kind", "verdict"),
    [
        (404, b"<html>Not Found</html>", "text/html", "wrong API shape"),  # e.g. /v1 missing
        (404, _error("The model `m1` does not exist.", "model_not_found"), "application/json",
         "model not found"),
        (200, b"<html>Welcome to the web UI</html>", "text/html", "wrong API shape"),
        (403, _error("project not allowed", "forbidden"), "application/json", "auth rejected"),
        (429, _error("quota exceeded", "insufficient_quota"), "application/json", "rate limited"),
    ],
    ids=["404-wrong-path", "404-missing-model", "200-not-json", "403", "429"],
)  # fmt: skip
def test_doctor_tells_what_the_endpoint_answered(
    status: int, body: bytes, kind: str, verdict: str
) -> None:
    with _endpoint(status, body, kind) as server:
        report = _doctor("--base-url", server.base_url, "--model", "m1")
    endpoint = _check(report, "endpoint")
    assert (report["healthy"], endpoint["verdict"]) == (False, verdict)
    assert server.paths == ["/v1/chat/completions"]  # one real request, the one a recovery makes
    assert f"HTTP {status}" in endpoint["detail"]
    assert report["verdict"].startswith(f"NOT healthy: endpoint: {verdict} - ")


def test_doctor_against_an_endpoint_answering_401_reports_the_key_rejected() -> None:
    body = _error("Incorrect API key provided: sk-wrong-key-123.", "invalid_api_key")
    with _endpoint(401, body) as server:
        # No base URL given: recoveries use the SDK's default, the Responses API, at
        # OPENAI_BASE_URL (or OpenAI's); the doctor checks that same endpoint.
        env = {"OPENAI_API_KEY": "sk-wrong-key-123", "OPENAI_BASE_URL": server.base_url}
        result = _run("doctor", "--json", env=env)
    assert result.returncode == 1
    assert "sk-wrong-key-123" not in result.stdout
    report = json.loads(result.stdout)
    endpoint = _check(report, "endpoint")
    assert (report["healthy"], endpoint["verdict"]) == (False, "auth rejected")
    assert server.paths == ["/v1/responses"]


def test_doctor_against_an_endpoint_that_never_answers_gives_up_at_its_timeout() -> None:
    with MockServer([hang()]) as server:
        report = _doctor("--base-url", server.base_url, "--timeout", "1")
    endpoint = _check(report, "endpoint")
    assert (report["healthy"], endpoint["verdict"]) == (False, "unreachable")
    assert endpoint["detail"].startswith("no answer within 1 s")


def test_doctor_against_the_mock_server_is_healthy_with_latency_and_model() -> None:
    with MockServer([done("ok")]) as server:
        result = _run("doctor", "--base-url", server.base_url, "--model", "mock-model",
                      env={"OPENAI_API_KEY": "sk-do-not-print-me"})  # fmt: skip
        server.assert_complete()  # exactly one request, answered from the script
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sk-do-not-print-me" not in result.stdout
    first = result.stdout.splitlines()[0]
    assert first.startswith("healthy: a recovery could run now")
    assert "mock-model answered in " in result.stdout


def test_doctor_json_says_the_same() -> None:
    with MockServer([done("ok")]) as server:
        report = _doctor("--base-url", server.base_url, "--model", "mock-model")
    endpoint = _check(report, "endpoint")
    assert report["healthy"] is True
    assert (endpoint["status"], endpoint["verdict"], endpoint["model"]) == (
        "ok",
        "ok",
        "mock-model",
    )
    assert endpoint["latency_ms"] > 0
    assert {c["status"] for c in report["checks"]} <= {"ok", "info"}


def test_doctor_piped_into_a_reader_that_leaves_prints_no_traceback() -> None:
    # ``true`` exits without reading: every write of the doctor meets a closed pipe.
    command = (
        f"{shlex.quote(sys.executable)} -m crashoverride doctor --base-url http://127.0.0.1:9/v1"
    )
    for reader in ("true", "head -1"):
        done_ = subprocess.run(["sh", "-c", f"{command} | {reader}"], capture_output=True,
                               text=True, timeout=120)  # fmt: skip
        assert "Traceback" not in done_.stderr and "BrokenPipe" not in done_.stderr, done_.stderr
    assert done_.stdout.startswith("NOT healthy")


def test_help_shows_no_markup() -> None:
    for args in ((), ("doctor",), ("demo",)):
        result = _run(*args, "--help")
        assert result.returncode == 0
        assert "``" not in result.stdout, result.stdout
