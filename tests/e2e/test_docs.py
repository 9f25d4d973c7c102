"""The documentation is tested: every ```python block runs, and the references are the code's.

The pages are README.md and every Markdown file under docs/. A block runs as it is written, in a
fresh namespace, compiled as its page at its own line numbers (tracebacks and
``inspect.getsource`` point into the page). Top-level ``await`` / ``async with`` run on an event
loop, as in ``python -m asyncio``.

A block that continues an earlier example (it uses ``co``, ``app``, ``celery_app``...) says so
with a marker on the line right before it, ``<!-- docs-test: NAME -->``: the setup ``NAME``
below gives it those names and the real components it needs (a uvicorn server, a Celery app),
serves its model turns from a ``MockServer``, and checks what the page claims happened (the
Celery block's worker is started with the page's own ``-Q`` line, on the local Redis). A block
with no marker must run on its own. ``<!-- docs-test: fragment: why -->`` marks a block that
cannot run at all; it must still parse, and running it must fail for want of a name (a block
that runs needs no such excuse).

A block whose only line is a snippet include, ``--8<-- "examples/<file>.py"``, shows an example
file: it is not run here; the example must be run by a test (tests/e2e/test_examples.py, or the
test of the feature it shows), which is checked below. An include of a module of the package
(``--8<-- "src/crashoverride/<module>.py"``, the demo's Celery shop) is not run here either: it
is the package's own code, which its tests run.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib.util
import inspect
import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

import crashoverride
from crashoverride import CrashOverride
from crashoverride._config.settings import APP, FIELDS, HANDLER
from crashoverride.testing import MockServer, Script, done, exec_python
from tests.helpers import await_for

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
MARKER = re.compile(r"<!-- docs-test: (.+?) -->")
SNIPPET = re.compile(r'--8<-- "((?:examples|src/crashoverride)/[\w./-]+\.py)"')


def _generator() -> ModuleType:
    """The MkDocs hook that generates the reference pages (docs/_hooks/generate.py)."""
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "_hooks" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATE = _generator()

# Celery's Redis result backend calls a deprecated redis-py method (not ours to fix).
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first code line
    code: str
    marker: str | None

    @property
    def snippet(self) -> str | None:
        """The example file a block only includes, or None."""
        lines = self.code.strip().splitlines()
        found = SNIPPET.fullmatch(lines[0].strip()) if len(lines) == 1 else None
        return found.group(1) if found else None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() == "```python":
            indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
            end = lines.index(indent + "```", index + 1)
            marked = MARKER.fullmatch(lines[index - 1].strip())
            code = textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n"
            found.append(Block(page, index + 2, code, marked.group(1) if marked else None))
            index = end
        index += 1
    return found


def _run(block: Block, namespace: dict[str, Any]) -> None:
    source = "\n" * (block.line - 1) + block.code
    code = compile(source, str(block.page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:

        async def main() -> None:
            await eval(code, namespace)

        anyio.run(main)
    else:
        exec(code, namespace)


# ------------------------------------------------------------------------------------- setups

Setup = Callable[[dict[str, Any], pytest.MonkeyPatch, Path], contextlib.AbstractContextManager[Any]]
SETUPS: dict[str, Setup] = {}


def setup(name: str) -> Callable[[Callable[..., Iterator[Any]]], Setup]:
    def register(fn: Callable[..., Iterator[Any]]) -> Setup:
        SETUPS[name] = contextlib.contextmanager(fn)
        return SETUPS[name]

    return register


@contextlib.contextmanager
def default_model(monkeypatch: pytest.MonkeyPatch, plan: Script) -> Iterator[MockServer]:
    """A ``CrashOverride()`` built as the pages build it (no model, no base URL, a key in the
    environment) gets its turns from a ``MockServer``: the SDK's default client is pointed at
    it, speaking chat completions."""
    from agents import set_default_openai_api

    with MockServer(plan) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-test")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        set_default_openai_api("chat_completions")
        try:
            yield server
        finally:
            set_default_openai_api("responses")
        server.assert_complete()


@setup("scraper")
def _scraper(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path) -> Iterator[None]:
    pages = {"/1": {"article_text": "one"}, "/2": {"body": "two"}, "/3": {"body": "three"}}
    saved: list[str] = []
    ns.update(urls=list(pages), download=pages.__getitem__, save=saved.append)
    repair = (
        "replace_function(extract_article, "
        "'def extract_article(payload):\\n    return payload[\"body\"]\\n')\n"
        "caller['article'] = extract_article(payload)"
    )
    plan = Script(exec_python(repair), done("the extractor reads `body` now"))
    with default_model(monkeypatch, plan) as server:
        yield
    assert saved == ["one", "two", "three"]
    assert len(server.requests) == 2  # one recovery: later pages ran the patched extractor


@setup("async-payload")
def _async(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path) -> Iterator[None]:
    async def fetch_payload() -> dict[str, Any]:
        raise ConnectionError("upstream reset the connection")

    plan = Script(exec_python("caller['payload'] = {'status': 'ok'}"), done("fetched again"))
    with default_model(monkeypatch, plan):
        ns.update(co=CrashOverride(), fetch_payload=fetch_payload)
        yield
    assert ns["payload"] == {"status": "ok"}


@setup("invoice")
def _invoice(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path) -> Iterator[None]:
    @dataclass
    class Invoice:
        total_cents: int

        @classmethod
        def from_json(cls, raw: bytes) -> Invoice:
            return cls(json.loads(raw)["total_cents"])

    read = "import json\nset_result(Invoice(json.loads(args[0])['amount_cents']))"
    plan = Script(exec_python(read), done("read amount_cents"))
    with default_model(monkeypatch, plan):
        ns.update(co=CrashOverride(), Invoice=Invoice)
        yield
        invoice = anyio.run(ns["parse_invoice"], b'{"amount_cents": 4200}')
    assert invoice == Invoice(4200)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@setup("asgi")
def _asgi(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path) -> Iterator[None]:
    from starlette.applications import Starlette
    from starlette.routing import Route

    from crashoverride.testing.asgi import respond
    from tests.integrations.asgi_support import serve

    async def price(request: Any) -> Any:
        raise KeyError("amount")  # the upstream renamed the field

    app = Starlette(routes=[Route("/api/price", price), Route("/price", price)])
    plan = Script(respond(200, {"amount": 42}), done("answered"))
    with default_model(monkeypatch, plan) as server:
        ns.update(app=app, co=CrashOverride())
        yield
        with serve(app) as served:
            recovered = _get(served.url + "/api/price")
            outside = _get(served.url + "/price")  # not under include=["/api/*"]
        assert len(server.requests) == 2  # one recovery (two turns); /price never asked
    assert recovered == (200, '{"amount":42}')
    assert outside[0] == 500


@setup("tasks")
def _tasks(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path) -> Iterator[None]:
    fetched: list[str] = []

    async def fetch(url: str) -> str:
        fetched.append(url)
        raise TimeoutError(url)

    plan = Script(exec_python("set_result('<html>cached</html>')"), done("used the cache"))
    with default_model(monkeypatch, plan):
        ns.update(co=CrashOverride(), fetch=fetch, url="/a", other="/b")
        yield
    assert fetched == ["/b"]  # recovered: the group ended without an exception


@setup("celery")
def _celery(ns: dict[str, Any], _: pytest.MonkeyPatch, __: Path) -> Iterator[None]:
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    from crashoverride.integrations.celery import FOLLOWUP_QUEUE, followup_queue, queue_consumers
    from tests.integrations.celery_support import redis_url

    text = Path(ns["__page__"]).read_text()
    # The page names the queue ``install()`` uses, wherever it names one...
    named = set(re.findall(r"crashoverride\.followups?\b(?!\.)", text)) - {"crashoverride.followup"}
    assert named == {FOLLOWUP_QUEUE}
    # ...and a worker started as the page says consumes it (a real worker, on Redis).
    command = re.search(r"celery -A shop worker -Q (\S+)", text)
    assert command, "the page shows how to start a worker"
    co = CrashOverride()
    with redis_url() as url:
        url = url.rsplit("/", 1)[0] + "/13"  # a database of its own: the queues are real names
        app = Celery("shop", broker=url, backend=url)
        app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
        ns.update(celery_app=app, co=co)
        yield
        assert app.conf.crashoverride is co  # the instance the app's tasks use
        assert followup_queue(app) == FOLLOWUP_QUEUE
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING",
                          queues=command.group(1).split(","), shutdown_timeout=30):  # fmt: skip
            assert ns["render"].delay(7).get(timeout=30) is None  # the body ran: ``...``
            assert queue_consumers(app, FOLLOWUP_QUEUE)
        app.backend.client.connection_pool.disconnect()
        app.close()
        # Close the worker's connections now: a socket collected later would fail another test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@setup("integration")
def _integration(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path) -> Iterator[None]:
    async def handle(message: dict[str, Any]) -> str:
        return str(message["text"])

    plan = Script(exec_python("set_result(args[0]['body'])"), done("read body"))
    with default_model(monkeypatch, plan):
        handler = CrashOverride().handler(prompt="Return the message's text.")
        ns.update(handler=handler, handle=handle, message={"body": "hello"})
        yield
    assert ns["value"] == "hello"


@setup("pytest-file")
def _pytest_file(ns: dict[str, Any], _: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    yield  # the block defines the tests; pytest runs them, with the plugin, in a process
    test_file = tmp_path / "test_example.py"
    test_file.write_text(ns["__block__"])
    done_ = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done_.returncode == 0, done_.stdout + done_.stderr
    assert re.search(r"\b2 passed\b", done_.stdout), done_.stdout


@setup("background-signup")
def _signup(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path) -> Iterator[None]:
    from fastapi import BackgroundTasks, FastAPI
    from starlette.background import BackgroundTask
    from starlette.responses import PlainTextResponse

    from crashoverride.integrations.asgi import CrashOverrideMiddleware
    from tests.integrations.asgi_support import serve

    sent: list[str] = []
    attempts: list[str] = []

    def send_welcome(email: str) -> None:
        attempts.append(email)
        if len(attempts) == 1:
            raise ConnectionError("smtp: connection reset")
        sent.append(f"welcome {email}")

    def count_signup(email: str) -> None:
        sent.append(f"counted {email}")

    app = FastAPI()
    plan = Script(exec_python("rerun()"), done("the mail server is back; sent once"))
    with default_model(monkeypatch, plan):
        app.add_middleware(CrashOverrideMiddleware, crash_override=CrashOverride())
        ns.update(app=app, BackgroundTasks=BackgroundTasks, BackgroundTask=BackgroundTask,
                  PlainTextResponse=PlainTextResponse, send_welcome=send_welcome,
                  count_signup=count_signup)  # fmt: skip
        yield
        with serve(app) as served:
            request = urllib.request.Request(served.url + "/signup?email=a@example.com",
                                             method="POST")  # fmt: skip
            with urllib.request.urlopen(request, timeout=60) as answer:
                assert json.loads(answer.read()) == {"queued": "a@example.com"}
            anyio.run(await_for, lambda: len(sent) == 2, 60)
    assert sent == ["welcome a@example.com", "counted a@example.com"]


@setup("fleet")
def _fleet(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, __: Path) -> Iterator[None]:
    monkeypatch.setenv("CRASHOVERRIDE_FLEET_KEY", "readme-fleet-key-0123456789")
    yield
    fleet = ns["co"]._settings.coordination  # built, validated; nothing connects before a failure
    assert (fleet.namespace, fleet.apply_fixes) == ("shop-api", "on-failure")


@setup("given-co")
def _given_co(ns: dict[str, Any], _: pytest.MonkeyPatch, __: Path) -> Iterator[None]:
    ns["co"] = CrashOverride()
    yield
    (protected,) = [v for v in ns.values() if getattr(v, "__wrapped__", None) is not None]
    assert protected("a@example.com") is None  # the decorated function, called as usual


def _fresh_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a block set OpenTelemetry's global providers (once per process, by design), and
    restore the previous ones after it (what opentelemetry-test-utils does)."""
    from opentelemetry import trace
    from opentelemetry.metrics import _internal as metrics_internal
    from opentelemetry.util._once import Once

    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_PROXY_TRACER_PROVIDER", trace.ProxyTracerProvider())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    proxy = metrics_internal._ProxyMeterProvider()
    monkeypatch.setattr(metrics_internal, "_PROXY_METER_PROVIDER", proxy)


def _recorded_spans() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(spans))  # type: ignore[attr-defined]
    return spans


def _recovery_parent(spans: Any) -> Any:
    """The span the one recovery span sits in."""
    finished = spans.get_finished_spans()
    (recovery,) = [s for s in finished if s.name == "crashoverride.recovery"]
    (parent,) = [s for s in finished if s.context.span_id == recovery.parent.span_id]
    return parent


@setup("operating-fastapi")
def _operating_fastapi(
    ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[None]:
    import sentry_sdk
    from opentelemetry import metrics, trace

    from crashoverride.testing.asgi import respond
    from tests.integrations.asgi_support import serve

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SENTRY_DSN", raising=False)
    _fresh_telemetry(monkeypatch)
    plan = Script(respond(200, {"amount": 42}), done("answered"))
    try:
        with default_model(monkeypatch, plan):
            yield
            app = ns["app"]

            @app.get("/api/price")
            async def price() -> None:
                raise KeyError("amount")  # the upstream renamed the field

            spans = _recorded_spans()
            with serve(app) as served:
                assert _get(served.url + "/api/price") == (200, '{"amount":42}')
    finally:
        trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
        metrics.get_meter_provider().shutdown()  # type: ignore[attr-defined]
        sentry_sdk.get_global_scope().set_client(None)
    (line,) = (tmp_path / "recoveries.jsonl").read_text().splitlines()
    assert json.loads(line)["outcome"] == "recovered"
    # Inside the request's trace: under a span of the request (the ASGI middleware's).
    parent = _recovery_parent(spans)
    assert parent.name.startswith("GET /api/price")


@setup("operating-celery")
def _operating_celery(
    ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch, _: Path
) -> Iterator[None]:
    import uuid

    import redis
    import sentry_sdk
    from celery import Celery
    from celery.signals import worker_process_init
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    from crashoverride.integrations.celery import CrashOverrideTask

    stream = f"readme-ledger:{uuid.uuid4().hex}"
    url = f"redis://127.0.0.1:6379/11?stream={stream}"  # 13 is the fleet tests' (flushed)
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.delenv("SENTRY_DSN", raising=False)
    _fresh_telemetry(monkeypatch)
    app = Celery("shop", broker="memory://")
    app.conf.task_always_eager = True  # the task runs here; its span is the same as a worker's
    ns["celery_app"] = app
    client = redis.Redis.from_url(url.split("?")[0])
    plan = Script(exec_python("set_result(42)"), done("answered"))
    try:
        with default_model(monkeypatch, plan):
            yield
            ns["set_up_telemetry"]()  # what worker_process_init does in each worker process
            spans = _recorded_spans()

            @app.task(base=CrashOverrideTask, recovery_prompt="Return the answer.")
            def answer() -> int:
                raise KeyError("answer")

            assert answer.delay().get(timeout=30) == 42
            for _ in range(500):  # the ledger writes from its own thread
                if client.xlen(stream):
                    break
                time.sleep(0.02)
    finally:
        worker_process_init.disconnect(ns.get("set_up_telemetry"))
        CeleryInstrumentor().uninstrument()
        trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
        sentry_sdk.get_global_scope().set_client(None)
        recorded = client.xrange(stream)
        client.delete(stream)
        client.close()
    ((_, fields),) = recorded
    assert json.loads(fields[b"record"])["outcome"] == "recovered"
    assert _recovery_parent(spans).name == f"run/{answer.name}"  # the task's span


# -------------------------------------------------------------------------------------- tests

BLOCKS = [block for page in PAGES for block in _blocks(page)]
RUNNABLE = [block for block in BLOCKS if block.snippet is None]


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_python_block_runs(block: Block, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    namespace: dict[str, Any] = {
        "__name__": "docs_block", "__block__": block.code, "__page__": str(block.page),
    }  # fmt: skip
    if block.marker is None:
        _run(block, namespace)
        return
    if block.marker.startswith("fragment:"):
        ast.parse(block.code)
        # The excuse must hold: a fragment that runs on its own is an example, not a fragment.
        with pytest.raises(NameError):
            _run(block, namespace)
        return
    assert block.marker in SETUPS, f"{block}: unknown docs-test setup {block.marker!r}"
    with SETUPS[block.marker](namespace, monkeypatch, tmp_path):
        _run(block, namespace)


def test_the_pages_and_their_blocks_are_found() -> None:
    # The reader of the pages must be able to fail: it finds the README's and the docs' blocks,
    # an indented (admonition) include among them.
    assert {README, DOCS / "index.md", DOCS / "reference" / "configuration.md"} <= set(PAGES)
    assert any(block.page == README for block in RUNNABLE)
    assert len({block.page for block in RUNNABLE}) >= 10
    assert "examples/approvers.py" in {block.snippet for block in BLOCKS}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_marker_sits_right_before_a_python_block(page: Path) -> None:
    lines = page.read_text().splitlines()
    for number, line in enumerate(lines):
        assert "readme-test:" not in line, f"{page}:{number + 1}: the marker is docs-test now"
        if MARKER.fullmatch(line.strip()):  # a marker is a line of its own
            assert lines[number + 1].strip() == "```python", f"{page}:{number + 1}: {line}"
    fragments = [b for b in _blocks(page) if (b.marker or "").startswith("fragment:")]
    assert len(fragments) <= 2, f"{page}: fragments must stay rare: make the examples runnable"


def test_every_setup_is_used() -> None:
    used = {block.marker for block in BLOCKS}
    assert set(SETUPS) <= used, f"setups no block uses: {set(SETUPS) - used}"


def _runs_examples(test_file: Path) -> set[str]:
    """The examples a test file runs: named there as a file, and the file starts a process or
    loads a module from a path (``sys.executable``, ``spec_from_file_location``)."""
    text = test_file.read_text()
    if "sys.executable" not in text and "spec_from_file_location" not in text:
        return set()
    return set(re.findall(r"[\"'/](\w+\.py)[\"']", text))


def test_every_included_example_is_run_by_a_test() -> None:
    included = {block.snippet for block in BLOCKS if block.snippet is not None}
    assert included, "the docs show examples by snippet includes"
    run = {name for test in (ROOT / "tests").rglob("test_*.py") for name in _runs_examples(test)}
    for example in sorted(included):
        assert (ROOT / example).is_file(), f"{example} is included but does not exist"
        if example.startswith("src/"):
            continue  # a module of the package, not an example: the package's tests run it
        assert Path(example).name in run, (
            f"{example} is shown in the docs but no test runs it: add it to "
            "tests/e2e/test_examples.py"
        )


def test_the_example_finder_can_fail(tmp_path: Path) -> None:
    only_named = tmp_path / "test_a.py"
    only_named.write_text('NAME = "cgi_script.py"\n')  # named, never run
    assert _runs_examples(only_named) == set()
    run = tmp_path / "test_b.py"
    run.write_text('subprocess.run([sys.executable, EXAMPLES / "cgi_script.py"])\n')
    assert _runs_examples(run) == {"cgi_script.py"}


# ------------------------------------------------------------------------ the references


CONFIGURATION = DOCS / "reference" / "configuration.md"


def _table(markdown: str) -> dict[str, list[str]]:
    """A generated table: the first cell's names, each with the row's cells."""
    rows: dict[str, list[str]] = {}
    for line in markdown.splitlines()[2:]:
        # A pipe inside a code span (``str | None``) is no cell separator.
        cells = [cell.strip() for cell in re.findall(r"(?:`[^`]*`|[^|`])+", line.strip())]
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[name] = cells
    return rows


def _default_of(cell: str) -> object:
    literal = re.fullmatch(r"`([^`]*)`", cell)
    assert literal, f"a default is written as `code`: {cell!r}"
    if literal.group(1) == "Exception":
        return Exception
    return ast.literal_eval(literal.group(1))


def test_the_configuration_page_asks_for_both_generated_tables() -> None:
    text = CONFIGURATION.read_text()
    for part in ("crashoverride-arguments", "handler-arguments"):
        assert f"\n<!-- generated: {part} -->\n" in text
    assert "<!-- generated:" not in GENERATE.expand(text)


def test_the_generated_arguments_are_the_settings_table_in_order_with_defaults() -> None:
    rows = _table(GENERATE.crashoverride_arguments())
    arguments = [field for field in FIELDS if field.scope != HANDLER]
    assert list(rows) == [field.name for field in arguments]
    for field in arguments:
        assert _default_of(rows[field.name][1]) == field.default, field.name
        assert rows[field.name][2] == f"`{field.annotation}`"
    # The signature is the same table (tests/config/test_settings_table.py holds it there).
    assert list(inspect.signature(CrashOverride).parameters) == [f.name for f in arguments]


def test_the_generated_handler_arguments_are_every_handler_setting_and_alias() -> None:
    rows = _table(GENERATE.handler_arguments())
    handler_names = [name for field in FIELDS if field.scope != APP
                     for name in (field.name, *field.aliases)]  # fmt: skip
    assert list(rows) == handler_names
    assert _default_of(rows["prompt"][1]) == ""
    assert rows["timeout"][1] == "the application's"
    assert "added to it" in rows["tools"][3] and "overrides it" in rows["mode"][3]


def test_the_notes_by_argument_name_real_arguments_in_the_table_order() -> None:
    text = CONFIGURATION.read_text()
    notes = text[text.index("## Notes by argument") : text.index("## What a check's")]
    named = [name for line in notes.splitlines() if line.startswith("- ")
             for name in re.findall(r"`([a-z_]+)`", line.split(":")[0])]  # fmt: skip
    order = [name for field in FIELDS for name in (field.name, *field.aliases)]
    assert named and set(named) <= set(order), set(named) - set(order)
    assert named == sorted(named, key=order.index), "notes in the order of the settings table"


def test_the_event_registry_reader_finds_every_event_with_what_it_means() -> None:
    from crashoverride._observe import events

    defined = [value for name, value in vars(events).items()  # ``Redacted``: a str at run time
               if name.isupper() and isinstance(value, str)]  # fmt: skip
    registry = GENERATE.registry()
    assert [name for name, _ in registry] == list(dict.fromkeys(defined))
    missing = [name for name, comment in registry if not comment]
    assert not missing, f"say when each is emitted, in a comment above it in events.py: {missing}"
    table = GENERATE.events()
    assert all(f"| `{name}` |" in table for name, _ in registry)


def test_every_event_the_pages_name_exists() -> None:
    known = {name for name, _ in GENERATE.registry()}
    prefixes = {name.split(".")[0] for name in known}
    for page in PAGES:
        for name in re.findall(r"`([a-z]+\.[a-z_]+)`", page.read_text()):
            if name.split(".")[0] in prefixes and name not in known:
                pytest.fail(f"{page.relative_to(ROOT)} names an event that does not exist: {name}")


def test_the_changelog_starts_with_the_version_the_package_reports() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    versions = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert versions, "Keep a Changelog: one `## [version] - date` section per release"
    assert versions[0] == crashoverride.__version__
    assert (DOCS / "changelog.md").read_text().strip() == '--8<-- "CHANGELOG.md"'


def test_the_import_cost_quoted_is_the_measured_one() -> None:
    results = RESULTS.read_text()
    interpreter = re.search(r"- interpreter: CPython (\S+)", results)
    figure = re.search(
        r"\| import crashoverride, extra over python -c pass \| ([\d.]+) ms", results
    )
    assert interpreter and figure
    install = (DOCS / "getting-started" / "install.md").read_text()
    quoted = re.search(r"`import crashoverride` costs about (\d+) ms .*?CPython\s+(\S+),",
                       install, re.DOTALL)  # fmt: skip
    assert quoted, "the install page quotes the import cost and the interpreter it was measured on"
    assert int(quoted.group(1)) == round(float(figure.group(1))), "refresh the quoted figure"
    assert quoted.group(2) == interpreter.group(1)


def test_the_eval_guide_counts_the_scenarios_there_are() -> None:
    from crashoverride._eval._runner import catalogue

    guide = (ROOT / "docs" / "guides" / "eval.md").read_text(encoding="utf-8")
    said = re.search(r"\*\*What runs\.\*\* (\d+) scenarios", guide)
    assert said is not None
    assert int(said.group(1)) == len(catalogue())
