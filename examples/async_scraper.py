"""An async scraper whose extractor breaks mid-run, recovered by crashoverride.

The "site" changes its payload format halfway through the run: `article_text` becomes `body`.
The records fetched after the change fail in `extract_article`; one recovery agent inspects the
payload, patches `extract_article` in the running process and re-runs the failed scrape; the
other failing records replay through the patched extractor, and the records after them need no
recovery at all. A follow-up job (declared on the handler) writes the permanent fix as a patch
file in the background, inside the application's task group.

Runs offline: the model is scripted. With a real model, pass `model="..."` (or nothing, for the
SDK default) and an API key instead.

    python examples/async_scraper.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

from agents.testing import ScriptedModel, assistant_message, function_call

from crashoverride import CrashOverride
from crashoverride.integrations.asyncio import TaskGroupRunner, task

URLS = [f"https://news.example/a/{n}" for n in range(1, 11)]
PATCH_DIR = tempfile.mkdtemp(prefix="scraper-fixes-")


async def download(url: str) -> dict[str, Any]:
    """The fake site: from article 4 on, the payload calls the text `body`."""
    number = int(url.rsplit("/", 1)[1])
    await asyncio.sleep(0.01 * number)
    key = "article_text" if number < 4 else "body"
    return {"url": url, key: f"Text of article {number}."}


def extract_article(payload: dict[str, Any]) -> str:
    return str(payload["article_text"])


PATCH = (
    "def extract_article(payload):\n"
    "    # The site renamed article_text to body; accept both.\n"
    "    text = payload.get('article_text', payload.get('body'))\n"
    "    if text is None:\n"
    "        raise KeyError('article_text')\n"
    "    return str(text)\n"
    "globals()['extract_article'] = extract_article\n"
    "rerun()"
)
# The follow-up agent saves the repaired function's source (kept by crashoverride for
# `inspect`) as the permanent fix, for a human to review and commit.
FIX_FILE = (
    "import inspect, os, __main__\n"
    "path = os.path.join(PATCH_DIR, 'extract_article.py')\n"
    "with open(path, 'w') as f:\n"
    "    f.write(inspect.getsource(__main__.extract_article))\n"
    "print(path)"
)


def scripted_model() -> ScriptedModel:
    """What a model would do here, scripted so the example runs offline."""
    return ScriptedModel(
        [
            [function_call("eval_python", {"expression": "sorted(caller['payload'])"},
                           call_id="look")],
            [function_call("exec_python", {"statements": PATCH}, call_id="patch")],
            [assistant_message("The site renamed article_text to body; patched extract_article.")],
            # The follow-up agent: write the permanent fix for a human to review.
            [function_call("exec_python", {"statements": FIX_FILE.replace(
                "PATCH_DIR", repr(PATCH_DIR))}, call_id="fix")],
            [assistant_message("Wrote the patch file.")],
        ]
    )  # fmt: skip


reports: list[Any] = []
crash_override = CrashOverride(
    project_prompt="A nightly news scraper. Article text must come from the site; never invent it.",
    model=scripted_model(),
    on_recovery=reports.append,
)

guard = task(
    crash_override,
    prompt="Return the article's text. If the payload format changed, repair `extract_article` "
    "for this and later records, then rerun(). Give up if the text is not in the payload.",
    followups=[f"Write the permanent fix for extract_article as a patch file in {PATCH_DIR}."],
)


@guard
async def scrape(url: str) -> str:
    payload = await download(url)
    return extract_article(payload)


async def main() -> dict[str, str]:
    articles: dict[str, str] = {}

    async def save(url: str) -> None:
        articles[url] = await scrape(url)

    # Follow-ups live in the application's task group and are awaited before it ends.
    async with TaskGroupRunner(grace=30):
        # Two nightly batches: the format changes during the first; the second needs no agent.
        for batch in (URLS[:6], URLS[6:]):
            async with asyncio.TaskGroup() as group:
                for url in batch:
                    group.create_task(save(url))
            print(f"batch done, recoveries so far: {len(reports)}")
    return articles


if __name__ == "__main__":
    saved = asyncio.run(main())
    for url in URLS:
        print(f"saved {url}: {saved[url]}")
    print(f"{len(saved)} articles saved")
    agent_runs = [r for r in reports if r.via == "agent"]
    replays = [r for r in reports if r.via == "replay"]
    print(f"agent runs: {len(agent_runs)}, replays after the repair: {len(replays)}")
    for name in sorted(os.listdir(PATCH_DIR)):
        with open(os.path.join(PATCH_DIR, name)) as fix:
            print(f"permanent fix {name}:\n{fix.read()}")
