"""The table a person reads and the JSON a dashboard reads, from the same trials."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from crashoverride._eval._runner import CORRECT, VERDICTS, Trial

_SHORT = {
    "recovered": "recov", "correct_give_up": "ok-give", "false_success": "FALSE",
    "damaged": "damage", "wrong_give_up": "bad-give", "error": "error",
}  # fmt: skip

LEGEND = (
    "recov: recovered correctly; ok-give: correct give-up; FALSE: claimed recovered, the",
    "oracles say wrong; damage: gave up after doing harm; bad-give: gave up (or proved",
    "nothing) though a fix existed; error: the model never answered or the scenario broke.",
    "turns, tokens, wall s: mean (min-max) per trial.",
)
SCRIPTED_NOTE = (
    "SCRIPTED: every agent turn was written in advance (crashoverride/_eval/scenarios); this "
    "measures the scenarios and oracles, not any model."
)
CONTAINED_NOTE = (
    "(contained): a scripted agent that does damage without a containment of crashoverride "
    "(it charges or mails twice where effects are not declared, its patch breaks later inputs "
    "with patch_watch=0), played where the containment is on (co.effect, the patch watch): "
    "its verdict is what the containment let it do."
)


def _spread(values: Sequence[float], digits: int) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1 or min(values) == max(values):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _row(name: str, trials: Sequence[Trial]) -> list[str]:
    counts = [sum(t.verdict == v for t in trials) for v in VERDICTS]
    correct = sum(t.correct for t in trials)
    return [
        name, f"{correct}/{len(trials)}", *(str(c) if c else "." for c in counts),
        _spread([t.turns for t in trials], 1), _spread([t.tokens for t in trials], 0),
        _spread([t.seconds for t in trials], 2),
    ]  # fmt: skip


def by_scenario(trials: Sequence[Trial]) -> dict[tuple[str, str], list[Trial]]:
    grouped: dict[tuple[str, str], list[Trial]] = {}
    for trial in trials:
        grouped.setdefault((trial.scenario, trial.agent), []).append(trial)
    return grouped


def table(trials: Sequence[Trial], *, scripted: bool) -> str:
    """Per scenario (and agent, when scripted) and in total; ``--repeat`` shows min-max."""
    head = ["scenario", "correct", *(_SHORT[v] for v in VERDICTS), "turns", "tokens", "wall s"]
    rows = []
    for (scenario, agent), group in by_scenario(trials).items():
        contained = " (contained)" if group[0].role == "contained" else ""
        rows.append(_row(f"{scenario} [{agent}]{contained}" if scripted else scenario, group))
    rows.append(_row("TOTAL", trials))
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  ".join(cells).rstrip()

    rule = "-" * len(line(head))
    out = [line(head), rule, *map(line, rows[:-1]), rule, line(rows[-1])]
    summary = totals(trials)
    out.append("")
    out.append(
        f"correct {summary['correct_rate']:.1%} of {summary['trials']} trials; "
        f"FALSE SUCCESSES: {summary['false_success']}; damaged: {summary['damaged']}."
    )
    groups = by_group(trials)
    out.append("by kind: " + ", ".join(
        f"{group} {found['correct']}/{found['trials']} (false {found['false_success']})"
        for group, found in groups.items()
    ))  # fmt: skip
    out.extend(LEGEND)
    if scripted:
        out.append(SCRIPTED_NOTE)
    if any(trial.role == "contained" for trial in trials):
        out.append(CONTAINED_NOTE)
    return "\n".join(out)


def totals(trials: Sequence[Trial]) -> dict[str, Any]:
    found: dict[str, Any] = {v: sum(t.verdict == v for t in trials) for v in VERDICTS}
    found["trials"] = len(trials)
    found["correct"] = sum(t.verdict in CORRECT for t in trials)
    found["correct_rate"] = found["correct"] / len(trials) if trials else 0.0
    return found


def by_group(trials: Sequence[Trial]) -> dict[str, dict[str, Any]]:
    """Totals per kind of user (asgi, task, scraper) and for the traps."""
    groups: dict[str, list[Trial]] = {}
    for trial in trials:
        groups.setdefault(trial.group, []).append(trial)
    return {group: totals(members) for group, members in groups.items()}


def as_json(trials: Sequence[Trial], meta: Mapping[str, Any]) -> str:
    """Every trial with its checks, the per-scenario summary and the totals."""
    scenarios = [
        {"scenario": scenario, "agent": agent, **totals(group)}
        for (scenario, agent), group in by_scenario(trials).items()
    ]
    document = {
        **meta,
        "note": SCRIPTED_NOTE if meta.get("scripted") else "",
        "totals": totals(trials),
        "by_kind": by_group(trials),
        "scenarios": scenarios,
        "trials": [asdict(trial) for trial in trials],
    }
    return json.dumps(document, indent=2, default=str)
