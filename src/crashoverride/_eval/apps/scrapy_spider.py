"""The application of the Scrapy scenarios (see ``scenarios/scrapy_spider.py``): a news spider
that follows each article's "next" link, behind ``CrashOverrideMiddleware``.

Only application code and its "upstream" data live here: this module is the agent's namespace
(each trial runs in a fresh copy of it). The crawl is a real Scrapy crawl, run on this trial's
event loop without a Twisted reactor, over ``file://`` pages: no sockets, and as many crawls
as there are trials in one process.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SITE: dict[str, str] = {}  # the site as it is today: file name -> HTML (the scenario fills it)
SAVED: list[dict[str, Any]] = []  # the items the crawl scraped, in order
CO: Any = None  # the CrashOverride the crawl's settings name by import path


def title_of(response: Any) -> str:
    return str(response.css("h1.title::text").get().strip())


def byline_of(response: Any) -> str:
    return str(response.css("p.byline::text").get(default="").strip())


def _spider_class() -> Any:
    import scrapy

    class NewsSpider(scrapy.Spider):
        name = "news"

        def parse(self, response: Any) -> Iterator[Any]:
            yield {"page": response.url.rsplit("/", 1)[-1], "title": title_of(response),
                   "byline": byline_of(response)}  # fmt: skip
            following = response.css("a.next::attr(href)").get()
            if following:
                yield response.follow(following, callback=self.parse)

    return NewsSpider


async def crawl(co: Any, prompt: str) -> list[dict[str, Any]]:
    """Crawl the site from its first page, every article through the (protected) spider."""
    global CO
    from scrapy import signals
    from scrapy.crawler import AsyncCrawlerRunner

    CO = co
    scrapy_log = logging.getLogger("scrapy")
    quiet = logging.NullHandler()  # the crawl's log is not the eval's output
    propagates = scrapy_log.propagate
    scrapy_log.addHandler(quiet)
    scrapy_log.propagate = False
    try:
        with tempfile.TemporaryDirectory() as root:
            for name, html in SITE.items():
                (Path(root) / name).write_text(html, encoding="utf-8")
            first = (Path(root) / next(iter(SITE))).as_uri()
            runner = AsyncCrawlerRunner({
                "TWISTED_REACTOR_ENABLED": False, "REMOTE_CONTROL_ENABLED": False,
                "TELNETCONSOLE_ENABLED": False, "ROBOTSTXT_OBEY": False,
                "DOWNLOAD_HANDLERS": {"http": None, "https": None, "s3": None, "ftp": None},
                "SPIDER_MIDDLEWARES": {
                    "crashoverride.integrations.scrapy.CrashOverrideMiddleware": 1100,
                },
                "CRASHOVERRIDE": f"{__name__}.CO", "CRASHOVERRIDE_PROMPT": prompt,
            })  # fmt: skip
            crawler = runner.create_crawler(_spider_class())

            def scraped(item: Any, **_: Any) -> None:
                SAVED.append(dict(item))

            crawler.signals.connect(scraped, signal=signals.item_scraped)
            await runner.crawl(crawler, start_urls=[first])
    finally:
        scrapy_log.removeHandler(quiet)
        scrapy_log.propagate = propagates
    return SAVED
