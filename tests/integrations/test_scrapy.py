"""Scrapy: real crawls (``CrawlerProcess`` on Scrapy's default asyncio reactor, one process per
crawl) of a site on 127.0.0.1 whose markup changes halfway; only the model is scripted.

``scrapy_procs`` holds the site, the spider and the crawler process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashoverride.testing import MockServer, Script, done, give_up
from crashoverride.testing.tasks import patch, rerun
from tests.fleet.support import clean, fleet_redis, new_namespace
from tests.integrations.fleet_procs import agent_runs
from tests.integrations.scrapy_procs import CHANGED_FROM, FIXED_PRICE, PAGES, Site, expected_items

ROOT = Path(__file__).resolve().parents[2]
CRAWL_TIMEOUT = 300  # a loaded machine: a crawl of 50 pages takes seconds, not minutes
REPAIR = (patch("price_of", FIXED_PRICE), rerun(), done("The price's class is `amount` now."))


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    served = Site()
    yield served
    served.close()


def start(site: Site, model: str | None, style: str = "generator", **env: str) -> Any:
    handle, out = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    environ = {**os.environ, "SCRAPY_SITE": site.url, "SCRAPY_STYLE": style, **env}
    environ.pop("SCRAPY_MODEL", None)
    if model is not None:
        environ["SCRAPY_MODEL"] = model
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.scrapy_procs", out], cwd=ROOT,
        env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return proc, out


def finish(started: Any) -> dict[str, Any]:
    proc, out = started
    output, _ = proc.communicate(timeout=CRAWL_TIMEOUT)
    assert proc.returncode == 0, output[-4000:]
    try:
        return {**json.loads(Path(out).read_text()), "output": output}
    finally:
        os.unlink(out)


def crawl(site: Site, model: str | None, style: str = "generator", **env: str) -> dict[str, Any]:
    return finish(start(site, model, style, **env))


def by_price(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(items, key=lambda item: item["price"])


@pytest.mark.parametrize("style", ["generator", "itemfirst", "function", "coroutine", "asyncgen"])
def test_a_changed_markup_is_repaired_once_and_every_item_is_extracted(
    site: Site, style: str
) -> None:
    with MockServer(REPAIR) as server:
        result = crawl(site, server.base_url, style)
        requests = [request.body for request in server.requests]
    stats = result["stats"]
    # Every page's item, once: the failed pages' through the re-run, the others as usual.
    items = result["items"]
    assert by_price([item for item in items if "price" in item]) == expected_items()
    # One agent run for the whole crawl: the concurrent failures waited for it (single-flight)
    # or met the repaired code; the model was asked exactly the script's three turns.
    assert agent_runs(requests) == 1 and len(requests) == 3
    leaders = [r for r in result["reports"] if r["turns"] > 0]
    assert len(leaders) == 1 and leaders[0]["outcome"] == "recovered", result["reports"]
    recovered = int(stats["crashoverride/recovered"])
    assert 1 <= recovered <= PAGES - CHANGED_FROM + 1
    assert all(r["outcome"] == "recovered" for r in result["reports"])
    assert len(result["reports"]) == recovered
    assert "crashoverride/failed" not in stats and "spider_exceptions/count" not in stats
    # A generator that yielded its "next" request before failing: the re-run yields it again,
    # and it is not sent on twice (the dupefilter never saw a second copy of it).
    if style in ("generator", "asyncgen", "itemfirst"):
        assert int(stats["crashoverride/deduplicated"]) == recovered
    else:
        assert "crashoverride/deduplicated" not in stats
    # An item yielded before the failure is stored once, not again by the re-run.
    seen = sorted(item["seen"] for item in items if "seen" in item)
    assert seen == (
        sorted(f"Item {n}" for n in range(1, PAGES + 1)) if style == "itemfirst" else []
    )
    # The signals: one per recovered response, with its spider and URL.
    assert len(result["signals"]) == recovered
    for seen in result["signals"]:
        assert seen["signal"] == "recovered" and seen["spider"] == "shop" and seen["report"]
        assert int(seen["url"].rsplit("/", 1)[1]) >= CHANGED_FROM
        assert seen["exc"] == "TypeError"


def test_the_agent_sees_the_page_and_the_callback_with_secrets_masked(
    site: Site, tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    with MockServer(REPAIR) as server:
        crawl(site, server.base_url, "generator", SCRAPY_EVENTS=str(events))
        first = json.dumps(server.requests[0].body)
    # The recovery's events say which spider, page and callback.
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    started = [e for e in lines if e["event"] == "recovery.started"]
    assert len(started) == 1, lines
    assert started[0]["spider"] == "shop"
    assert started[0]["url"].startswith(site.url + "/item/")
    assert started[0]["callback"] == "ShopSpider.product_generator"
    succeeded = [e for e in lines if e["event"] == "recovery.succeeded"]
    assert succeeded and all(e["spider"] == "shop" and "/item/" in e["url"] for e in succeeded)
    assert "product_generator" in first  # the callback's name and source
    assert "def product_generator" in first
    assert 'span class=\\\\"amount\\\\"' in first or 'class=\\"amount\\"' in first  # excerpt
    assert "/item/" in first and "200" in first  # its URL and status
    assert "site-session-secret-42" not in first  # the Set-Cookie header's value is masked
    assert "set-cookie" in first.lower()


GIVE_UP = Script()
for _ in range(PAGES):
    GIVE_UP.run(give_up("The page holds no price I can trust."))

# What differs between two crawls for reasons of time, not of behaviour.
TIMING_STATS = {"start_time", "finish_time", "elapsed_time_seconds", "items_per_minute",
                "responses_per_minute"}  # fmt: skip
TIMING_LOGS = (
    "Dumping Scrapy stats",
    "Crawled ",
    "Overridden settings",
    "Enabled spider middlewares",
)


def _untimed(message: str) -> str:
    # The dupefilter names the first duplicate it met: which one depends on the timing.
    if message.startswith("Filtered duplicate request"):
        return "Filtered duplicate request"
    return message


def comparable(result: dict[str, Any]) -> tuple[Any, ...]:
    stats = {k: v for k, v in result["stats"].items()
             if k not in TIMING_STATS and not k.startswith("crashoverride/")}  # fmt: skip
    logs = Counter(
        (r["level"], r["logger"], _untimed(r["message"]), r["exc"])
        for r in result["logs"]
        if not r["message"].startswith(TIMING_LOGS)
    )  # fmt: skip
    return by_price(result["items"]), stats, logs


def test_a_give_up_leaves_the_crawl_exactly_as_without_crashoverride(site: Site) -> None:
    without = crawl(site, None)
    with MockServer(GIVE_UP) as server:
        given_up = crawl(site, server.base_url)
        assert server.requests  # the agent was asked, and gave up
    items, stats, logs = comparable(given_up)
    assert items == comparable(without)[0] == expected_items()[: CHANGED_FROM - 1]
    assert stats == comparable(without)[1]
    assert logs == comparable(without)[2]
    failed = PAGES - CHANGED_FROM + 1
    assert int(stats["spider_exceptions/count"]) == failed
    assert int(given_up["stats"]["crashoverride/failed"]) == failed
    assert "crashoverride/recovered" not in given_up["stats"]
    assert [s["signal"] for s in given_up["signals"]] == ["failed"] * failed
    # Scrapy's own log line for each failure, its exception carrying the note.
    errors = [r for r in given_up["logs"] if r["message"].startswith("Spider error processing")]
    assert len(errors) == failed
    assert all(any("crashoverride" in note for note in r["notes"]) for r in errors)
    assert not any(r["notes"] for r in without["logs"])


def test_two_crawlers_on_a_fleet_share_one_agent_run(site: Site) -> None:
    with fleet_redis() as url, MockServer(REPAIR) as server:
        namespace = new_namespace()
        try:
            fleet = {"SCRAPY_REDIS": url, "SCRAPY_NS": namespace}
            first = start(site, server.base_url, **fleet)
            second = start(site, server.base_url, **fleet)
            results = [finish(first), finish(second)]
        finally:
            clean(url, namespace)
        requests = [request.body for request in server.requests]
    assert agent_runs(requests) == 1 and len(requests) == 3
    for result in results:
        assert by_price(result["items"]) == expected_items()
        assert "spider_exceptions/count" not in result["stats"]
    roles = sorted(r["fleet_role"] for result in results for r in result["reports"] if r["turns"])
    assert roles == ["leader"]
    # The other crawler recovered without a model call: it waited for the leader's fix, or
    # applied it when its own failure came.
    other = [result for result in results if not any(r["turns"] for r in result["reports"])]
    assert len(other) == 1 and int(other[0]["stats"]["crashoverride/recovered"]) >= 1


def test_the_example_scrapes_every_book_with_one_agent_run() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "scrapy_spider.py")],
        capture_output=True, text=True, timeout=CRAWL_TIMEOUT, cwd=ROOT / "examples",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "the model is scripted" in out
    assert "books scraped: 10 of 10" in out
    assert "agent runs: 1" in out
    assert "Book 10: £10.50" in out and "Book 1: £1.50" in out
    recovered = int(out.split("recovered pages: ")[1].split()[0])
    assert 1 <= recovered <= 5  # books 6-10 fail until the repair lands


def test_on_another_reactor_a_failure_is_skipped_with_a_note(site: Site) -> None:
    other = json.dumps({"TWISTED_REACTOR": "twisted.internet.selectreactor.SelectReactor"})
    with MockServer(REPAIR) as server:
        result = crawl(site, server.base_url, SCRAPY_EXTRA=other)
        assert server.requests == []  # no agent run: the failure is Scrapy's, as without us
    failed = PAGES - CHANGED_FROM + 1
    assert by_price(result["items"]) == expected_items()[: CHANGED_FROM - 1]
    assert int(result["stats"]["spider_exceptions/count"]) == failed
    assert "crashoverride/failed" not in result["stats"]  # no recovery ran
    errors = [r for r in result["logs"] if r["message"].startswith("Spider error processing")]
    assert len(errors) == failed
    assert all(any("asyncio reactor" in note for note in r["notes"]) for r in errors)


def test_a_crashoverride_setting_that_names_no_crashoverride_stops_the_start(site: Site) -> None:
    wrong = json.dumps({"CRASHOVERRIDE": "builtins.len"})
    result = crawl(site, "http://127.0.0.1:9/v1", SCRAPY_EXTRA=wrong)
    # Scrapy reports a middleware that fails to build, and crawls nothing.
    assert "ConfigurationError: CRASHOVERRIDE: expected a CrashOverride" in result["output"]
    assert result["items"] == []


def test_without_scrapy_the_import_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['scrapy'] = None\n"
        "try:\n    import crashoverride.integrations.scrapy\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    assert "pip install 'crashoverride[scrapy]'" in done.stdout, done.stdout + done.stderr


def test_a_middleware_that_is_not_innermost_is_warned_about(site: Site, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    outer = json.dumps({
        "SPIDER_MIDDLEWARES": {"crashoverride.integrations.scrapy.CrashOverrideMiddleware": 500},
    })  # fmt: skip
    with MockServer(REPAIR) as server:
        crawl(site, server.base_url, SCRAPY_EXTRA=outer, SCRAPY_EVENTS=str(events))
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    warned = {e["event"]: e for e in lines if e["level"] == "warning"}
    assert "DepthMiddleware" in warned["scrapy.middleware_not_innermost"]["middleware"] or (
        "MetaCopyDetectionMiddleware" in warned["scrapy.middleware_not_innermost"]["middleware"]
    )
    # Right outside it (order 50), HttpErrorMiddleware handles exceptions too.
    assert "HttpErrorMiddleware" in warned["scrapy.exception_handler_outside"]["middleware"]
