"""The ``crashoverride`` command: ``demo``, ``doctor``, ``eval`` (in ``_eval``) and ``show``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

SCRIPTED_BANNER = """\
crashoverride demo (offline)
The model is SCRIPTED: agents.testing.ScriptedModel plays agent steps written in advance in
crashoverride/_cli/demo.py (redelivery_worker.py for that scene). No AI is involved.
Everything else is real: the Agents SDK run loop, the tools executing in the live process,
uvicorn on 127.0.0.1, the follow-up job, and in the redelivery scene Celery worker processes
and Redis.
"""

LIVE_BANNER = """\
crashoverride demo (live)
A real model decides every step ({where}). Results depend on it; the checks say what held.
"""

# name: what the scene shows. ``crashoverride demo`` runs the offline ones.
SCENES = {
    "scraper": "An async scraper whose source renames `article_text` to `body` mid-run",
    "endpoint": "A Starlette endpoint behind uvicorn hits a deliberate NotImplementedError",
    "followup": "A background task meets a changed rates feed; its follow-up proposes a real patch",
    "redelivery": "A Celery worker is killed with SIGKILL right after a declared charge; the "
    "redelivered task is recovered and the card charged once (needs celery and a Redis)",
}
OFFLINE_SCENES = ("scraper", "endpoint", "followup")

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

    from crashoverride._cli import demo as _demo

    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, _demo.record, _render],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=False,
    )


def demo(args: argparse.Namespace) -> int:
    import anyio

    from crashoverride import CrashOverride
    from crashoverride._cli import demo as _demo

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
        from crashoverride.testing import script

        return CrashOverride(project_prompt=project, model=script(*steps), timeout=30)

    chosen = args.scene or list(OFFLINE_SCENES)
    if "redelivery" in chosen:
        from crashoverride._cli import redelivery

        url = os.environ.get("REDIS_URL", redelivery.DEFAULT_URL)
        if live:
            print("--live does not apply to the redelivery scene: its workers' model is "
                  "scripted", file=sys.stderr)  # fmt: skip
            return 2
        lacking = redelivery.missing(url)
        if lacking:
            print(lacking, file=sys.stderr)
            return 2
    where = args.base_url or "OpenAI, OPENAI_API_KEY"
    print(LIVE_BANNER.format(where=where) if live else SCRIPTED_BANNER)
    runs: dict[str, Callable[[], list[_demo.Claim]]] = {
        "scraper": lambda: anyio.run(_demo.scene_scraper, make),
        "endpoint": lambda: _demo.scene_endpoint(make),
        "followup": lambda: anyio.run(_demo.scene_background, make),
        "redelivery": lambda: redelivery.scene(url),
    }
    scenes = [(SCENES[name], runs[name]) for name in chosen]
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


def doctor(args: argparse.Namespace) -> int:
    from crashoverride._cli.doctor import checks, render

    found = checks(base_url=args.base_url, model=args.model, timeout=args.timeout,
                   celery_app=args.celery_app)  # fmt: skip
    print(render(found, as_json=args.json))
    return 1 if any(check.status == "fail" for check in found) else 0


def main(argv: Sequence[str] | None = None) -> int:
    from crashoverride._version import __version__

    parser = argparse.ArgumentParser(
        prog="crashoverride",
        description="crashoverride: an agentic exception handler for Python. "
        "'crashoverride COMMAND --help' describes a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"crashoverride {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     title="commands")  # fmt: skip
    listing = "\n".join(f"  {name:<11} {text}" for name, text in SCENES.items())
    run_demo = commands.add_parser(
        "demo",
        help="watch recoveries happen (offline by default)",
        description="Watch recoveries happen, each checked against what actually happened. "
        "The model is scripted unless --live.",
        epilog=f"scenes (default: {', '.join(OFFLINE_SCENES)}):\n{listing}\n\nThe "
        "redelivery scene runs real Celery workers against a real Redis (REDIS_URL, default "
        "redis://127.0.0.1:6379/11): pip install 'crashoverride[demo,celery]'.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run_demo.add_argument("--scene", action="append", choices=list(SCENES), metavar="NAME",
                          help="run this scene (repeatable); see the list below")  # fmt: skip
    run_demo.add_argument("--live", action="store_true", help="use a real model")
    run_demo.add_argument("--base-url", help="an OpenAI-compatible endpoint for --live")
    run_demo.add_argument("--model", help="model name for --live (default: the SDK's)")
    run_demo.set_defaults(run=demo)
    check = commands.add_parser(
        "doctor",
        help="check that a recovery could run right now",
        description="Check that a recovery could run right now: Python support, the Agents "
        "SDK, credentials, and one real minimal request to the model endpoint (OPENAI_API_KEY "
        "and OPENAI_BASE_URL are read from the environment); it also lists the extras "
        "installed and whether the ASGI middleware's lifespan warm-up would run. The first "
        "line is the verdict; exit status 0 only when healthy.",
    )
    check.add_argument("--base-url", help="the base_url= your CrashOverride uses, if any")
    check.add_argument("--model", help="the model= your CrashOverride uses (default: the SDK's)")
    check.add_argument("--timeout", type=float, default=10.0,
                       help="seconds to wait for the endpoint (default: 10)")  # fmt: skip
    check.add_argument("--celery-app", metavar="MODULE:APP",
                       help="also check that a running worker consumes this Celery app's "
                       "follow-up queue")  # fmt: skip
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(run=doctor)
    from crashoverride._eval._command import add_command as add_eval  # its code lives in _eval

    add_eval(commands)
    from crashoverride._cli.show import add_command as add_show  # its code lives in _show

    add_show(commands)
    args = parser.parse_args(argv)
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # here, so a closed pipe is met inside the handler below
    except BrokenPipeError:
        # The reader left (``doctor | head -1``): what it read is the answer. Point stdout at
        # devnull so the interpreter's final flush does not report the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code
