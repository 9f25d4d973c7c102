"""One failed callback as the recovery sees it: its ``Block`` (the response, the callback's
frame and source, masked secrets), its brief, and the callback run again."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from types import FrameType, MappingProxyType
from typing import Any

from scrapy.crawler import Crawler
from scrapy.http import Response

from crashoverride import Handler, integration
from crashoverride.integrations.scrapy._outputs import as_list, settled

DEFAULT_EXCERPT = 2000
SOURCE_SHOWN = 6000

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


class FailedCallback:
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
        output = await settled(self.callback(self.response, **self.kwargs))
        if hasattr(output, "__aiter__"):
            return [item async for item in output]
        return as_list(output)

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
            fields=fields(self.crawler, self.response, self.described),
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
            source=integration.clip(_source(self.described), SOURCE_SHOWN),
        )


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


def fields(crawler: Crawler, response: Response, callback: Any = None) -> dict[str, Any]:
    """The recovery's event fields: which spider, which page, which callback."""
    spider = crawler.spider
    fields: dict[str, Any] = {
        "spider": getattr(spider, "name", None), "url": _masked_url(response.url),
    }  # fmt: skip
    if callback is not None:
        fields["callback"] = _qualname(callback)
    return fields
