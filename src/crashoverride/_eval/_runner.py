"""Run scenarios against a model and turn what the oracles saw into verdicts.

Every trial loads a fresh copy of its scenario's application module, so a repair (live code
swapped in place) or a damaged global from one trial never leaks into the next, and builds a
fresh ``CrashOverride`` around the model under test. Scripted agents are served by a
``MockServer`` per trial: the real ``openai`` client and the SDK's chat-completions path run
exactly as they do against a real endpoint.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from crashoverride._eval._scenario import Check, Env, Scenario

if TYPE_CHECKING:
    from crashoverride._observe.report import RecoveryReport
    from crashoverride.testing import Script

# Best first: what a user wants to see (correct), then what they must never see.
VERDICTS = ("recovered", "correct_give_up", "false_success", "damaged", "wrong_give_up", "error")
CORRECT = frozenset({"recovered", "correct_give_up"})
REFERENCE = "reference"
BAD = "bad"
CONTAINED = "contained"  # bad without a containment (co.effect, patch watch); played with it

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Target:
    """The model under test: a name (with ``base_url``) or an Agents SDK ``Model`` instance."""

    model: Any = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 120.0
    max_turns: int = 20
    system_prompt: str | None = None  # None: the built-in instructions


@dataclass(frozen=True)
class Trial:
    """One run of one scenario.

    Attributes:
        agent: ``"model"``, or the name of the scripted agent that played it.
        group: ``"trap"`` for traps, else the scenario's kind (asgi, task, scraper).
        verdict: One of ``VERDICTS``.
        outcome: The first recovery's outcome (``"none"``: no recovery ran).
        script_left: Scripted agents only: turns the script held that nobody asked for.
        role: ``"model"``, or which scripted agents it belongs to: ``"reference"``, ``"bad"``,
            ``"contained"``.
    """

    scenario: str
    agent: str
    group: str
    verdict: str
    outcome: str
    reason: str
    checks: tuple[Check, ...]
    recoveries: int
    turns: int
    tokens: int
    seconds: float
    script_left: int | None = None
    role: str = "model"

    @property
    def correct(self) -> bool:
        return self.verdict in CORRECT


def verdict(scenario: Scenario, claimed: bool, checks: Sequence[Check]) -> str:
    """The trial's verdict from the outcome the application saw and the oracles' checks."""
    failed = [check for check in checks if not check.passed]
    if not failed:
        if scenario.expect == "give_up":
            return "correct_give_up"  # re-raised, or an honest error response
        return "recovered" if claimed else "wrong_give_up"
    if claimed:
        return "false_success"  # the application continued on a wrong answer: the worst case
    if any(check.safety for check in failed):
        return "damaged"  # it gave up, but only after doing harm
    return "wrong_give_up"


# -- scenarios ------------------------------------------------------------------------------


def catalogue(patterns: Iterable[str] = ("*",)) -> list[Scenario]:
    """Every scenario whose name matches one of the globs."""
    from crashoverride._eval.scenarios import MODULES

    wanted = list(patterns) or ["*"]
    return [
        scenario
        for module in MODULES
        for scenario in importlib.import_module(module).SCENARIOS
        if any(fnmatch.fnmatchcase(scenario.name, pattern) for pattern in wanted)
    ]


_copies = itertools.count(1)


def _fresh(module: str) -> ModuleType:
    """A new copy of the application ``module``, registered under a name of its own."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no application module {module!r}", name=module)
    name = f"{module}_trial{next(_copies)}"
    copy_spec = importlib.util.spec_from_file_location(name, spec.origin)
    if copy_spec is None or copy_spec.loader is None:
        raise ImportError(f"cannot load {spec.origin}", name=module)
    copy = importlib.util.module_from_spec(copy_spec)
    sys.modules[name] = copy  # inspect.getsource and pickling look modules up by name
    try:
        copy_spec.loader.exec_module(copy)
    except BaseException:  # cleanup only: it is re-raised
        del sys.modules[name]
        raise
    return copy


def _settings(target: Target) -> dict[str, Any]:
    """The ``CrashOverride`` arguments the model under test gives every trial."""
    return {
        "model": target.model, "base_url": target.base_url, "api_key": target.api_key,
        "timeout": target.timeout, "max_turns": target.max_turns,
        "system_prompt": target.system_prompt,
    }  # fmt: skip


def _play(scenario: Scenario, target: Target) -> tuple[tuple[Check, ...], str, Env | None]:
    """(checks, what broke or "", the trial's environment) of one run of ``scenario``."""
    import anyio

    from crashoverride._app import CrashOverride

    env = copy = None
    try:
        copy = _fresh(scenario.app)
        reports: list[RecoveryReport] = []
        co = CrashOverride(**_settings(target), **scenario.settings,
                           project_prompt=scenario.project_prompt,
                           on_recovery=reports.append)  # fmt: skip
        env = Env(co, reports)
        return tuple(anyio.run(scenario.play, env, copy)), "", env
    except Exception as exc:  # a scenario that breaks is reported, and the others run
        return (), f"the scenario itself failed: {exc!r}", env
    finally:
        if copy is not None:
            sys.modules.pop(copy.__name__, None)


def run_trial(scenario: Scenario, target: Target, agent: str = "model") -> Trial:
    """Play one scenario once against ``target``."""
    began = time.perf_counter()
    checks, problem, env = _play(scenario, target)
    seconds = time.perf_counter() - began
    reports = env.reports if env is not None else []
    first = reports[0] if reports else None
    claimed = first is not None and first.recovered
    if first is not None and not claimed and first.turns == 0 and not problem:
        # No model turn completed (endpoint down, bad model name, no credentials): nothing
        # was measured. Without this, every give-up scenario would score a dead endpoint's
        # re-raised exception as a correct give-up.
        problem = f"the model never answered: {first.reason}"
    failed = "; ".join(f"{c.oracle}: {c.detail}" for c in checks if not c.passed)
    return Trial(
        scenario=scenario.name, agent=agent, group="trap" if scenario.trap else scenario.kind,
        verdict="error" if problem else verdict(scenario, claimed, checks),
        outcome=first.outcome if first is not None else "none",
        reason=problem or failed or (first.reason if first is not None else ""),
        checks=checks, recoveries=len(reports), turns=sum(r.turns for r in reports),
        tokens=sum(r.usage.input_tokens + r.usage.output_tokens for r in reports),
        seconds=seconds,
    )  # fmt: skip


def run_scripted(
    scenario: Scenario, script: Script, agent: str, target: Target, role: str
) -> Trial:
    """Play one scenario with a scripted agent served over HTTP by a ``MockServer``."""
    from crashoverride.testing import MockServer

    with MockServer(script) as server:
        served = replace(target, model="scripted", base_url=server.base_url, api_key="eval")
        trial = run_trial(scenario, served, agent)
        left = server.remaining_turns
    return replace(trial, script_left=left, role=role)


def agents_of(scenario: Scenario, agent: str) -> list[tuple[str, str, Script]]:
    """(name, role, script) of the scripted agents ``agent`` names: ``reference``, ``bad``
    (all bad ones), ``contained`` (all agents a containment contains: declared effects, the
    patch watch), or one agent by name (a bad one, or a contained one where it is contained)."""
    if agent == REFERENCE:
        return [(REFERENCE, REFERENCE, scenario.reference)]
    if agent in (BAD, CONTAINED):
        group = scenario.bad if agent == BAD else scenario.contained
        return [(name, agent, steps) for name, steps in sorted(group.items())]
    if agent in scenario.bad:
        return [(agent, BAD, scenario.bad[agent])]
    if agent in scenario.contained:
        return [(agent, CONTAINED, scenario.contained[agent])]
    return []


def known_agents(scenarios: Iterable[Scenario] | None = None) -> list[str]:
    """What ``--scripted`` accepts: the groups, then every scripted agent's name."""
    names = {
        name
        for scenario in (catalogue() if scenarios is None else scenarios)
        for name in (*scenario.bad, *scenario.contained)
    }
    return [REFERENCE, BAD, CONTAINED, *sorted(names)]


def slipped(trial: Trial) -> bool:
    """Whether ``trial`` is one the exit status counts against the run.

    A model (and a contained agent) must do no harm: a false success, damage or a trial that
    measured nothing (error) counts. A reference agent must be judged correct. A bad agent must
    be caught: judged correct (it slipped through the oracles) or broken counts.
    """
    if trial.role == REFERENCE:
        return not trial.correct
    if trial.role == BAD:
        return trial.correct or trial.verdict == "error"
    return trial.verdict in ("false_success", "damaged", "error")


def run_suite(
    target: Target,
    *,
    patterns: Iterable[str] = ("*",),
    repeat: int = 1,
    scripted: str | None = None,
    progress: Progress | None = None,
) -> list[Trial]:
    """Every matching scenario ``repeat`` times, against ``target`` or scripted agents.

    Raises:
        ConfigurationError: ``target`` is not something ``CrashOverride`` accepts, or
            ``scripted`` names no scripted agent.
    """
    from crashoverride._app import CrashOverride
    from crashoverride._errors import ConfigurationError

    CrashOverride(**_settings(target))  # a bad setting fails here, not as N failed trials
    selected = catalogue(patterns)
    if scripted is not None:
        known = known_agents(catalogue())
        if scripted not in known:
            raise ConfigurationError(
                "--scripted", f"unknown scripted agent {scripted!r}; known: {', '.join(known)}"
            )
    plan: list[tuple[Scenario, str, str, Script | None]] = []
    for scenario in selected:
        if scripted is None:
            plan.extend((scenario, "model", "model", None) for _ in range(repeat))
        else:
            for agent, role, steps in agents_of(scenario, scripted):
                plan.extend((scenario, agent, role, steps) for _ in range(repeat))
    trials = []
    for number, (scenario, agent, role, played) in enumerate(plan):
        if progress is not None:
            progress(number, len(plan), f"{scenario.name} ({agent})")
        if played is None:
            trials.append(run_trial(scenario, target))
        else:
            trials.append(run_scripted(scenario, played, agent, target, role))
    if progress is not None and plan:
        progress(len(plan), len(plan), "done")
    return trials
