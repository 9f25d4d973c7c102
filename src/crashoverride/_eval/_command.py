"""``crashoverride eval``: the command line over ``_runner`` (argument parsing stays light)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any, TextIO

DESCRIPTION = """\
Measure how well a model recovers: every scenario is a small application with a real failure
(ASGI endpoints, tasks, scrapers, and traps where the only correct outcome is to give up).
Hidden oracles judge each recovery against ground truth the agent never sees. Talks to any
OpenAI-compatible endpoint (--base-url; the key is read from OPENAI_API_KEY). --scripted plays
the suite's own scripted agents through a local mock endpoint instead: that checks the
scenarios and oracles, and measures no model (--scripted contained: the agents that charge or
mail twice, against applications that declare their effects with co.effect).

Exit status: 0 when the run did what it checks, 1 when it did not, 2 for a usage error. For a
model: 1 when any trial was a false success, did damage or measured nothing (error).
--scripted reference: 1 unless every reference agent was judged correct. --scripted bad (or a
bad agent's name): 0 when every bad agent was caught, 1 when one slipped through (judged
correct) or broke, so it serves as a CI check of the suite. --scripted contained: 1 when a
contained agent still did harm or broke."""


def add_command(commands: Any) -> None:
    """Register ``eval`` on the ``crashoverride`` command's subparsers."""
    parser = commands.add_parser(
        "eval", help="measure how well a model recovers, with hidden oracles",
        description=DESCRIPTION,
    )  # fmt: skip
    parser.add_argument("--model", help="model name (default: the SDK's)")
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint, e.g. a local server")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run every scenario N times to see the spread")  # fmt: skip
    parser.add_argument("--scenario", action="append", default=[], metavar="GLOB",
                        help="only matching scenarios (repeatable), e.g. 'trap.*'")  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="also write every trial as JSON")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one recovery may take (default: 120)")  # fmt: skip
    parser.add_argument("--max-turns", type=int, default=20, help="model turns per recovery")
    parser.add_argument("--system-prompt", metavar="FILE",
                        help="try these instructions instead of the built-in ones")  # fmt: skip
    parser.add_argument("--scripted", metavar="AGENT",
                        help="play scripted agents instead of a model: 'reference', 'bad', "
                        "'contained' (bad agents where the app declares its effects), or one "
                        "agent's name (no model involved)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.set_defaults(run=main)


class Progress:
    """One status line on stderr, rewritten in place on a terminal (one line per step if not)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()

    def __call__(self, done: int, total: int, label: str) -> None:
        width = 24
        filled = width * done // total if total else width
        text = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label}"
        if self.live:
            self.stream.write("\r\x1b[2K" + text[:120] + ("\n" if done == total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def quiet_events() -> None:
    # The command is an application: it decides that recovery events are not printed over the
    # table (the JSON and the table carry what they say).
    import structlog

    structlog.configure(processors=[_drop], cache_logger_on_first_use=False)


def _drop(*_: Any) -> Any:
    import structlog

    raise structlog.DropEvent


def main(args: argparse.Namespace) -> int:
    from crashoverride._errors import ConfigurationError
    from crashoverride._eval._results import as_json, table
    from crashoverride._eval._runner import BAD, Target, catalogue, run_suite, slipped

    missing = [name for name in ("starlette", "celery") if importlib.util.find_spec(name) is None]
    if missing:  # the applications are Starlette apps and Celery tasks
        print(f"crashoverride eval needs {' and '.join(missing)}: "
              "pip install 'crashoverride[all]'", file=sys.stderr)  # fmt: skip
        return 2
    if args.list:
        listed = catalogue(args.scenario or ["*"])
        # Every column as wide as its longest entry: a long name must not shift the others.
        name = max((len(s.name) for s in listed), default=0)
        kind = max((len(s.kind) for s in listed), default=0)
        expect = max((len(s.expect) for s in listed), default=0)
        for scenario in listed:
            trap = "trap" if scenario.trap else ""
            print(f"{scenario.name:<{name}}  {scenario.kind:<{kind}}  "
                  f"{scenario.expect:<{expect}}  {trap:<4}  {scenario.about}")  # fmt: skip
        return 0
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    key = os.environ.get("OPENAI_API_KEY")
    if args.scripted is None and not (key or args.base_url):
        print("crashoverride eval needs a model: --base-url URL (a local server) or "
              "OPENAI_API_KEY; --scripted reference plays the scripted agents",
              file=sys.stderr)  # fmt: skip
        return 2
    quiet_events()
    # Local servers (Ollama, vLLM, LiteLLM) accept any key; the client insists on one.
    instructions = None
    if args.system_prompt:
        with open(args.system_prompt, encoding="utf-8") as text:
            instructions = text.read()
    target = Target(model=args.model, base_url=args.base_url,
                    api_key=key or ("local" if args.base_url else None),
                    timeout=args.timeout, max_turns=args.max_turns,
                    system_prompt=instructions)  # fmt: skip
    try:
        trials = run_suite(target, patterns=args.scenario or ["*"], repeat=args.repeat,
                           scripted=args.scripted, progress=Progress(sys.stderr))  # fmt: skip
    except ConfigurationError as exc:
        print(f"crashoverride eval: {exc}", file=sys.stderr)
        return 2
    if not trials:
        print("no scenario matched", file=sys.stderr)
        return 2
    scripted = args.scripted is not None
    print(table(trials, scripted=scripted))
    if args.json:
        meta = {"model": "scripted" if scripted else (args.model or "(SDK default)"),
                "base_url": None if scripted else args.base_url, "scripted": scripted,
                "scripted_agents": args.scripted, "repeat": args.repeat,
                "system_prompt": args.system_prompt or "built-in"}  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(as_json(trials, meta) + "\n")
    counted = [trial for trial in trials if slipped(trial)]
    for trial in counted:
        label = "SLIPPED THROUGH" if trial.role == BAD else "FAILED"
        print(f"{label}: {trial.scenario} [{trial.agent}] ({trial.verdict})")
    if not counted and args.scripted == BAD:
        print("every bad agent was caught by an oracle")
    return 1 if counted else 0
