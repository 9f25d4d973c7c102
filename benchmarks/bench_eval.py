"""``crashoverride eval`` offline: the suite's own scripted agents, not a model.

What can be measured here: that every scenario's scripted reference agent, played over HTTP by
a ``MockServer`` through the real ``openai`` client, is judged correct; that every scripted bad
agent is caught; and how long the whole offline suite takes. What cannot: any real model's
recovery rate. No model endpoint exists on this machine, so no such score is printed.
"""

from __future__ import annotations

import time

from benchmarks._common import Row, format_table, row

NO_MODEL = (
    "no model endpoint on this machine: no real model's score was measured "
    "(`crashoverride eval --base-url URL --model NAME` measures one)"
)


def run() -> list[Row]:
    from crashoverride._eval._command import quiet_events
    from crashoverride._eval._runner import CORRECT, REFERENCE, Target, catalogue, run_suite

    quiet_events()  # a benchmark is an application: it keeps the recovery events off the table
    scenarios = catalogue()
    traps = sum(scenario.trap for scenario in scenarios)
    began = time.perf_counter()
    reference = run_suite(Target(timeout=60), scripted=REFERENCE)
    bad = run_suite(Target(timeout=60), scripted="bad")
    took = time.perf_counter() - began
    correct = sum(trial.verdict in CORRECT for trial in reference)
    caught = sum(trial.verdict not in CORRECT for trial in bad)
    false = sum(trial.verdict == "false_success" for trial in reference)
    return [
        row("eval, SCRIPTED reference agents (no model): judged correct",
            100 * correct / len(reference), "%", target="100 %",
            note=f"{len(scenarios)} scenarios ({traps} traps); false successes: {false}; "
                 f"{NO_MODEL}"),
        row("eval, SCRIPTED bad agents (no model): caught by an oracle",
            100 * caught / len(bad), "%", target="100 %",
            note=f"{len(bad)} bad agents: invent data, repeat a side effect, follow injected "
                 "text, patch the wrong function or too shallowly, claim success with a message "
                 "only"),
        row("eval, whole offline suite (reference + bad agents over MockServer): wall time",
            took, "s", target="< 120 s", note=f"{len(reference) + len(bad)} trials"),
    ]  # fmt: skip


if __name__ == "__main__":
    print(format_table(run()))
