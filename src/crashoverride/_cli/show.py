"""``crashoverride show``: read recoveries back from a ledger, in the terminal or as one page.

    crashoverride show rec_0123456789ab --ledger recoveries.jsonl
    crashoverride show --last 5 --ledger redis://127.0.0.1:6379/0
    crashoverride show rec_0123456789ab --html incident.html

The ledger is ``--ledger`` or the ``CRASHOVERRIDE_LEDGER`` environment variable: a JSON Lines
file (``JsonLinesLedger``) or a Redis URL (``RedisStreamLedger``; ``?stream=name`` for another
stream than the default). Records are masked again on the way in: a ledger written by another
version, or by hand, is still scanned for secret-looking values.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Final

ENV: Final = "CRASHOVERRIDE_LEDGER"


def add_command(commands: Any) -> None:
    show = commands.add_parser(
        "show",
        help="show recoveries kept by a ledger, or as an HTML page",
        description="Show recoveries kept by a ledger sink (JsonLinesLedger, RedisStreamLedger):"
        " the exception, every tool call with its code and result, source changes, the "
        "outcome, timings and tokens.",
    )
    show.add_argument("recovery_id", nargs="?", help="the recovery to show (rec_...)")
    show.add_argument("--last", type=int, metavar="N",
                      help="the last N recoveries instead (not with a recovery id)")  # fmt: skip
    show.add_argument("--ledger", metavar="PATH|redis://...",
                      help=f"the ledger to read (default: ${ENV})")  # fmt: skip
    show.add_argument("--html", metavar="OUT.html",
                      help="write one self-contained page instead of printing")  # fmt: skip
    show.set_defaults(run=run)


def _fail(message: str) -> int:
    print(f"crashoverride show: {message}", file=sys.stderr)
    return 2


def load(source: str, recovery_id: str | None, last: int | None) -> list[Any]:
    """The reports asked for, oldest first."""
    from crashoverride._observe.ledger import open_ledger
    from crashoverride._observe.record import from_record
    from crashoverride._security.redact import scanned_data

    reader = open_ledger(source)
    if recovery_id is not None:
        found = reader.find(recovery_id)
        records = [found] if found is not None else []
    else:
        records = reader.last(last if last is not None else 1)
    reports = []
    for record in records:
        try:
            reports.append(from_record(scanned_data(record)))
        except (TypeError, ValueError):
            continue  # another schema, or not a report: nothing to show of it
    return reports


def run(args: argparse.Namespace) -> int:
    source = args.ledger or os.environ.get(ENV)
    if not source:
        return _fail(f"no ledger: pass --ledger PATH|redis://... or set {ENV}")
    if args.recovery_id is None and args.last is None:
        return _fail("name a recovery (rec_...) or pass --last N")
    if args.recovery_id is not None and args.last is not None:
        return _fail("either a recovery id or --last N, not both")
    if args.last is not None and args.last < 1:
        return _fail("--last must be at least 1")
    try:
        reports = load(source, args.recovery_id, args.last)
    except OSError as exc:
        return _fail(f"cannot read the ledger: {exc}")
    except Exception as exc:  # a Redis that does not answer, say
        return _fail(f"cannot read the ledger: {type(exc).__name__}: {exc}")
    if not reports:
        if args.recovery_id is not None:
            return _fail(f"{args.recovery_id} not found in {source}")
        return _fail(f"no recoveries in {source}")
    if args.html:
        from crashoverride._cli.show_html import page

        with open(args.html, "w", encoding="utf-8") as out:
            out.write(page(reports))
        count = len(reports)
        print(f"wrote {args.html} ({count} {'recovery' if count == 1 else 'recoveries'})")
        return 0
    from crashoverride._observe.transcript import render

    print("\n\n".join(render(report) for report in reports))
    return 0
