"""The ``crashoverride`` command: ``demo`` (offline by default) and ``doctor``."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

SCRIPTED_BANNER = """\
crashoverride demo (offline)
The model is SCRIPTED: agents.testing.ScriptedModel plays agent steps written in advance in
crashoverride/_demo.py. No AI is involved. Everything else is real: the Agents SDK run loop,
the tools executing in this live process, uvicorn on 127.0.0.1, the follow-up job.
"""

LIVE_BANNER = """\
crashoverride demo (live)
A real model decides every step ({where}). Results depend on it; the checks say what held.
"""

_FIELDS = ("placement", "tool", "code", "via", "reason", "followup_id", "duration_ms")


def _render(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    """One readable line per event, for a person watching the demo."""
    parts = []
    for key in _FIELDS:
        if key in event:
            value = str(event[key]).strip().splitlines()
            shown = value[0] + (" ..." if len(value) > 1 else "") if value else ""
            parts.append(f"{key}={shown[:90]}")
    return f"    · {event['event']:<22} {' '.join(parts)}"


def _configure_logging() -> None:
    # The demo is an application: configuring structlog here is its call, not the library's.
    import structlog

    from . import _demo

    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, _demo.record, _render],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=False,
    )


def demo(args: argparse.Namespace) -> int:
    import anyio

    from . import CrashOverride, _demo

    live = bool(args.live)
    if live and not (os.environ.get("OPENAI_API_KEY") or args.base_url):
        print("--live needs OPENAI_API_KEY or --base-url", file=sys.stderr)
        return 2
    _configure_logging()
    project = "A demo application. Data must come from its real sources; never invent it."

    def make(steps: list[Any]) -> CrashOverride:
        if live:
            return CrashOverride(project_prompt=project, model=args.model, base_url=args.base_url,
                                 timeout=120)  # fmt: skip
        from .testing import script

        return CrashOverride(project_prompt=project, model=script(*steps), timeout=30)

    where = args.base_url or "OpenAI, OPENAI_API_KEY"
    print(LIVE_BANNER.format(where=where) if live else SCRIPTED_BANNER)
    scenes: list[tuple[str, Callable[[], list[_demo.Claim]]]] = [
        ("An async scraper whose source renames `article_text` to `body` mid-run",
         lambda: anyio.run(_demo.scene_scraper, make)),
        ("A Starlette endpoint behind uvicorn hits a deliberate NotImplementedError",
         lambda: _demo.scene_endpoint(make)),
        ("A background task recovers and spawns a follow-up job",
         lambda: anyio.run(_demo.scene_background, make)),
    ]  # fmt: skip
    began = time.monotonic()
    held = total = 0
    for number, (title, scene) in enumerate(scenes, 1):
        print(f"[{number}/{len(scenes)}] {title}")
        try:
            claims = scene()
        except Exception as exc:  # a broken scene is reported, and the others still run
            claims = [(f"the scene ran ({type(exc).__name__}: {exc})", False, "")]
        print("  checked against what happened:")
        for claim, ok, detail in claims:
            total += 1
            held += ok
            mark = "ok  " if ok else "FAIL"
            extra = f"  [{detail}]" if detail and not ok else ""
            print(f"    {mark} {claim}{extra}")
        print()
    took = time.monotonic() - began
    verdict = "all claims held" if held == total else f"{total - held} claim(s) did NOT hold"
    model = "live model" if live else "scripted model"
    print(f"{held}/{total} checks passed: {verdict} ({model}, {took:.1f} s).")
    return 0 if held == total else 1


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _caller_locals_work() -> bool:
    from ._frames import CallerLocals

    frame = sys._getframe()
    probe = 0
    CallerLocals(frame)["probe"] = 1
    return probe == 1


def _endpoint_answers(base_url: str, key: str | None) -> tuple[bool, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(base_url.rstrip("/") + "/models")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            return True, f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:  # it answered, even if it refused us
        return exc.code < 500, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


def doctor(args: argparse.Namespace) -> int:
    healthy = True

    def line(ok: bool | None, label: str, detail: str) -> None:
        mark = {True: "ok  ", False: "FAIL", None: "info"}[ok]
        print(f"{mark} {label}: {detail}")

    version = ".".join(map(str, sys.version_info[:3]))
    line(sys.version_info >= (3, 11), "python", version)
    native = sys.version_info >= (3, 13)
    works = _caller_locals_work()
    healthy &= works
    how = "native write-through proxy (PEP 667)" if native else "PyFrame_LocalsToFast"
    line(works, "caller locals write-through", how if works else "NOT working")
    sdk = _version("openai-agents")
    healthy &= sdk is not None
    line(sdk is not None, "openai-agents", sdk or "not installed")
    line(None, "openai", _version("openai") or "not installed")
    for extra, dist in (("starlette", "starlette"), ("celery", "celery"), ("uvicorn", "uvicorn"),
                        ("trio", "trio")):  # fmt: skip
        found = importlib.util.find_spec(dist) is not None
        line(None, f"extra {extra}", _version(dist) or "installed" if found else "not installed")
    key = os.environ.get("OPENAI_API_KEY")
    line(None, "API key", "configured (OPENAI_API_KEY, not shown)" if key else "not configured")
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    if base_url:
        ok, detail = _endpoint_answers(base_url, key)
        healthy &= ok
        line(ok, f"endpoint {base_url}", detail)
    elif not key:
        healthy = False
        line(False, "model access", "no OPENAI_API_KEY and no --base-url: recoveries would fail")
    tracing_off = os.environ.get("OPENAI_AGENTS_DISABLE_TRACING", "").lower() in ("1", "true")
    line(None, "SDK tracing", "off (crashoverride disables it per run unless tracing=True)"
         + ("; also disabled globally" if tracing_off else ""))  # fmt: skip
    print("healthy" if healthy else "NOT healthy")
    return 0 if healthy else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crashoverride", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_demo = commands.add_parser("demo", help="watch three recoveries (offline by default)")
    run_demo.add_argument("--live", action="store_true", help="use a real model")
    run_demo.add_argument("--base-url", help="an OpenAI-compatible endpoint for --live")
    run_demo.add_argument("--model", help="model name for --live (default: the SDK's)")
    run_demo.set_defaults(run=demo)
    check = commands.add_parser("doctor", help="check this installation and the model endpoint")
    check.add_argument("--base-url", help="an OpenAI-compatible endpoint to check")
    check.set_defaults(run=doctor)
    args = parser.parse_args(argv)
    return int(args.run(args))
