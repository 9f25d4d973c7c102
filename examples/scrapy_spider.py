"""A Scrapy crawl whose site renames a field halfway, kept alive by crashoverride.

A small bookshop is served on 127.0.0.1. From book 6 on, its pages call the price
`<span class="cost">` instead of `<span class="price">`, so the spider's `price_of` helper
raises on those pages. `CrashOverrideMiddleware` hands the first failure to one agent run: it
looks at the live response, patches `price_of` in the running process and re-runs the callback
on that page. The pages failing meanwhile wait for that run and re-run through the patched code;
the pages after it need no recovery. Every book is scraped.

Runs offline: the model is scripted. With a real model, drop `model=` (the SDK default, with
OPENAI_API_KEY) or pass `model="..."`, `base_url="..."`.

    python examples/scrapy_spider.py
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script

BOOKS = 10


class Shop(BaseHTTPRequestHandler):
    """The site: an index, and one page per book (the markup changes from book 6 on)."""

    def do_GET(self) -> None:
        if self.path == "/":
            links = "".join(f'<a class="book" href="/book/{n}">Book {n}</a>' for n in range(1, 11))
            html = f"<html><body>{links}</body></html>"
        else:
            number = int(self.path.rsplit("/", 1)[1])
            kind = "price" if number < 6 else "cost"
            html = (f'<html><body><h1>Book {number}</h1>'
                    f'<span class="{kind}">£{number}.50</span></body></html>')  # fmt: skip
        body = html.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def price_of(response: Any) -> float:
    return float(response.css("span.price::text").get().lstrip("£"))


class BookSpider(scrapy.Spider):
    name = "books"

    def parse(self, response: Any) -> Iterator[Any]:
        yield from response.follow_all(css="a.book", callback=self.parse_book)

    def parse_book(self, response: Any) -> Iterator[Any]:
        yield {"title": response.css("h1::text").get(), "price": price_of(response)}


# What the scripted model does: the steps a real model would take for this failure.
REPAIR = (
    "replace_function(price_of, '''def price_of(response):\n"
    "    # The shop renamed the price's class to `cost`.\n"
    "    shown = response.css('span.price::text').get() or response.css('span.cost::text').get()\n"
    "    return float(shown.lstrip('£'))\n''')\n"
    "rerun()"
)
reports: list[Any] = []
co = CrashOverride(
    project_prompt="A bookshop crawler. Prices must be the shop's own.",
    model=script(
        exec_python("response.css('span').getall()"),
        exec_python(REPAIR),
        done("The shop calls the price `cost` now; price_of reads both."),
    ),
    on_recovery=reports.append,
)

SETTINGS = {
    # What a project's settings.py says.
    "SPIDER_MIDDLEWARES": {"crashoverride.integrations.scrapy.CrashOverrideMiddleware": 1100},
    "CRASHOVERRIDE": "__main__.co",  # the import path: every crawler shares this object
    "CRASHOVERRIDE_PROMPT": "Yield the book's item (title, price) from the page.",
    # This example's own: quiet, local, no cookies (their check would look up domain lists).
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False,
    "REMOTE_CONTROL_ENABLED": False,
    "COOKIES_ENABLED": False,
    "ROBOTSTXT_OBEY": False,
}


def main() -> None:
    import structlog

    # The application's choice (the library never configures logging): events dropped here.
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    server = ThreadingHTTPServer(("127.0.0.1", 0), Shop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    items: list[dict[str, Any]] = []

    def scraped(item: dict[str, Any], **_: Any) -> None:
        items.append(item)

    process = CrawlerProcess(SETTINGS)
    crawler = process.create_crawler(BookSpider)
    crawler.signals.connect(scraped, signal=signals.item_scraped)
    process.crawl(crawler, start_urls=[f"http://127.0.0.1:{server.server_address[1]}/"])
    process.start()
    server.shutdown()

    print("the model is scripted")
    for item in sorted(items, key=lambda item: item["price"]):
        print(f"{item['title']}: £{item['price']:.2f}")
    stats = crawler.stats.get_stats() if crawler.stats is not None else {}
    print(f"books scraped: {len(items)} of {BOOKS}")
    print(f"agent runs: {sum(1 for report in reports if report.turns)}")
    print(f"recovered pages: {stats.get('crashoverride/recovered', 0)}")


if __name__ == "__main__":
    main()
