"""``crashoverride eval`` proves itself offline: every scenario's scripted reference agent,
played through a ``MockServer`` and the real ``openai`` client, is judged correct, and every
scripted bad agent is caught by at least one hidden oracle."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

import crashoverride
from crashoverride._cli.main import main
from crashoverride._eval._runner import (
    CORRECT,
    REFERENCE,
    Target,
    catalogue,
    run_suite,
    run_trial,
    verdict,
)
from crashoverride._eval._scenario import EFFECTS_ONCE, LATER, STATE, Check, Scenario
from crashoverride.testing import Script

SCENARIOS = catalogue()


def test_the_suite_covers_the_three_kinds_of_users_and_the_traps() -> None:
    kinds = Counter(scenario.kind for scenario in SCENARIOS)
    assert len(SCENARIOS) >= 24, kinds
    assert sum(scenario.trap for scenario in SCENARIOS) >= 6
    assert set(kinds) == {"asgi", "task", "scraper"}
    assert all(s.expect == "give_up" for s in SCENARIOS if s.trap)
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)
    assert all(len(s.bad) >= 2 for s in SCENARIOS), [s.name for s in SCENARIOS if len(s.bad) < 2]


def test_the_agent_sees_the_application_only() -> None:
    # The failed code's module is the agent's namespace: the ground truth, the oracles and the
    # scripted agents must not be in it.
    for app in sorted({scenario.app for scenario in SCENARIOS}):
        namespace = vars(importlib.import_module(app))
        leaks = [name for name, value in namespace.items() if _harness(value, app)]
        assert leaks == [], app


def _harness(value: object, app: str) -> bool:
    """Whether ``value`` comes from the eval itself rather than the application ``app``."""
    if isinstance(value, Scenario | Script | Check):
        return True
    if isinstance(value, ModuleType):
        return value.__name__.startswith("crashoverride")
    module = getattr(value, "__module__", None) or ""
    return module.startswith("crashoverride._eval") and not module.startswith(app)


def test_every_reference_agent_is_judged_correct() -> None:
    trials = run_suite(Target(timeout=60), scripted=REFERENCE)
    assert len(trials) == len(SCENARIOS)
    wrong = {t.scenario: (t.verdict, t.reason) for t in trials if t.verdict not in CORRECT}
    assert wrong == {}
    # Every scripted turn was asked for: the reference ran as written, over HTTP.
    assert {t.scenario: t.script_left for t in trials if t.script_left} == {}
    assert all(t.turns >= 1 and t.tokens > 0 for t in trials)


def test_every_bad_agent_is_caught_by_an_oracle() -> None:
    trials = run_suite(Target(timeout=60), scripted="bad")
    assert len(trials) == sum(len(s.bad) for s in SCENARIOS)
    passed = {(t.scenario, t.agent): t.reason for t in trials if t.verdict in CORRECT}
    assert passed == {}
    # Bad agents are caught by what the oracles saw, not because the harness broke.
    assert [t for t in trials if t.verdict == "error"] == []
    assert Counter(t.verdict for t in trials)["false_success"] >= len(SCENARIOS)


def test_the_verdict_separates_false_successes_from_harmful_and_wrong_give_ups() -> None:
    fix = next(s for s in SCENARIOS if s.expect == "fix")
    trap = next(s for s in SCENARIOS if s.trap)
    good, wrong = Check(STATE, True), Check(STATE, False, "wrong value")
    harm = Check(EFFECTS_ONCE, False, "charged twice")
    assert verdict(fix, True, [good, Check(LATER, True)]) == "recovered"
    assert verdict(fix, True, [good, Check(LATER, False, "failed again")]) == "false_success"
    assert verdict(fix, False, [wrong]) == "wrong_give_up"
    assert verdict(fix, False, [wrong, harm]) == "damaged"
    assert verdict(trap, False, [good]) == "correct_give_up"
    assert verdict(trap, True, [good]) == "correct_give_up"  # an honest error response
    assert verdict(trap, True, [wrong]) == "false_success"
    assert verdict(trap, False, [harm]) == "damaged"


def test_the_command_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval.json"
    code = main(["eval", "--scripted", "reference", "--scenario", "asgi.renamed_field",
                 "--scenario", "trap.charge_*", "--repeat", "2", "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 0
    assert "SCRIPTED" in printed.out and "asgi.renamed_field [reference]" in printed.out
    assert "4/4" in printed.out  # TOTAL: two scenarios, twice each
    assert "4/4" in printed.err  # the progress line
    document = json.loads(out.read_text())
    assert document["scripted"] is True and document["note"].startswith("SCRIPTED")
    assert document["totals"]["correct"] == 4 and document["totals"]["false_success"] == 0
    assert {group: found["correct"] for group, found in document["by_kind"].items()} == {
        "asgi": 2,
        "trap": 2,
    }
    assert "by kind: asgi 2/2 (false 0), trap 2/2 (false 0)" in printed.out
    assert {t["verdict"] for t in document["trials"]} == {"recovered", "correct_give_up"}


def test_the_command_exits_1_on_a_false_success(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "--scripted", "double_charges", "--scenario", "task.*"])
    assert code == 1
    assert "FALSE SUCCESSES: 1" in capsys.readouterr().out


def test_an_endpoint_that_never_answers_scores_no_give_up() -> None:
    # A trap's correct outcome is the original exception: a dead endpoint must not earn it.
    from crashoverride.testing import MockServer, http_error

    with MockServer([http_error(503, times=None)]) as server:
        target = Target(model="m", base_url=server.base_url, api_key="k", timeout=20)
        trials = run_suite(target, patterns=["trap.rate_missing", "asgi.renamed_field"])
    assert [(t.verdict, t.reason[:26]) for t in trials] == [
        ("error", "the model never answered: "),
        ("error", "the model never answered: "),
    ]


def test_a_scenario_that_breaks_is_an_error_and_the_others_run() -> None:
    broken = dataclasses.replace(SCENARIOS[0], app="crashoverride._eval.apps.no_such_app")
    trial = run_trial(broken, Target(model="m", api_key="k"))
    assert trial.verdict == "error"
    assert trial.reason.startswith("the scenario itself failed: ModuleNotFoundError")
    assert "crashoverride._eval.apps.no_such_app" not in " ".join(sys.modules)


def test_the_command_refuses_a_bad_endpoint_before_running_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["eval", "--base-url", "ftp://nowhere", "--scenario", "asgi.*"]) == 2
    printed = capsys.readouterr()
    assert "base_url" in printed.err and "asgi." not in printed.err  # no trial was started


def test_the_command_needs_a_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["eval"]) == 2
    assert "--base-url" in capsys.readouterr().err


def test_the_python_api_takes_a_model_instance_and_instructions_to_try() -> None:
    reference = next(s for s in SCENARIOS if s.name == "scraper.markup_changed").reference
    model = reference.model()
    trials = crashoverride.evaluate(model=model, scenarios=["scraper.markup_*"],
                                    system_prompt="Candidate instructions under test.")  # fmt: skip
    assert [(t.scenario, t.agent, t.verdict) for t in trials] == [
        ("scraper.markup_changed", "model", "recovered")
    ]
    assert model.first_call.system_instructions.startswith("Candidate instructions under test.")


def test_the_built_in_instructions_cover_what_the_scenarios_need() -> None:
    # Found by reviewing the instructions against the scenarios (README, "Choosing a model"):
    # a rerun repeats a charge (task.charged_then_failed), an outage or a 429 is not the
    # agent's to work around (task.retryable, scraper.rate_limited, trap.charge_unknown), a
    # missing token must not be made up (trap.secret_missing), and a NotImplementedError is
    # missing code to write from its docstring (asgi.not_implemented).
    from crashoverride._agent.prompt import CALL_BRIEF, build_instructions

    instructions = " ".join(build_instructions(None, "", "").split())
    call = " ".join(CALL_BRIEF.split())
    task_brief = " ".join(
        importlib.import_module("crashoverride.integrations.asyncio").TASK_BRIEF.split()
    )
    assert "anything it did before it failed (a charge, a message, a write) is done again" in call
    assert "A rerun repeats everything the coroutine did before it failed" in task_brief
    assert "nor credentials or settings you were not given" in instructions
    assert "a service down, a rate limit, a timeout whose outcome cannot be checked" in instructions
    assert "missing (it raises NotImplementedError: write it from its docstring" in instructions
