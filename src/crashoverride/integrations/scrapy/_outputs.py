"""What a callback yields: recorded as it goes, and a re-run's outputs without the ones the
failed run had already sent on."""

from __future__ import annotations

import copy
import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from scrapy import Request
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.misc import arg_to_iter
from twisted.internet.defer import Deferred


class Yielded:
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


DROPPED = object()


def fresh(
    outputs: list[Any], yielded: Yielded, fingerprint: Callable[[Request], bytes]
) -> Iterator[Any]:
    """The re-run's outputs, each one the failed run already yielded replaced by ``DROPPED``
    (as many times as it yielded it): requests by their fingerprint, items by equality."""
    requests = Counter(fingerprint(request) for request in yielded.requests)
    items = list(yielded.items)
    for output in outputs:
        if isinstance(output, Request):
            key = fingerprint(output)
            if requests[key] > 0:
                requests[key] -= 1
                yield DROPPED
                continue
        else:
            index = _index_of(items, output)
            if index is not None:
                del items[index]
                yield DROPPED
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


async def settled(output: Any) -> Any:
    """A callback's return value, awaited when it is a coroutine (``async def``) or a
    Deferred; an async generator is left as it is."""
    if isinstance(output, Deferred):
        return await maybe_deferred_to_future(output)
    if inspect.isawaitable(output) and not hasattr(output, "__aiter__"):
        return await output
    return output


def as_list(value: Any) -> list[Any]:
    """Outputs as Scrapy reads a callback's return value: None is none, an item or a request
    is one, an iterable is its elements."""
    return list(arg_to_iter(value))
