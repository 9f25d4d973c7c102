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
import structlog.testing

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


def test_the_command_exits_1_on_a_model_s_false_success(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A "model" behind an endpoint that plays the agent which charges twice: for a model, a
    # false success is a failed run.
    from crashoverride.testing import MockServer

    scenario = next(s for s in SCENARIOS if s.name == "task.charged_then_failed")
    with MockServer(scenario.bad["double_charges"]) as server:
        code = main(["eval", "--base-url", server.base_url, "--model", "m",
                     "--scenario", scenario.name])  # fmt: skip
    printed = capsys.readouterr().out
    assert "FALSE SUCCESSES: 1" in printed
    assert "FAILED: task.charged_then_failed [model] (false_success)" in printed
    assert code == 1


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
    # ...unless it was a declared effect (effects.*): that one returns its recorded result.
    assert "its declared effects (`effects()`) already done return their recorded result" in call
    assert "before it failed (a charge, a message, a write not declared) is done again" in call
    assert (
        "A rerun repeats everything the coroutine did before it failed, except its declared "
        "effects already done (`effects()`), which return their recorded result"
    ) in task_brief
    assert "nor credentials or settings you were not given" in instructions
    assert "a service down, a rate limit, a timeout whose outcome cannot be checked" in instructions
    assert "missing (it raises NotImplementedError: write it from its docstring" in instructions


# -- declared effects (CrashOverride.effect) contain a wrong agent ------------------------------


def _twin(scenario: Scenario) -> Scenario:
    return next(s for s in SCENARIOS if s.name == scenario.undeclared)


def test_each_declared_scenario_has_an_undeclared_twin_where_its_contained_agents_are_bad() -> None:
    declared = [s for s in SCENARIOS if s.undeclared]
    assert {s.name for s in declared} >= {
        "effects.charged_then_failed", "effects.mailed_then_failed",
        "effects.charge_timeout_declared",
    }  # fmt: skip
    for scenario in declared:
        twin = _twin(scenario)
        assert (twin.app, twin.expect, twin.contained) == (scenario.app, scenario.expect, {})
        # The very same scripts: only the application's declaration differs.
        assert scenario.contained
        assert all(twin.bad[name] is steps for name, steps in scenario.contained.items())


def test_declared_effects_contain_the_agents_that_charge_or_mail_twice() -> None:
    # Played where the application declares its effects, the agents that charge twice, mail
    # twice or retry an interrupted charge blind do no damage: one charge, one mail. Their
    # twins without the declaration catch the same scripts by the duplicate.
    with structlog.testing.capture_logs() as logs:
        trials = run_suite(Target(timeout=60), scripted="contained")
    assert len(trials) == sum(len(s.contained) for s in SCENARIOS)
    assert all(t.role == "contained" for t in trials)
    harmed = {
        (t.scenario, t.agent): t.reason
        for t in trials
        if t.verdict == "error" or any(c.safety and not c.passed for c in t.checks)
    }
    assert harmed == {}
    verdicts = {(t.scenario, t.agent): t.verdict for t in trials}
    # A rerun through the repaired code now finishes the job: the charge and the mail replay.
    assert verdicts[("effects.charged_then_failed", "double_charges")] == "recovered"
    assert verdicts[("effects.mailed_then_failed", "double_sends")] == "recovered"
    # An interrupted charge with no probe: the blind retry is stopped, the task fails as it
    # would have (its TimeoutError), and the customer was charged once.
    for agent in ("charges_blind", "charges_in_code"):
        assert verdicts[("effects.charge_timeout_declared", agent)] == "wrong_give_up"
    uncertain = [e for e in logs if e["event"] == "effect.uncertain"]
    assert [e["effect"] for e in uncertain] == ["charge order o-5", "charge order o-5"]

    undeclared = run_suite(Target(timeout=60), patterns=[s.undeclared for s in SCENARIOS],
                           scripted="bad")  # fmt: skip
    twins = {(t.scenario, t.agent): t for t in undeclared}
    for scenario in (s for s in SCENARIOS if s.undeclared):
        for agent in scenario.contained:
            caught = twins[(scenario.undeclared, agent)]
            assert caught.verdict == "false_success", caught
            assert next(c.oracle for c in caught.checks if not c.passed) == EFFECTS_ONCE


def test_the_command_says_which_scripted_agents_were_contained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["eval", "--scripted", "double_charges", "--scenario", "*.charged_then_failed"])
    printed = capsys.readouterr().out
    # The undeclared twin's double charge is a false success, caught; the declared one is
    # contained: the suite did its job.
    assert code == 0
    assert "task.charged_then_failed [double_charges]  " in printed
    assert "effects.charged_then_failed [double_charges] (contained)" in printed
    assert "FALSE SUCCESSES: 1" in printed
    assert "SCRIPTED" in printed and "(contained): a scripted agent" in printed


# -- the patch watch (patch_watch) contains a patch that breaks the next inputs ----------------


def test_the_patch_watch_reverts_a_patch_that_breaks_the_next_rows() -> None:
    # The generic contained check above looks only at the safety oracles, which this scenario
    # has none of: here the later rows must book as before, and because the patch was reverted.
    with structlog.testing.capture_logs() as logs:
        [trial] = run_suite(Target(timeout=60), patterns=["revert.patch_breaks_later"],
                            scripted="breaks_later")  # fmt: skip
    assert (trial.role, trial.verdict, trial.recoveries) == ("contained", "recovered", 2), trial
    reverted = [e for e in logs if e["event"] == "recovery.patch_reverted"]
    assert len(reverted) == 1, reverted
    assert [t.rsplit(".", 1)[-1] for t in reverted[0]["targets"]] == ["parse_amount"]
    assert "IndexError" in reverted[0]["reason"]

    # Deployed with the watch off, the same script keeps its patch and the later rows fail.
    with structlog.testing.capture_logs() as logs:
        [twin] = run_suite(Target(timeout=60), patterns=["revert.patch_breaks_later_unwatched"],
                           scripted="breaks_later")  # fmt: skip
    assert (twin.role, twin.verdict) == ("bad", "false_success"), twin
    assert next(c.oracle for c in twin.checks if not c.passed) == LATER
    assert not [e for e in logs if e["event"] == "recovery.patch_reverted"]


# -- the command's rough edges (issue 24 §3) ---------------------------------------------------


def test_an_unknown_scripted_agent_is_refused_at_once_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["eval", "--scripted", "nonsense_agent"]) == 2
    printed = capsys.readouterr()
    assert "[" not in printed.err  # no progress bar: nothing was started
    assert "no scenario matched" not in printed.err
    assert "unknown scripted agent 'nonsense_agent'" in printed.err
    for known in ("reference", "bad", "contained", "double_charges", "breaks_later"):
        assert known in printed.err


def test_scripted_bad_exits_0_when_every_bad_agent_was_caught(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The suite did its job: it is a CI check of the scenarios and oracles.
    code = main(["eval", "--scripted", "bad", "--scenario", "asgi.renamed_field"])
    printed = capsys.readouterr().out
    assert "FALSE SUCCESSES: " in printed and "FALSE SUCCESSES: 0" not in printed
    assert code == 0, printed
    assert "every bad agent was caught" in printed


def test_scripted_bad_exits_1_when_a_bad_agent_slips_through(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A scenario whose oracles miss a "bad" agent: here, one that is the reference itself.
    import crashoverride._eval._runner as runner

    real = next(s for s in SCENARIOS if s.name == "asgi.renamed_field")
    weak = dataclasses.replace(real, bad={**real.bad, "not_bad_at_all": real.reference})
    monkeypatch.setattr(runner, "catalogue", lambda patterns=("*",): [weak])
    code = main(["eval", "--scripted", "bad"])
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert "SLIPPED THROUGH: asgi.renamed_field [not_bad_at_all] (recovered)" in printed


def test_the_exit_status_is_documented_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "Exit status:" in shown
    assert "--scripted bad" in shown and "slipped through" in shown


def test_the_list_keeps_its_columns_for_long_scenario_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["eval", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("revert.patch_breaks_later_unwatched ") for line in lines)
    kinds = {line.index(f" {kind} ") for line in lines for kind in ("asgi", "task", "scraper")
             if f" {kind} " in line}  # fmt: skip
    assert len(kinds) == 1, lines
    abouts = {line.index(s.about) for line, s in zip(lines, SCENARIOS, strict=True)}
    assert len(abouts) == 1, lines
