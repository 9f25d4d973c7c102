"""Scrapy: recover a failing spider callback inside the crawl, and keep crawling.

    # settings.py
    SPIDER_MIDDLEWARES = {"crashoverride.integrations.scrapy.CrashOverrideMiddleware": 1100}
    CRASHOVERRIDE = "myproject.recovery.co"  # a CrashOverride, its import path, or its arguments
    CRASHOVERRIDE_PROMPT = "Yield the page's items; never invent a field."

When a callback raises (a plain function, a generator, ``async def``, an async generator),
the agent gets the response (its URL, status, headers with secrets masked, an excerpt of its
text, and the live object for ``response.css`` / ``response.xpath``), the callback's source and
the exception. It repairs the callback or its helpers and ``rerun()``: the callback runs again
on that response, from the start, and what it yields goes on through the crawl. A generator
that failed halfway already yielded some items and requests: those are not yielded twice.
Later responses run through the repaired code; concurrent failures of the same bug wait for the
one agent run (single-flight, fleet-wide with ``RedisCoordination``) and then re-run.

A callback that is not recovered fails exactly as it does without crashoverride (Scrapy's
"Spider error processing" log line, the ``spider_error`` signal, ``spider_exceptions/*``
stats, the ``process_spider_exception`` of the middlewares outside this one), its exception
carrying a note saying why. Scrapy calls a request's errback for download errors only, so a
callback's exception reaches no errback, with or without crashoverride.

Stats: ``crashoverride/recovered``, ``crashoverride/failed`` (a recovery ran and the exception
went on), ``crashoverride/deduplicated`` (outputs of a re-run the failed run had yielded).
Signals: ``callback_recovered`` and ``callback_failed`` (``response``, ``exception``,
``report``, ``spider``). The recovery's events carry the spider's name, the URL and the
callback.

Settings: ``CRASHOVERRIDE`` (a ``CrashOverride``; its import path, which gives every crawler of
the process the same object, whereas Scrapy deep-copies settings values per crawler; or a dict
of ``CrashOverride`` arguments; default ``CrashOverride()``), ``CRASHOVERRIDE_PROMPT``,
``CRASHOVERRIDE_OPTIONS`` (``CrashOverride.handler`` options), ``CRASHOVERRIDE_EXCERPT``
(characters of the response's text shown, default 2000), ``CRASHOVERRIDE_ENABLED``.

Place the middleware innermost (an order above every other spider middleware's: 1100 is, with
Scrapy's defaults), so it sees the callback's own output. Recovery needs Scrapy's asyncio
reactor (its default); on another reactor a failure is skipped with a note and fails as usual.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from types import FrameType, MappingProxyType
from typing import Any

try:
    from scrapy import Request, Spider
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
    from scrapy.utils.defer import maybe_deferred_to_future
    from scrapy.utils.misc import arg_to_iter, load_object
    from twisted.internet.defer import Deferred
except ImportError as missing:  # pragma: no cover - the extra is installed in the test suite
    raise ImportError(
        "crashoverride.integrations.scrapy needs Scrapy: pip install 'crashoverride[scrapy]'",
        name=missing.name,
    ) from missing

from crashoverride import ConfigurationError, CrashOverride, Handler, integration

__all__ = [
    "STATS_DEDUPLICATED",
    "STATS_FAILED",
    "STATS_RECOVERED",
    "CrashOverrideMiddleware",
    "callback_failed",
    "callback_recovered",
]

STATS_RECOVERED = "crashoverride/recovered"
STATS_FAILED = "crashoverride/failed"
STATS_DEDUPLICATED = "crashoverride/deduplicated"

# Scrapy signals, sent with ``response``, ``exception``, ``report`` and ``spider``.
callback_recovered = object()
callback_failed = object()

DEFAULT_EXCERPT = 2000
_SOURCE_SHOWN = 6000

# Scrapy's own control flow: raised on purpose by a callback, never a bug to repair.
_CONTROL_FLOW = (CloseSpider, DontCloseSpider, DropItem, IgnoreRequest, StopDownload)

# The brief's trusted text. Everything the site sent (URL, headers, text) is a fenced value.
SCRAPY_BRIEF = """\
This is a Scrapy spider callback (`callback`, its source shown above) that raised on the
response shown above (its `url`, `status`, `headers` with secrets masked, and an excerpt of its
`text`). The crawl goes on while you work, and later responses run through the same code.
Names: `response` is the live response object (response.css(...), response.xpath(...),
response.text, response.follow(...)), `request` its request, `spider` the spider, `cb_kwargs`
the callback's keyword arguments; the callback's locals are readable through `caller`.
Finish in one of two ways:
- Repair the code (the callback with replace_function(...), or a helper it calls), then
  `rerun()`: when you finish, the callback runs again on this response, from the start, and
  what it yields (items and requests) goes on through the crawl. `outputs = await
  run_callback()` runs it now and returns what it yields, without sending anything on: use it
  to check the repair. Items and requests the failed run already yielded are not yielded twice.
- `set_result([...])`: the page's items (and requests) yourself, only from the page's content.
If the site's markup changed, repair the extraction so that later pages work too. Never invent
a value the page does not hold. If the page holds no trustworthy data (an error page, a
captcha, a block page), call give_up: the callback then fails as it would have in Scrapy."""


class CrashOverrideMiddleware:
    """A Scrapy spider middleware that recovers failing callbacks (see the module docs)."""

    def __init__(
        self, crawler: Crawler, handler: Handler, *, excerpt: int = DEFAULT_EXCERPT
    ) -> None:
        self.crawler = crawler
        self.handler = handler
        self.excerpt = excerpt
        # What each response's callback yielded so far, while it runs: a re-run after a
        # repair starts from the beginning, and must not yield those again.
        self._yielded: dict[int, _Yielded] = {}

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
        yielded = self._yielded[key] = _Yielded()
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
        yielded = self._yielded.get(id(response)) or _Yielded()
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
                kind="scrapy_callback", **_fields(self.crawler, response),
            )  # fmt: skip
            return False
        return True

    async def _recover(
        self, response: Response, exc: BaseException, yielded: _Yielded
    ) -> AsyncIterator[Any]:
        handler = self.handler
        failed = _Failed(self.crawler, handler, response, self.excerpt)
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
        outputs = _as_list(outcome.value)
        self._tell(callback_recovered, STATS_RECOVERED, response, exc)
        fingerprint = self.crawler.request_fingerprinter.fingerprint
        dropped = 0
        for output in _fresh(outputs, yielded, fingerprint):
            if output is _DROPPED:
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


class _Yielded:
    """What a callback yielded, in order: requests as they are, items as shallow copies (an
    item pipeline may change an item in place before the callback fails)."""

    __slots__ = ("items", "requests")

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.items: list[Any] = []

    def add(self, output: Any) -> None:
        if isinstance(output, Request):
            self.requests.append(output)
            return
        try:
            self.items.append(copy.copy(output))
        except Exception:  # an object that refuses copies is compared as it is
            self.items.append(output)


_DROPPED = object()


def _fresh(
    outputs: list[Any], yielded: _Yielded, fingerprint: Callable[[Request], bytes]
) -> Iterator[Any]:
    """The re-run's outputs, each one the failed run already yielded replaced by ``_DROPPED``
    (as many times as it yielded it): requests by their fingerprint, items by equality."""
    requests = Counter(fingerprint(request) for request in yielded.requests)
    items = list(yielded.items)
    for output in outputs:
        if isinstance(output, Request):
            key = fingerprint(output)
            if requests[key] > 0:
                requests[key] -= 1
                yield _DROPPED
                continue
        else:
            index = _index_of(items, output)
            if index is not None:
                del items[index]
                yield _DROPPED
                continue
        yield output


def _index_of(items: list[Any], wanted: Any) -> int | None:
    for index, item in enumerate(items):
        try:
            if item == wanted:
                return index
        except Exception:  # an item whose comparison raises is a different item
            continue
    return None


class _Failed:
    """One failed callback: the block the recovery gets, and the callback run again."""

    def __init__(
        self,
        crawler: Crawler,
        handler: Handler,
        response: Response,
        excerpt: int,
    ) -> None:
        request = response.request
        assert request is not None
        spider = crawler.spider
        assert spider is not None  # set before the engine starts
        self.crawler = crawler
        self.postcondition = handler.settings.postcondition
        self.is_secret = integration.redactor(handler).is_secret
        self.response = response
        self.request = request
        self.spider = spider
        # What Scrapy called: the request's callback, else the spider's default one.
        self.callback: Callable[..., Any] = request.callback or spider._parse
        self.kwargs = dict(request.cb_kwargs)
        self.excerpt = excerpt
        self.frame: FrameType | None = None

    async def run(self) -> list[Any]:
        """The callback on the same response, once more; what it yields, in order."""
        output = await _settled(self.callback(self.response, **self.kwargs))
        if hasattr(output, "__aiter__"):
            return [item async for item in output]
        return _as_list(output)

    @property
    def described(self) -> Any:
        """What the agent is shown as the callback: the code of its frame when the traceback
        has one (the spider's ``parse`` rather than Scrapy's ``_parse`` calling it)."""
        return self.frame.f_code if self.frame is not None else self.callback

    def block(self, exc: BaseException) -> integration.Block:
        callback = self.callback
        frame = self.frame = _callback_frame(exc, callback)
        block = integration.call_block(
            self.run, (), {}, exc,
            postcondition=self.postcondition,
            kind="scrapy_callback",
            brief=self.brief(),
            fields=_fields(self.crawler, self.response, self.described),
        )  # fmt: skip
        # ``call_block`` judges ``rerun()`` / ``set_result`` and replays single-flight waiters
        # through ``run``; what the agent sees is the callback's, not ``run``'s.
        block.frame = frame
        block.globals = (
            (frame.f_globals if frame is not None else None) or _globals_of(callback) or {}
        )
        block.caller = MappingProxyType(dict(frame.f_locals)) if frame is not None else None
        block.bindings = {
            "response": self.response, "request": self.request, "spider": self.spider,
            "callback": self.request.callback or getattr(self.spider, "parse", callback),
            "cb_kwargs": self.kwargs, "run_callback": self.run,
        }  # fmt: skip
        block.secrets = _secret_values(self.response, self.is_secret)
        return block

    def brief(self) -> integration.Brief:
        response = self.response
        is_secret = self.is_secret
        headers = "\n".join(
            f"{name}: {integration.MASK if is_secret(name) else value}"
            for name, value in _headers(response)
        )
        return integration.Brief(
            SCRAPY_BRIEF,
            spider=getattr(self.spider, "name", "?"),
            url=_masked_url(response.url),
            status=response.status,
            headers=headers or "(none)",
            text=integration.clip(_text(response), self.excerpt),
            callback=_qualname(self.described),
            source=integration.clip(_source(self.described), _SOURCE_SHOWN),
        )


# -- helpers -------------------------------------------------------------------------------


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


async def _settled(output: Any) -> Any:
    """A callback's return value, awaited when it is a coroutine (``async def``) or a
    Deferred; an async generator is left as it is."""
    if isinstance(output, Deferred):
        return await maybe_deferred_to_future(output)
    if inspect.isawaitable(output) and not hasattr(output, "__aiter__"):
        return await output
    return output


def _as_list(value: Any) -> list[Any]:
    """Outputs as Scrapy reads a callback's return value: None is none, an item or a request
    is one, an iterable is its elements."""
    return list(arg_to_iter(value))


def _callback_frame(exc: BaseException, callback: Callable[..., Any]) -> FrameType | None:
    """The callback's own frame in the traceback; else the first frame of application code
    (Scrapy may have called a wrapper of it: ``Spider._parse``, a ``CrawlSpider`` rule)."""
    func = getattr(callback, "__func__", callback)
    code = getattr(func, "__code__", None)
    first: FrameType | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is code:
            return frame
        if first is None and _is_application(frame):
            first = frame
        tb = tb.tb_next
    return first


# The frames between the event loop and a callback: Scrapy's, Twisted's, the standard library's.
_FRAMEWORK = frozenset({"scrapy", "twisted", *sys.stdlib_module_names})


def _is_application(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] not in _FRAMEWORK


def _globals_of(callback: Callable[..., Any]) -> dict[str, Any] | None:
    func = getattr(callback, "__func__", callback)
    found = getattr(func, "__globals__", None)
    return found if isinstance(found, dict) else None


def _qualname(callback: Any) -> str:
    return str(getattr(callback, "co_qualname", None) or getattr(callback, "__qualname__", None)
               or repr(callback))  # fmt: skip


def _source(callback: Any) -> str:
    try:
        return inspect.getsource(callback)
    except (OSError, TypeError):
        return "(source not available)"


def _headers(response: Response) -> list[tuple[str, str]]:
    pairs = []
    for name, values in response.headers.items():
        key = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        for value in values:
            shown = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            pairs.append((key, shown))
    return pairs


def _text(response: Response) -> str:
    text = getattr(response, "text", None)  # a TextResponse's decoded body
    if isinstance(text, str):
        return text
    return repr(response.body[:DEFAULT_EXCERPT])


def _masked_url(url: str) -> str:
    base, mark, query = url.partition("?")
    if not mark:
        return url
    fragment = ""
    query, hash_mark, rest = query.partition("#")
    if hash_mark:
        fragment = "#" + rest
    return f"{base}?{integration.mask_query(query)[0]}{fragment}"


def _secret_values(response: Response, is_secret: Callable[[str], bool]) -> tuple[str, ...]:
    """Secret-named header values of the response and its request, and secret query values:
    masked wherever they show up (a tool result that prints ``response.headers``)."""
    found: list[str] = []
    request = response.request
    sources = [response.headers, request.headers if request is not None else {}]
    for headers in sources:
        for name, values in headers.items():
            key = name.decode("latin-1") if isinstance(name, bytes) else str(name)
            if is_secret(key):
                found.extend(
                    v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in values
                )
    query = response.url.partition("?")[2].partition("#")[0]
    if query:
        found.extend(integration.mask_query(query, is_secret)[1])
    return tuple(value for value in found if value)


def _fields(crawler: Crawler, response: Response, callback: Any = None) -> dict[str, Any]:
    """The recovery's event fields: which spider, which page, which callback."""
    spider = crawler.spider
    fields: dict[str, Any] = {
        "spider": getattr(spider, "name", None), "url": _masked_url(response.url),
    }  # fmt: skip
    if callback is not None:
        fields["callback"] = _qualname(callback)
    return fields
