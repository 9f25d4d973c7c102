"""One self-contained HTML page of recoveries, for an incident review.

No external asset of any kind (styles inline, no scripts, no fonts, no images), and a content
security policy that forbids fetching anything, so the page shows the same offline, attached
to a ticket, years later. Every text is escaped; the reports are redacted already.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Final

from crashoverride._observe.report import RecoveryReport, SourceChange
from crashoverride._observe.transcript import call_heading, facts

_CSP: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'"

_STYLE: Final = """
:root { color-scheme: light dark; --muted: #6b7280; --line: #d1d5db; --ok: #15803d;
        --bad: #b91c1c; --warn: #a16207; --code: rgba(127,127,127,.1); }
body { font: 15px/1.5 system-ui, sans-serif; margin: 0; padding: 2rem; max-width: 72rem; }
h1 { font-size: 1.4rem; margin: 0 0 1rem; } h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
h3 { font-size: 1rem; margin: .25rem 0; font-weight: 600; }
article { border-top: 3px solid var(--line); padding-top: 1rem; margin-bottom: 3rem; }
.outcome { padding: .1rem .5rem; border-radius: .3rem; color: #fff; font-size: .9rem; }
.recovered { background: var(--ok); } .failed { background: var(--bad); }
.skipped, .repaired { background: var(--warn); }
table.facts { border-collapse: collapse; } .facts th { text-align: left; color: var(--muted);
  font-weight: 500; padding: .1rem 1.5rem .1rem 0; vertical-align: top; }
pre { background: var(--code); padding: .6rem .8rem; overflow-x: auto; white-space: pre-wrap;
  word-break: break-word; margin: .25rem 0 .75rem; font: 13px/1.45 ui-monospace, monospace; }
ol.calls { padding-left: 0; list-style: none; }
ol.calls > li { border-left: 4px solid var(--ok); padding-left: .8rem; margin-bottom: 1rem; }
ol.calls > li.failed-call { border-left-color: var(--bad); }
.label { color: var(--muted); font-size: .85rem; }
.diff .add { color: var(--ok); } .diff .del { color: var(--bad); }
.diff .hunk { color: var(--muted); }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _pre(text: str, cls: str = "") -> str:
    attribute = f' class="{cls}"' if cls else ""
    return f"<pre{attribute}>{_e(text) if text else '(empty)'}</pre>"


def _diff(text: str) -> str:
    lines = []
    for line in text.splitlines():
        cls = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")
        if line.startswith(("+++", "---")):
            cls = "hunk"
        lines.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def _change(change: SourceChange) -> str:
    return (
        f"<h3>{_e(change.path)} <span class='label'>({_e(change.kind)}; {_e(change.file)})"
        f"</span></h3>{_diff(change.diff)}"
    )


def _article(report: RecoveryReport) -> str:
    parts = [
        f'<article id="{_e(report.recovery_id)}">',
        f"<h1>Recovery {_e(report.recovery_id)} "
        f'<span class="outcome {_e(report.outcome)}">{_e(report.outcome)}</span></h1>',
        '<table class="facts">',
        *(f"<tr><th>{_e(label)}</th><td>{_e(value)}</td></tr>" for label, value in facts(report)),
        "</table>",
        "<h2>Exception</h2>", _pre(report.exception),
        "<h2>Traceback</h2>", _pre(report.traceback),
        f"<h2>Tool calls ({len(report.tool_calls)})</h2>", '<ol class="calls">',
    ]  # fmt: skip
    for number, call in enumerate(report.tool_calls, 1):
        cls = "ok-call" if call.ok else "failed-call"
        parts += [
            f'<li class="{cls}"><h3>{_e(call_heading(number, call))}</h3>',
            '<div class="label">code</div>', _pre(call.code, "code"),
            '<div class="label">result</div>', _pre(call.result, "result"), "</li>",
        ]  # fmt: skip
    parts.append("</ol>")
    if report.source_changes:
        parts += ["<h2>Source changes</h2>", *(_change(c) for c in report.source_changes)]
    parts += ["<h2>Diagnosis</h2>", _pre(report.diagnosis), "</article>"]
    return "\n".join(parts)


def page(reports: Iterable[RecoveryReport]) -> str:
    """The page: one article per recovery, in the order given."""
    shown = list(reports)
    title = shown[0].recovery_id if len(shown) == 1 else f"{len(shown)} recoveries"
    return "\n".join([
        "<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>crashoverride: {_e(title)}</title>", f"<style>{_STYLE}</style>", "</head>",
        "<body><main>", *(_article(report) for report in shown), "</main></body>", "</html>", "",
    ])  # fmt: skip
