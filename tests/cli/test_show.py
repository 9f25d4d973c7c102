"""``crashoverride show``: recoveries read back from a ledger, in the terminal and as one
self-contained page, rendered by a real headless Chromium; no secret reaches either."""

from __future__ import annotations

import html.parser
import os
import shutil
import struct
import subprocess
import sys
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from crashoverride import CrashOverride, JsonLinesLedger, RedisStreamLedger
from crashoverride._observe.report import RecoveryReport, SourceChange
from crashoverride.testing import Script, done, eval_python, exec_python, give_up

SECRET = "sk-proj-Qw3rTy8uIo9pAs7dFg6hJk5lZx4cVb2n"
REDIS = "redis://127.0.0.1:6379/11"  # 13 belongs to the fleet tests, which flush it
BROWSER = next(
    (found for name in ("chromium", "chromium-browser", "google-chrome")
     if (found := shutil.which(name))), None,
)  # fmt: skip


def _recover_twice(sink: object) -> tuple[RecoveryReport, RecoveryReport]:
    """One recovery that quotes the secret everywhere it can, and one that fails."""
    co = CrashOverride(
        model=Script(
            eval_python("api_token"),
            exec_python(f"caller['limit'] = 10  # was {SECRET!r}\n<b>not markup</b>"),
            exec_python("caller['limit'] = 10"),
            done(f"reset the limit; the token {SECRET} was fine"),
        ).run(give_up("the upstream is down")).model(),
        on_recovery=sink,  # type: ignore[arg-type]
    )  # fmt: skip
    api_token = SECRET  # a secret-named local
    limit = 0
    first = co.handler(name="limits")
    with first:
        raise RuntimeError(f"rate limited for token {api_token}")
    second = co.handler(name="upstream")
    with pytest.raises(ConnectionError), second:
        raise ConnectionError("upstream")
    assert limit == 10 and first.report is not None and second.report is not None
    return first.report, second.report


def _show(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crashoverride", "show", *args],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "CRASHOVERRIDE_LEDGER": ""},
    )  # fmt: skip


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[tuple[Path, RecoveryReport, RecoveryReport]]:
    path = tmp_path / "recoveries.jsonl"
    sink = JsonLinesLedger(path)
    first, second = _recover_twice(sink)
    # A recovery that patched a function, as the ledger would hold it.
    patched = RecoveryReport(
        recovery_id="rec_00000000beef", handler="prices", fingerprint="f",
        exc_type="builtins.KeyError", exception="builtins.KeyError: 'price'", traceback="",
        outcome="recovered", reason="held", via="agent", model="m",
        source_changes=(SourceChange(
            "app/prices.py", "written",
            "--- a/app/prices.py\n+++ b/app/prices.py\n@@ -1 +1 @@\n"
            "-    return item['price']\n+    return item['cost']\n",
            "app/prices.py.bak",
        ),),
    )  # fmt: skip
    sink(patched)
    yield path, first, second


def test_show_one_recovery_in_the_terminal(
    ledger: tuple[Path, RecoveryReport, RecoveryReport],
) -> None:
    path, first, _ = ledger
    shown = _show(first.recovery_id, "--ledger", str(path))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.startswith(f"Recovery {first.recovery_id}")
    assert "recovered (via agent)" in out and "builtins.RuntimeError: rate limited" in out
    assert "[1] eval_python (builtin) ok" in out and "caller['limit'] = 10" in out
    assert "Tokens" in out and "Duration" in out and "reset the limit" in out
    assert SECRET not in out


def test_show_the_last_recoveries_and_what_is_missing(
    ledger: tuple[Path, RecoveryReport, RecoveryReport],
) -> None:
    path, first, second = ledger
    shown = _show("--last", "3", "--ledger", str(path))
    assert shown.returncode == 0, shown.stderr
    heads = [line for line in shown.stdout.splitlines() if line.startswith("Recovery rec_")]
    assert heads == [f"Recovery {r}" for r in (first.recovery_id, second.recovery_id,
                                               "rec_00000000beef")]  # fmt: skip
    assert "+    return item['cost']" in shown.stdout
    missing = _show("rec_000000000000", "--ledger", str(path))
    assert missing.returncode == 2 and "not found" in missing.stderr
    assert _show("--last", "1").returncode == 2  # no ledger named


def test_show_reads_a_redis_stream_ledger() -> None:
    import redis

    stream = f"test-show:{uuid.uuid4().hex}"
    sink = RedisStreamLedger(REDIS, stream=stream)
    try:
        _, second = _recover_twice(sink)
        assert sink.flush()
        shown = _show("--last", "1", "--ledger", f"{REDIS}?stream={stream}")
    finally:
        redis.Redis.from_url(REDIS).delete(stream)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"Recovery {second.recovery_id}")
    assert "the agent gave up: the upstream is down" in shown.stdout


class _Assets(html.parser.HTMLParser):
    """Every way a page could fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "link", "img", "iframe", "object", "embed", "video", "audio"):
            self.fetches.append(tag)
        self.fetches += [f"{tag}[{n}]" for n, v in attrs if n in ("src", "href", "srcset") and v]


def _png_pixels(data: bytes) -> bytes:
    """The decompressed image data of a PNG (enough to tell a blank page from a drawn one)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, []
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        if kind == b"IDAT":
            chunks.append(data[position + 8 : position + 8 + length])
        position += 12 + length
    return zlib.decompress(b"".join(chunks))


def test_the_html_page_renders_in_a_real_browser_with_no_secret(
    ledger: tuple[Path, RecoveryReport, RecoveryReport], tmp_path: Path
) -> None:
    if BROWSER is None:  # `make test` installs it; a missing browser is a failure, not a skip
        pytest.fail("no Chromium: install the distribution's package (apt-get install chromium)")
    path, first, _ = ledger
    out = tmp_path / "incident.html"
    shown = _show("--last", "3", "--ledger", str(path), "--html", str(out))
    assert shown.returncode == 0, shown.stderr
    page = out.read_text()
    browser = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    dom = subprocess.run(
        [*browser, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    # The browser parsed it into the page we meant: three articles, the calls, the diff.
    assert dom.count("<article id=") == 3
    assert f'<article id="{first.recovery_id}">' in dom
    # (the second snippet is not Python: it fails)
    assert dom.count('<li class="ok-call">') == 3 and dom.count('<li class="failed-call">') == 1
    assert "<span class=\"add\">+    return item['cost']</span>" in dom
    assert "&lt;b&gt;not markup&lt;/b&gt;" in dom  # escaped, not rendered as markup
    shot = tmp_path / "page.png"
    subprocess.run(
        [*browser, f"--screenshot={shot}", "--window-size=1280,1600", out.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert len(set(_png_pixels(shot.read_bytes()))) > 16  # text and colours, not a blank page
    for text in (page, dom):
        assert SECRET not in text
        assert "[REDACTED]" in text


def test_the_html_page_is_self_contained(
    ledger: tuple[Path, RecoveryReport, RecoveryReport], tmp_path: Path
) -> None:
    path, first, _ = ledger
    out = tmp_path / "one.html"
    shown = _show(first.recovery_id, "--ledger", str(path), "--html", str(out))
    assert shown.returncode == 0, shown.stderr
    page = out.read_text()
    assets = _Assets()
    assets.feed(page)
    assert assets.fetches == []
    assert "url(" not in page and "@import" not in page
    assert "default-src 'none'" in page  # and the browser is told to fetch nothing
    assert f"<title>crashoverride: {first.recovery_id}</title>" in page
    assert SECRET not in page


def test_an_empty_ledger_and_a_recovery_with_last_are_told_plainly(
    ledger: tuple[Path, RecoveryReport, RecoveryReport], tmp_path: Path
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    shown = _show("--last", "2", "--ledger", str(empty))
    assert shown.returncode == 2
    assert shown.stderr.strip() == f"crashoverride show: no recoveries in {empty}"
    path, first, _ = ledger
    # A recovery and --last are exclusive: one names what to show, the other how many.
    both = _show(first.recovery_id, "--last", "2", "--ledger", str(path))
    assert both.returncode == 2 and both.stdout == ""
    assert "either a recovery id or --last N, not both" in both.stderr


def test_a_live_replace_function_fix_is_shown_as_a_diff(tmp_path: Path) -> None:
    from tests.cli import prices_app

    path = tmp_path / "live.jsonl"
    fixed = "def price_of(item):\n    return item['cost']\n"
    co = CrashOverride(
        model=Script(
            exec_python(f"import tests.cli.prices_app as m\nreplace_function(m.price_of, {fixed!r})"
                        "\ncaller['price'] = m.price_of(item)"),
            done("price_of reads 'cost' now"),
        ).model(),
        on_recovery=JsonLinesLedger(path),
    )  # fmt: skip
    original = prices_app.price_of.__code__
    item = {"cost": 3.5}
    price = 0.0
    handler = co.handler(name="prices")
    try:
        with handler:
            price = prices_app.price_of(item)
    finally:
        patched = prices_app.price_of.__code__
        prices_app.price_of.__code__ = original
    assert price == 3.5 and patched is not original
    assert handler.report is not None
    rec = handler.report.recovery_id
    shown = _show(rec, "--ledger", str(path))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "Source changes" in out and "tests.cli.prices_app.price_of (live;" in out
    assert '-    return item["price"]' in out and "+    return item['cost']" in out
    page_path = tmp_path / "live.html"
    assert _show(rec, "--ledger", str(path), "--html", str(page_path)).returncode == 0
    page = page_path.read_text()
    assert '<span class="add">+    return item[&#x27;cost&#x27;]</span>' in page
    assert '<span class="del">-    return item[&quot;price&quot;]</span>' in page


def test_a_request_s_report_says_its_method_path_and_request_id(tmp_path: Path) -> None:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from crashoverride.integrations.asgi import CrashOverrideMiddleware

    async def order(request: object) -> None:
        raise LookupError("order 7")

    path = tmp_path / "requests.jsonl"
    co = CrashOverride(model=Script(give_up("no such order")).model(),
                       on_recovery=JsonLinesLedger(path))  # fmt: skip
    app = Starlette(routes=[Route("/orders/7", order, methods=["PUT"])],
                    middleware=[Middleware(CrashOverrideMiddleware, crash_override=co,
                                           warm_up=False)])  # fmt: skip
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.put("/orders/7", headers={"x-request-id": "req-4711"})
    assert answer.status_code == 500
    shown = _show("--last", "1", "--ledger", str(path))
    assert shown.returncode == 0, shown.stderr
    facts = shown.stdout.split("Exception\n")[0]
    assert "Request" in facts and "PUT /orders/7 (request id req-4711)" in facts, facts
    page_path = tmp_path / "requests.html"
    assert _show("--last", "1", "--ledger", str(path), "--html", str(page_path)).returncode == 0
    assert "<tr><th>Request</th><td>PUT /orders/7 (request id req-4711)</td></tr>" in (
        page_path.read_text()
    )
