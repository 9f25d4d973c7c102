"""The spider middleware: which failures it takes, the recovery, and what goes on to the crawl."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Mapping
from typing import Any

from scrapy import Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import (
    CloseSpider,
    DontCloseSpider,
    DropItem,
    IgnoreRequest,
    NotConfigured,
    StopDownload,
)
from scrapy.http import Response
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from crashoverride import ConfigurationError, CrashOverride, Handler, integration
from crashoverride.integrations.scrapy._callback import DEFAULT_EXCERPT, FailedCallback, fields
from crashoverride.integrations.scrapy._outputs import DROPPED, Yielded, as_list, fresh

STATS_RECOVERED = "crashoverride/recovered"
STATS_FAILED = "crashoverride/failed"
STATS_DEDUPLICATED = "crashoverride/deduplicated"

# Scrapy signals, sent with ``response``, ``exception``, ``report`` and ``spider``.
callback_recovered = object()
callback_failed = object()

# Scrapy's own control flow: raised on purpose by a callback, never a bug to repair.
_CONTROL_FLOW = (CloseSpider, DontCloseSpider, DropItem, IgnoreRequest, StopDownload)


class CrashOverrideMiddleware:
    """A Scrapy spider middleware that recovers failing callbacks (see the package's docs:
    ``crashoverride.integrations.scrapy``)."""

    def __init__(
        self, crawler: Crawler, handler: Handler, *, excerpt: int = DEFAULT_EXCERPT
    ) -> None:
        self.crawler = crawler
        self.handler = handler
        self.excerpt = excerpt
        # What each response's callback yielded so far, while it runs: a re-run after a
        # repair starts from the beginning, and must not yield those again.
        self._yielded: dict[int, Yielded] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CrashOverrideMiddleware:
        settings = crawler.settings
        if not settings.getbool("CRASHOVERRIDE_ENABLED", True):
            raise NotConfigured("CRASHOVERRIDE_ENABLED is off")
        app = _instance(settings.get("CRASHOVERRIDE"))
        options = dict(settings.getdict("CRASHOVERRIDE_OPTIONS"))
        spider = getattr(crawler, "spider", None)
        options.setdefault("name", f"scrapy:{spider.name}" if spider is not None else "scrapy")
        prompt = settings.get("CRASHOVERRIDE_PROMPT") or ""
        handler = app.handler(prompt, **options)
        _check_placement(settings)
        return cls(
            crawler, handler, excerpt=settings.getint("CRASHOVERRIDE_EXCERPT", DEFAULT_EXCERPT)
        )

    # -- the spider middleware methods ------------------------------------------------------

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        key = id(response)  # unique while the response is processed, which is as long as needed
        yielded = self._yielded[key] = Yielded()
        try:
            async for output in result:
                yielded.add(output)
                yield output
        finally:
            if self._yielded.get(key) is yielded:
                del self._yielded[key]

    def process_spider_exception(
        self, response: Response, exception: BaseException, spider: Spider | None = None
    ) -> AsyncIterator[Any] | None:
        # Scrapy offers the callback's exception here first (this middleware is innermost),
        # while the failed run's output is still being recorded above.
        if not self._recoverable(response, exception):
            return None  # the next middleware's turn, exactly as without this one
        yielded = self._yielded.get(id(response)) or Yielded()
        return self._recover(response, exception, yielded)

    # -- recovery ---------------------------------------------------------------------------

    def _recoverable(self, response: Response, exc: BaseException) -> bool:
        if isinstance(exc, _CONTROL_FLOW) or not integration.catches(self.handler, exc):
            return False
        if getattr(response, "request", None) is None:
            return False
        if not integration.on_asyncio():
            integration.skip(
                self.handler, exc,
                "Scrapy is not running on its asyncio reactor (TWISTED_REACTOR): recovering a "
                "callback needs it",
                kind="scrapy_callback", **fields(self.crawler, response),
            )  # fmt: skip
            return False
        return True

    async def _recover(
        self, response: Response, exc: BaseException, yielded: Yielded
    ) -> AsyncIterator[Any]:
        handler = self.handler
        failed = FailedCallback(self.crawler, handler, response, self.excerpt)
        outcome = await integration.arecover(handler, exc, functools.partial(failed.block, exc))
        try:
            recovered = integration.settle(handler, outcome, exc)
        except Exception as replacement:  # the agent chose another exception: a failure too
            self._tell(callback_failed, STATS_FAILED, response, replacement)
            raise
        if not recovered:
            self._tell(callback_failed, STATS_FAILED, response, exc)
            raise exc
        assert outcome is not None
        outputs = as_list(outcome.value)
        self._tell(callback_recovered, STATS_RECOVERED, response, exc)
        fingerprint = self.crawler.request_fingerprinter.fingerprint
        dropped = 0
        for output in fresh(outputs, yielded, fingerprint):
            if output is DROPPED:
                dropped += 1
                continue
            yield output
        if dropped and self.crawler.stats is not None:
            self.crawler.stats.inc_value(STATS_DEDUPLICATED, dropped)

    def _tell(self, signal: object, stat: str, response: Response, exc: BaseException) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(stat)
        self.crawler.signals.send_catch_log(
            signal=signal, response=response, exception=exc, report=self.handler.report,
            spider=self.crawler.spider,
        )  # fmt: skip


def _instance(value: Any) -> CrashOverride:
    """The ``CrashOverride`` the ``CRASHOVERRIDE`` setting names."""
    if value is None:
        return CrashOverride()
    if isinstance(value, str):
        value = load_object(value.replace(":", "."))
    if isinstance(value, CrashOverride):
        return value
    if isinstance(value, Mapping):
        return CrashOverride(**value)
    raise ConfigurationError(
        "CRASHOVERRIDE",
        "expected a CrashOverride, the import path of one, or a dict of its arguments; "
        f"got {type(value).__name__}",
    )


def _check_placement(settings: Any) -> None:
    """Warn when this middleware is not innermost, or an exception handler sits right
    outside it (an unrecovered failure then skips that handler)."""
    try:
        # Newer Scrapy resolves keys to import paths first (as its manager does); older: as is.
        composed = getattr(settings, "get_component_priority_dict_with_base", None)
        middlewares = (composed or settings.getwithbase)("SPIDER_MIDDLEWARES")
        order = build_component_list(middlewares)
        loaded = [load_object(entry) for entry in order]
    except Exception:  # Scrapy reports a broken middleware list itself
        return
    mine = [index for index, cls in enumerate(loaded) if cls is CrashOverrideMiddleware]
    if not mine:
        return
    index = mine[-1]
    if index != len(loaded) - 1:
        integration.emit(
            "warning", "scrapy.middleware_not_innermost", middleware=str(order[-1]),
            fix="give CrashOverrideMiddleware the highest order in SPIDER_MIDDLEWARES (1100)",
        )  # fmt: skip
    if index > 0 and hasattr(loaded[index - 1], "process_spider_exception"):
        integration.emit(
            "warning", "scrapy.exception_handler_outside", middleware=str(order[index - 1]),
            why="an unrecovered callback's exception skips its process_spider_exception",
            fix="give that middleware a higher order than CrashOverrideMiddleware's",
        )  # fmt: skip
