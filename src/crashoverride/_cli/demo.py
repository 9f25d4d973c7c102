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
    import httpx
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
            response = httpx.get(f"http://127.0.0.1:{port}/quote?kg={kg}", timeout=60)
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


# ------------------------------------------------------ scene 3: a background task + follow-up


def background_script() -> list[Any]:
    from crashoverride.testing import done, exec_python

    write_patch = (
        "import pathlib, tempfile\n"
        "path = pathlib.Path(tempfile.gettempdir()) / f'crashoverride-demo-{followup_id}.patch'\n"
        "path.write_text('- return round(amount * rates[\"EUR\"], 2)\\n'\n"
        "                '+ return round(amount * rates.get(\"EUR\", 0.92), 2)\\n')\n"
        "print(path)"
    )
    return [
        exec_python(
            "spawn_followup('Write the permanent fix for the missing EUR rate as a patch file.')\n"
            "set_result(round(args[0] * 0.92, 2))"
        ),
        done("Used the documented 0.92 EUR rate and queued a follow-up for the real fix."),
        # The follow-up job is an agent run of its own, after the task already returned:
        exec_python(write_patch),
        done("Wrote a patch proposal that falls back to the documented rate."),
    ]


async def scene_background(make: Callable[[list[Any]], CrashOverride]) -> list[Claim]:
    from crashoverride.followups import TaskGroupRunner

    task = importlib.import_module("crashoverride.integrations.asyncio").task

    co = make(background_script())
    mark = len(EVENTS)
    guard = task(co, prompt="Return the converted amount; EUR uses the documented 0.92 rate.")
    rates: dict[str, float] = {}
    results: list[float] = []

    @guard  # type: ignore[untyped-decorator]
    async def convert(amount: float) -> float:
        return round(amount * rates["EUR"], 2)

    async def one() -> None:
        results.append(await convert(100.0))
        print(f"    convert(100.0) -> {results[-1]} (the task is done; the follow-up runs on)")

    async with TaskGroupRunner(grace=20), anyio.create_task_group() as tg:
        tg.start_soon(one)
    events = recorded(mark)
    names = [e["event"] for e in events]
    patches = [_patch_path(e) for e in events if e["event"] == "followup.succeeded"]
    written = [p for p in patches if p is not None and p.exists()]
    for path in written:
        print(f"    follow-up wrote {path}:")
        print("      " + path.read_text().replace("\n", "\n      ").rstrip())
        path.unlink()
    return [
        ("the task returned the recovered value", results == [92.0], f"{results}"),
        ("a follow-up job started after the recovery", "followup.started" in names, ""),
        ("the follow-up job completed", "followup.succeeded" in names, ""),
        ("the follow-up's patch file exists", bool(written), f"{patches}"),
    ]


def _patch_path(event: dict[str, Any]) -> Any:
    import pathlib
    import tempfile

    job = event.get("followup_id")
    if not job:
        return None
    return pathlib.Path(tempfile.gettempdir()) / f"crashoverride-demo-{job}.patch"


# ---------------------------------------------------------------------- event recording

EVENTS: list[dict[str, Any]] = []


def record(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor the demo (an application) installs to check its claims."""
    EVENTS.append(dict(event))
    return event


def recorded(since: int) -> list[dict[str, Any]]:
    return EVENTS[since:]
