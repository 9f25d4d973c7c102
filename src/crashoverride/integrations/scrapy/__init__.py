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

try:
    from crashoverride.integrations.scrapy._callback import DEFAULT_EXCERPT  # noqa: F401
    from crashoverride.integrations.scrapy._middleware import (
        STATS_DEDUPLICATED,
        STATS_FAILED,
        STATS_RECOVERED,
        CrashOverrideMiddleware,
        callback_failed,
        callback_recovered,
    )
except ImportError as missing:  # pragma: no cover - the extra is installed in the test suite
    # Only Scrapy (or its Twisted) missing is the extra's fault; any other ImportError is not.
    if (missing.name or "").partition(".")[0] not in ("scrapy", "twisted"):
        raise
    raise ImportError(
        "crashoverride.integrations.scrapy needs Scrapy: pip install 'crashoverride[scrapy]'",
        name=missing.name,
    ) from missing

__all__ = [
    "STATS_DEDUPLICATED",
    "STATS_FAILED",
    "STATS_RECOVERED",
    "CrashOverrideMiddleware",
    "callback_failed",
    "callback_recovered",
]
