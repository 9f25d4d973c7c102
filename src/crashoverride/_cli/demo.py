"""``crashoverride demo``: three recoveries you can watch, offline, in well under a minute.

Offline the model is scripted (``agents.testing.ScriptedModel``): every agent step is written
down below and the demo says so. Everything else is real: the SDK run loop, the tools executing
in the live process, uvicorn on loopback, the follow-up job. Each scene checks its claims
against what actually happened and reports any claim that did not hold.
"""

from __future__ import annotations

import importlib
import socket
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import anyio

from crashoverride import CrashOverride
from crashoverride._observe.report import RecoveryReport

Claim = tuple[str, bool, str]

# --------------------------------------------------------------------- scene 1: the scraper

PAGES = [
    {"url": "/news/1", "article_text": "Rain expected on Tuesday."},
    {"url": "/news/2", "article_text": "The bridge reopens in May."},
    {"url": "/news/3", "body": "The source renamed its field today."},  # the format change
    {"url": "/news/4", "body": "Later pages use the new format too."},
]


def extract_article(payload: dict[str, str]) -> str:
    return payload["article_text"]


_ORIGINAL_EXTRACT = extract_article


async def download(index: int) -> dict[str, str]:
    await anyio.sleep(0.01)  # stands in for the network
    return dict(PAGES[index])


def scraper_script() -> list[Any]:
    from crashoverride.testing import done, eval_python, exec_python

    patch = (
        "def extract_article(payload):\n"
        "    # The source renamed `article_text` to `body`; accept both.\n"
        "    if 'article_text' in payload:\n"
        "        return payload['article_text']\n"
        "    return payload['body']\n"
        "globals()['extract_article'] = extract_article\n"
        "caller['article'] = extract_article(payload)\n"
        "caller['article']"
    )
    return [
        eval_python("payload"),
        exec_python("import inspect\nprint(inspect.getsource(extract_article))"),
        exec_python(patch),
        done("The source renamed `article_text` to `body`; patched extract_article."),
    ]


async def scene_scraper(make: Callable[[list[Any]], CrashOverride]) -> list[Claim]:
    globals()["extract_article"] = _ORIGINAL_EXTRACT
    co = make(scraper_script())
    reports: list[RecoveryReport] = []
    articles: list[str | None] = []
    for index in range(len(PAGES)):
        handler = co.handler(
            prompt="Leave `article` containing the page's real text. If the format changed, "
            "repair the extractor for this and later pages. Never invent text."
        )
        article = None
        async with handler:
            payload = await download(index)
            article = extract_article(payload)
        if handler.report is not None:
            reports.append(handler.report)
        articles.append(article)
        print(f"    {PAGES[index]['url']}: {article!r}")
    expected = [page.get("article_text") or page["body"] for page in PAGES]
    patched = globals()["extract_article"] is not _ORIGINAL_EXTRACT
    return [
        ("every page's article is its real text", articles == expected, f"{articles}"),
        ("exactly one recovery ran", len(reports) == 1, f"{len(reports)} recoveries"),
        ("the extractor was patched in the live process", patched, ""),
        ("the page after the fix needed no recovery", len(reports) == 1 and patched, ""),
    ]


# ------------------------------------------------------------------ scene 2: an ASGI endpoint


def shipping_cost(weight_kg: float) -> float:
    raise NotImplementedError("shipping_cost: 4.50 base plus 1.25 per started kg")


_ORIGINAL_SHIPPING = shipping_cost


def endpoint_script() -> list[Any]:
    from crashoverride.testing import done, exec_python

    implement = (
        "import math\n"
        "def shipping_cost(weight_kg):\n"
        "    return round(4.50 + 1.25 * math.ceil(weight_kg), 2)\n"
        "globals()['shipping_cost'] = shipping_cost\n"
        "r = await replay_request()\n"
        "r.status, r.json()"
    )
    return [
        exec_python("import inspect\nprint(inspect.getsource(shipping_cost))"),
        exec_python(implement),
        done("Implemented shipping_cost from its docstring rule and replayed the request."),
    ]


def _serve(app: Any) -> tuple[Any, threading.Thread, socket.socket]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    return server, thread, sock


def scene_endpoint(make: Callable[[list[Any]], CrashOverride]) -> list[Claim]:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    # Through importlib: ``crashoverride.integrations`` is mapped from ``integrations/`` at
    # install time, which type checkers reading this source tree do not see.
    CrashOverrideMiddleware = importlib.import_module(
        "crashoverride.integrations.asgi"
    ).CrashOverrideMiddleware

    globals()["shipping_cost"] = _ORIGINAL_SHIPPING
    co = make(endpoint_script())
    mark = len(EVENTS)

    async def quote(request: Request) -> JSONResponse:
        weight = float(request.query_params["kg"])
        return JSONResponse({"kg": weight, "shipping": shipping_cost(weight)})

    app = Starlette(routes=[Route("/quote", quote)])
    app.add_middleware(
        CrashOverrideMiddleware,
        crash_override=co,
        prompt="Answer with the real quote; implement missing pricing code from its docstring.",
    )
    server, thread, sock = _serve(app)
    port = sock.getsockname()[1]
    responses = []
    try:
        for kg in ("2.5", "1"):
            response = _get(f"http://127.0.0.1:{port}/quote?kg={kg}")
            responses.append(response)
            print(f"    GET /quote?kg={kg} -> {response.status_code} {response.text}")
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    first, second = responses
    started = [e for e in recorded(mark) if e["event"] == "recovery.started"]
    return [
        ("uvicorn served on 127.0.0.1", bool(server.started), f"port {port}"),
        ("the failing request was answered 200", first.status_code == 200, first.text),
        ("with the price the docstring rule gives",
         first.status_code == 200 and first.json()["shipping"] == 8.25, first.text),
        ("the next request was answered by the patched code",
         second.status_code == 200 and second.json()["shipping"] == 5.75, second.text),
        ("only one recovery ran for both requests", len(started) == 1, f"{len(started)}"),
    ]  # fmt: skip


class _Response:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code, self.text = status_code, text

    def json(self) -> Any:
        import json

        return json.loads(self.text)


def _get(url: str) -> _Response:
    """One GET with the standard library (the demo needs no HTTP client package)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return _Response(answer.status, answer.read().decode())
    except urllib.error.HTTPError as error:
        return _Response(error.code, error.read().decode())


# ------------------------------------------------- scene 3: a background task + its follow-up

# The application of this scene is a real module on disk (written to a temporary directory), so
# the follow-up's patch is a real diff of a real file, which the scene then applies and runs.
RATES_APP = '''\
"""Converts amounts with the rates of a daily feed (a file the feed's publisher rewrites)."""

import json
import pathlib

FEED = pathlib.Path(__file__).with_name("rates.json")


def load_rates():
    """The rates the feed publishes, by currency code."""
    return json.loads(FEED.read_text())["rates"]


async def convert(amount, currency):
    rates = load_rates()
    return round(amount * rates[currency], 2)
'''

# Today the publisher switched the feed to a list of entries; EUR is there, CHF is not.
FEED = {"base": "USD", "rates": [{"code": "EUR", "rate": 0.9231}, {"code": "GBP", "rate": 0.7874}]}

FIXED_LOADER = '''\
def load_rates():
    """The rates the feed publishes, by currency code (both of the feed's formats)."""
    rates = json.loads(FEED.read_text())["rates"]
    if isinstance(rates, list):  # the feed now lists {"code": ..., "rate": ...} entries
        rates = {entry["code"]: entry["rate"] for entry in rates}
    return rates
'''


def background_script() -> list[Any]:
    from crashoverride.testing import done, exec_python, give_up

    recover = (
        f"replace_function(load_rates, {FIXED_LOADER!r})\n"
        "print(load_rates())\n"
        "rerun()\n"
        "spawn_followup('Propose the permanent fix of load_rates as a patch file next to its '\n"
        "               'source, for review; do not change the source itself.')"
    )
    # The follow-up finds the file in the report's traceback and diffs the real file.
    propose = (
        "import difflib, pathlib, re\n"
        'path = pathlib.Path(re.findall(r\'File "([^"]+\\.py)", line \\d+, in convert\',\n'
        "                               str(report.traceback))[-1])\n"
        "before = path.read_text()\n"
        "start = before.index('def load_rates():')\n"
        "end = before.index('\\n\\n\\n', start) + 1\n"
        f"after = before[:start] + {FIXED_LOADER!r} + before[end:]\n"
        "diff = ''.join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),\n"
        "                                    f'a/{path.name}', f'b/{path.name}'))\n"
        "patch = path.with_name(f'{path.name}.{followup_id}.patch')\n"
        "patch.write_text(diff)\n"
        "print(patch)"
    )
    return [
        # Recovery 1: EUR is in the feed, in its new format.
        exec_python("print(FEED.read_text())"),
        exec_python(recover),
        done("The feed now lists {code, rate} entries; load_rates reads both formats (patched "
             "live), the task ran again with the feed's EUR rate, and a follow-up proposes "
             "the permanent patch."),
        # The follow-up job: an agent run of its own, after the task already returned.
        exec_python(propose),
        done("Proposed the fix of load_rates as a patch next to rates_app.py."),
        # Recovery 2: CHF is in no source the agent can read; it will not make a rate up.
        exec_python("print(sorted(load_rates()))"),
        give_up("The feed publishes no CHF rate, and no other source here has one: any number "
                "returned would be invented."),
    ]  # fmt: skip


async def scene_background(make: Callable[[list[Any]], CrashOverride]) -> list[Claim]:
    import json
    import pathlib
    import shutil
    import tempfile

    from crashoverride.followups import TaskGroupRunner

    task = importlib.import_module("crashoverride.integrations.asyncio").task
    where = pathlib.Path(tempfile.mkdtemp(prefix="crashoverride-demo-"))
    try:
        source = where / "rates_app.py"
        source.write_text(RATES_APP)
        (where / "rates.json").write_text(json.dumps(FEED))
        return await _background(make, task, _load(source, "rates_app"), TaskGroupRunner)
    finally:
        shutil.rmtree(where, ignore_errors=True)


async def _background(
    make: Callable[[list[Any]], CrashOverride], task: Any, app: Any, runner: Any
) -> list[Claim]:
    import pathlib

    co = make(background_script())
    mark = len(EVENTS)
    guard = task(co, prompt="Return the converted amount at the feed's real rate; never make a "
                 "rate up.")  # fmt: skip
    convert = guard(app.convert)
    source = pathlib.Path(app.__file__)
    eur: list[float] = []

    async def one() -> None:
        eur.append(await convert(100.0, "EUR"))
        print(f"    convert(100.0, 'EUR') -> {eur[-1]} (the task is done; the follow-up runs on)")

    async with runner(grace=20), anyio.create_task_group() as tg:
        tg.start_soon(one)
    patches, unchanged = _proposals(source)
    works = await _patched_copy_converts(source, patches)
    chf: BaseException | None = None
    try:
        await convert(100.0, "CHF")
    except KeyError as exc:
        chf = exc
    notes = "".join(getattr(chf, "__notes__", []))
    print(f"    convert(100.0, 'CHF') -> raised {chf!r}, with the note:\n      {notes}")
    names = [e["event"] for e in recorded(mark)]
    return [
        ("EUR: the task returned 100 at the feed's real rate (0.9231)", eur == [92.31], f"{eur}"),
        ("a follow-up job ran after the task returned and completed",
         "followup.succeeded" in names, ""),
        ("it wrote a real patch of rates_app.py; the source itself is unchanged",
         len(patches) == 1 and unchanged, f"{patches}"),
        ("the patch applies to a copy of the source, which converts EUR with no recovery",
         works, ""),
        ("CHF (in no source): nothing invented, the KeyError reached the caller with a note",
         isinstance(chf, KeyError) and "gave up" in notes.lower(), f"{chf!r} {notes!r}"),
    ]  # fmt: skip


def _proposals(source: Any) -> tuple[list[Any], bool]:
    """The patch files proposed for ``source`` (shown), and whether it is still as written."""
    patches = sorted(source.parent.glob(f"{source.name}.*.patch"))
    for patch in patches:
        print(f"    the follow-up proposed {patch.name}:")
        print("      " + patch.read_text().rstrip().replace("\n", "\n      "))
    return patches, source.read_text() == RATES_APP


def _load(path: Any, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _patched_copy_converts(source: Any, patches: list[Any]) -> bool:
    """Apply the proposed patch to a copy of ``source``; does the copy convert EUR unaided?"""
    if len(patches) != 1:
        return False
    try:
        patched = apply_patch(source.read_text(), patches[0].read_text())
    except ValueError as exc:
        print(f"    the patch does not apply: {exc}")
        return False
    copy = source.with_name("rates_app_patched.py")
    copy.write_text(patched)
    value = await _load(copy, "rates_app_patched").convert(100.0, "EUR")
    return bool(value == 92.31)


def apply_patch(text: str, patch: str) -> str:
    """``text`` with the unified diff ``patch`` applied; ValueError where a line disagrees."""
    import re

    old = text.splitlines(keepends=True)
    new: list[str] = []
    cursor = 0
    lines = patch.splitlines(keepends=True)
    index = 0
    while index < len(lines):
        hunk = re.match(r"@@ -(\d+)(?:,(\d+))? ", lines[index])
        index += 1
        if hunk is None:
            continue
        start = int(hunk.group(1)) - (0 if hunk.group(2) == "0" else 1)
        if start < cursor:
            raise ValueError("hunks overlap or are out of order")
        new += old[cursor:start]
        cursor = start
        while index < len(lines) and lines[index][:1] in (" ", "-", "+"):
            tag, line = lines[index][0], lines[index][1:]
            if tag != "+":
                if cursor >= len(old) or old[cursor] != line:
                    raise ValueError(f"line {cursor + 1} is not {line!r}")
                cursor += 1
            if tag != "-":
                new.append(line)
            index += 1
    return "".join(new + old[cursor:])


# ---------------------------------------------------------------------- event recording

EVENTS: list[dict[str, Any]] = []


def record(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor the demo (an application) installs to check its claims."""
    EVENTS.append(dict(event))
    return event


def recorded(since: int) -> list[dict[str, Any]]:
    return EVENTS[since:]
