"""The application of the scrapers scenarios (see ``scenarios/scrapers.py``).

Only application code and its "upstream" data live here: this module is the agent's
namespace (each trial runs in a fresh copy of it), so it reads like the application and says
nothing about what changed. The ground truth, the oracles and the scripted agents live in the
scenarios module, out of the agent's namespace.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any


@dataclass
class Page:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


SITE: dict[str, Page] = {}  # the site as it is today (each scenario's play fills it in)
DOWNLOADS: list[str] = []
SAVED: dict[str, str] = {}  # what the scraper stores


async def download(url: str) -> Page:
    DOWNLOADS.append(url)
    return SITE[url]


async def scrape_all(co: Any, prompt: str, extract: Callable[[Page], str]) -> list[Any]:
    """Every page of SITE through ``extract`` into SAVED, each page a protected block.

    Returns what each page raised (None for the pages saved): a failed page is skipped.
    """
    failures = []
    for url in list(SITE):
        text: str | None = None
        failure = None
        try:
            async with co.handler(prompt):
                page = await download(url)
                text = extract(page)
            if text is not None:
                SAVED[url] = text
        except Exception as exc:
            failure = exc
        failures.append(failure)
    return failures


TITLE = re.compile(r'<h1 class="title">(.*?)</h1>')


def extract_title(page: Page) -> str:
    return str(TITLE.findall(page.body.decode())[0])


def page_text(page: Page) -> str:
    return page.body.decode("utf-8")


def published_on(page: Page) -> str:
    shown = re.findall(r"<time>(.*?)</time>", page.body.decode())[0]
    return date.fromisoformat(shown).isoformat()


def article_of(page: Page) -> str:
    if page.status != 200:
        raise RuntimeError(f"HTTP {page.status}: {page.body[:60].decode(errors='replace')}")
    return page.body.decode()


def story_text(page: Page) -> str:
    found = re.findall(r'<div class="story">(.*?)</div>', page.body.decode(), re.S)
    if not found:
        raise LookupError("no story on the page")
    return str(found[0])
