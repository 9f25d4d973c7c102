"""The site and the crawler process of the Scrapy tests.

The site (``Site``) runs in the test's process, on 127.0.0.1: an index of ``PAGES`` product
pages whose markup changes halfway (the price's class ``price`` becomes ``amount``). The crawl
runs in a process of its own, since a Twisted reactor starts once per process:

    python -m tests.integrations.scrapy_procs OUT.json   # configured by the environment

``SCRAPY_SITE`` (the site's URL), ``SCRAPY_STYLE`` (the product callback: ``generator``,
``itemfirst``, ``function``, ``coroutine``, ``asyncgen``), ``SCRAPY_MODEL`` (the model's URL;
unset: no crashoverride at all), ``SCRAPY_REDIS`` and ``SCRAPY_NS`` (a fleet),
``SCRAPY_EXTRA`` (more settings, as JSON), ``SCRAPY_EVENTS`` (a file for the events, as JSON
lines). It writes the items, the stats, the log records, the recovery reports and the signals
it saw as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import scrapy

PAGES = 50
CHANGED_FROM = PAGES // 2 + 1  # pages from here on have the new markup
FLEET_KEY = "scrapy-fleet-key-0123456789"
FIXED_PRICE = """\
def price_of(response):
    # The site renamed the price's class from `price` to `amount`.
    shown = response.css("span.price::text").get() or response.css("span.amount::text").get()
    return float(shown)
"""


def expected_items() -> list[dict[str, Any]]:
    return [{"name": f"Item {n}", "price": n + 0.99} for n in range(1, PAGES + 1)]


# -- the site ------------------------------------------------------------------------------


def page(number: int) -> bytes:
    kind = "amount" if number >= CHANGED_FROM else "price"
    return (
        f'<html><body><h1 class="name">Item {number}</h1>'
        f'<span class="{kind}">{number}.99</span>'
        f'<a class="next" href="/item/{number + 1}">next</a></body></html>'
    ).encode()


def index() -> bytes:
    links = "".join(f'<li><a href="/item/{n}">Item {n}</a></li>' for n in range(1, PAGES + 1))
    return f"<html><body><ul>{links}</ul></body></html>".encode()


class _Pages(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/":
            body = index()
        elif self.path.startswith("/item/") and self.path[6:].isdigit():
            body = page(int(self.path[6:]))
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "session=site-session-secret-42")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class Site:
    """The site on 127.0.0.1 (a free port), served by a thread until ``close``."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


# -- the spider ----------------------------------------------------------------------------


def price_of(response: Any) -> float:
    return float(response.css("span.price::text").get())


def name_of(response: Any) -> str:
    return str(response.css("h1.name::text").get())


class ShopSpider(scrapy.Spider):
    name = "shop"

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(os.environ["SCRAPY_SITE"] + "/", callback=self.parse)

    def parse(self, response: Any) -> Iterator[Any]:
        callback = getattr(self, "product_" + os.environ.get("SCRAPY_STYLE", "generator"))
        for href in response.css("li a::attr(href)").getall():
            yield response.follow(href, callback=callback)

    def product_generator(self, response: Any) -> Iterator[Any]:
        # Yields a request before the item: a re-run must not yield it twice.
        yield response.follow(response.css("a.next::attr(href)").get(), callback=self.ignore)
        yield {"name": name_of(response), "price": price_of(response)}

    def product_itemfirst(self, response: Any) -> Iterator[Any]:
        # Yields an item before failing: a re-run must not store it twice.
        yield {"seen": name_of(response)}
        yield {"name": name_of(response), "price": price_of(response)}

    def product_function(self, response: Any) -> list[Any]:
        return [{"name": name_of(response), "price": price_of(response)}]

    async def product_coroutine(self, response: Any) -> list[Any]:
        return [{"name": name_of(response), "price": price_of(response)}]

    async def product_asyncgen(self, response: Any) -> AsyncIterator[Any]:
        yield response.follow(response.css("a.next::attr(href)").get(), callback=self.ignore)
        yield {"name": name_of(response), "price": price_of(response)}

    def ignore(self, response: Any) -> None:
        return None


# -- the crawl -----------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append({"level": record.levelname, "logger": record.name,
                             "message": record.getMessage(),
                             "exc": record.exc_info[1].__class__.__name__
                             if record.exc_info and record.exc_info[1] else None,
                             "notes": list(getattr(record.exc_info[1], "__notes__", []))
                             if record.exc_info and record.exc_info[1] else []})  # fmt: skip


def settings() -> dict[str, Any]:
    base: dict[str, Any] = {
        "LOG_LEVEL": "DEBUG", "LOG_INSTALL_ROOT_HANDLER": False,
        "TELNETCONSOLE_ENABLED": False, "REMOTE_CONTROL_ENABLED": False,
        "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,  # its domain check would fetch the public suffix list
        "LOGSTATS_INTERVAL": 3600,
        "DEPTH_LIMIT": 2, "MEMUSAGE_ENABLED": False,
    }  # fmt: skip
    model = os.environ.get("SCRAPY_MODEL")
    if model:
        base["SPIDER_MIDDLEWARES"] = {
            "crashoverride.integrations.scrapy.CrashOverrideMiddleware": 1100
        }
        base["CRASHOVERRIDE"] = "tests.integrations.scrapy_procs.CO"
        base["CRASHOVERRIDE_PROMPT"] = "Yield the product's item (name, price) from the page."
    base.update(json.loads(os.environ.get("SCRAPY_EXTRA", "{}")))
    return base


REPORTS: list[dict[str, Any]] = []
CO: Any = None


def crash_override() -> Any:
    from crashoverride import CrashOverride, RedisCoordination

    fleet = None
    if os.environ.get("SCRAPY_REDIS"):
        fleet = RedisCoordination(os.environ["SCRAPY_REDIS"], namespace=os.environ["SCRAPY_NS"],
                                  key=FLEET_KEY, op_timeout=1.0)  # fmt: skip
    return CrashOverride(
        model="scrapy-model", base_url=os.environ["SCRAPY_MODEL"], api_key="sk-scrapy",
        timeout=60, max_concurrent_recoveries=64, concurrency_wait=60, coordination=fleet,
        on_recovery=lambda report: REPORTS.append({
            "outcome": report.outcome, "turns": report.turns, "fleet_role": report.fleet_role,
            "reason": report.reason,
        }),
    )  # fmt: skip


def main(out: str) -> None:
    global CO
    import structlog
    from scrapy import signals
    from scrapy.crawler import CrawlerProcess

    # An application decision (the library never configures logging): events as JSON lines
    # in ``SCRAPY_EVENTS``, else dropped.
    events = os.environ.get("SCRAPY_EVENTS")
    if events:
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
            logger_factory=structlog.WriteLoggerFactory(open(events, "a")),  # noqa: SIM115
        )
    else:
        structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    if os.environ.get("SCRAPY_MODEL"):
        # Where the CRASHOVERRIDE setting finds it (this file runs as ``__main__``).
        from tests.integrations import scrapy_procs

        CO = scrapy_procs.CO = crash_override()
    records = _Records()
    items: list[Any] = []
    seen: list[dict[str, Any]] = []

    def scraped(item: Any, **_: Any) -> None:
        items.append(dict(item))

    def told(signal: Any, response: Any, exception: Any, report: Any, spider: Any, **_: Any):
        from crashoverride.integrations import scrapy as integration

        kind = "recovered" if signal is integration.callback_recovered else "failed"
        seen.append({"signal": kind, "url": response.url, "exc": type(exception).__name__,
                     "spider": spider.name, "report": report is not None})  # fmt: skip

    process = CrawlerProcess(settings())
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.DEBUG)
    # An application decision, as usual for HTTP clients: the model client's debug chatter
    # (the SDK's, openai's, httpx's) is not in the crawl's log.
    for name in ("openai", "httpx", "httpcore", "httpx2", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    crawler = process.create_crawler(ShopSpider)
    crawler.signals.connect(scraped, signal=signals.item_scraped)
    if os.environ.get("SCRAPY_MODEL"):
        from crashoverride.integrations import scrapy as integration

        crawler.signals.connect(told, signal=integration.callback_recovered)
        crawler.signals.connect(told, signal=integration.callback_failed)
    process.crawl(crawler)
    process.start()
    stats = {key: str(value) for key, value in (crawler.stats.get_stats() or {}).items()}
    with open(out, "w") as file:
        json.dump({"items": items, "stats": stats, "logs": records.records,
                   "reports": REPORTS, "signals": seen}, file)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
