"""One gate for agent code, checked on the source: where code can be compiled and run, and that
every path running agent-derived code calls the gate.

* The ``exec``/``eval``/``compile`` builtins are reached only in ``_security/gate.py`` (the
  whole package is read, ``_eval`` and its scenario apps included: none of them needs one).
* Every use of a name that compiles or runs code, patches a function or runs a snippet in the
  agent's namespace is listed below with the reason it is covered by the gate. A new use fails
  until it is argued for here; a use that is gone fails too, so the list stays true.
* The entries of the paths that run agent-derived code (the SDK tools, handoffs' tools, recipe
  replays, fleet fixes, follow-ups) call the gate.

The reader is ``choke_points.py``; the last tests plant violations to show it finds them.
"""

from __future__ import annotations

import textwrap
from typing import Final

from tests.architecture.choke_points import Use, builtin_uses, calls_in, uses
from tests.architecture.graph import modules

GATE: Final = "crashoverride._security.gate"
WRAP: Final = "crashoverride._security.handoffs"

# What compiles or runs code, patches live functions, or runs agent code outside a tool call.
NAMES: Final = frozenset({
    "run_code", "compile_agent", "compile_source", "register_source",  # gate's primitives
    "replace_function", "rebind_everywhere", "as_function",  # live patching
    "apply",  # records.apply: a fleet fix's changes
    "_execute",  # recipes._execute: one replayed snippet
    "run_agent_code", "gate_agent", "gated", "Gate", "Owner",  # the gate's entries
})  # fmt: skip
ATTRIBUTES: Final = frozenset({
    (None, "execute"), (None, "evaluate"), (None, "inspect"),  # the agent's namespace
    (None, "snippet"),  # ToolRun.snippet: a built-in tool's code
    ("records", "receive"),  # a fleet fix, verified and applied
    (None, "code_owner"),  # Recovery.code_owner: who answers for code outside tool calls
})  # fmt: skip

_TOOL = "a built-in tool's code, run only by its SDK tool inside Gate.call (sdk_tools._sdk_tool)"
_NAMESPACE = "the agent's namespace: its code runs only through a gated tool call or replay"

SITES: Final[dict[tuple[str, str, str], str]] = {
    # the gate itself
    (GATE, "compile_agent", "register_source"): "the primitive, in the gate",
    (GATE, "compile_source", "compile_agent"): "the primitive, in the gate",
    (GATE, "run_agent_code", "Gate"): "the gate's entry for code outside tool calls",
    (WRAP, "_gated_agent", "gated"): "every tool not ours (handoffs' too) wrapped by the gate",
    # one agent run: its tools pass the gate
    ("crashoverride._agent.run", "_run", "Gate"): "the gate of one agent run",
    ("crashoverride._agent.run", "_run", "gate_agent"): "the factory's agent, every tool gated",
    ("crashoverride._agent.namespace", "Workspace._compile", "register_source"): _NAMESPACE,
    ("crashoverride._agent.namespace", "Workspace._compile", "compile_agent"): _NAMESPACE,
    ("crashoverride._agent.namespace", "Workspace.evaluate.<lambda>", "run_code"): _NAMESPACE,
    ("crashoverride._agent.namespace", "Workspace.execute.<lambda>", "run_code"): _NAMESPACE,
    ("crashoverride._agent.toolbox", "_eval_python", "run.snippet"): _TOOL,
    ("crashoverride._agent.toolbox", "_eval_python.<lambda>", "ws.evaluate"): _TOOL,
    ("crashoverride._agent.toolbox", "_exec_python", "run.snippet"): _TOOL,
    ("crashoverride._agent.toolbox", "_exec_python.<lambda>", "ws.execute"): _TOOL,
    ("crashoverride._agent.toolbox", "_inspect_python", "run.snippet"): _TOOL,
    ("crashoverride._agent.toolbox", "_inspect_python.<lambda>", "ws.inspect"): _TOOL,
    ("crashoverride._diagnose.snapshot", "_evaluate", "compile_agent"): (
        "inspect_python's expression, in the forked copy: a built-in tool (gated)"
    ),
    ("crashoverride._diagnose.snapshot", "_evaluate", "run_code"): (
        "inspect_python's expression, in the forked copy: a built-in tool (gated)"
    ),
    ("crashoverride._core.prepare", "prepare", "replace_function"): (
        "bound into the agent's namespace: called only by agent code (gated)"
    ),
    ("crashoverride._core.prepare", "prepare", "rebind_everywhere"): (
        "bound into the agent's namespace: called only by agent code (gated)"
    ),
    ("crashoverride._repair.patching", "as_function", "compile_source"): "a patch's new source",
    ("crashoverride._repair.patching", "as_function", "run_code"): "a patch's new source",
    ("crashoverride._repair.patching", "replace_function", "as_function"): "a patch",
    ("crashoverride._repair.persist", "_bare_definition", "compile_agent"): (
        "a persisted definition, compiled to be digested: never run"
    ),
    # recipes: replayed through run_agent_code
    ("crashoverride._repair.recipes", "record", "workspace.execute"): (
        "wraps the namespace to collect what the gated exec_python calls ran; runs nothing"
    ),
    ("crashoverride._repair.recipes", "replay", "rec.code_owner"): "the replay's owner",
    ("crashoverride._repair.recipes", "replay", "run_agent_code"): "each snippet, gated",
    ("crashoverride._repair.recipes", "replay", "_execute"): "handed to run_agent_code",
    ("crashoverride._repair.recipes", "_execute", "workspace.execute"): (
        "one snippet of a replay, run by run_agent_code only (``replay``)"
    ),
    # fleet fixes: received through run_agent_code, on failure and eagerly
    ("crashoverride._fleet.records", "receive", "run_agent_code"): "a fleet fix, gated",
    ("crashoverride._fleet.records", "receive.execute", "apply"): "inside run_agent_code",
    ("crashoverride._fleet.records", "apply", "replace_function"): "reached from receive only",
    ("crashoverride._fleet.records", "apply", "rebind_everywhere"): "reached from receive only",
    ("crashoverride._fleet.records", "apply", "as_function"): "reached from receive only",
    ("crashoverride._fleet.backend", "Fleet._apply", "records.receive"): "on failure",
    ("crashoverride._fleet.backend", "Fleet._apply", "rec.code_owner"): "the recovery answers",
    ("crashoverride._fleet.eager", "Eager._take", "records.receive"): "eagerly",
    ("crashoverride._fleet.eager", "Eager.owner", "Owner"): "the application answers",
    ("crashoverride._core.recovery", "Recovery.code_owner", "Owner"): "the recovery answers",
    # not code at all
    ("crashoverride._fleet.backend", "Fleet._join.first", "pipe.execute"): "a Redis pipeline",
    ("crashoverride._fleet.scripts", "outcome_and_lease", "pipe.execute"): "a Redis pipeline",
    ("crashoverride._fleet.effects", "RedisJournal._write.write", "pipe.execute"): (
        "a Redis pipeline"
    ),
    ("crashoverride.integrations.celery", "queue_consumers", "(...).inspect"): (
        "Celery's control.inspect(): asks the workers, runs no code"
    ),
}

# The entries of the paths that run agent-derived code, and the gate call each must make.
GATED: Final[dict[tuple[str, str], str]] = {
    ("crashoverride._agent.sdk_tools", "_sdk_tool.invoke"): "gate.call",  # built-in tools
    (WRAP, "gated.on_invoke"): "gate.call",  # application, MCP and handoffs' tools
    (WRAP, "_handed.on_invoke"): "gate.run",  # a handoff's transfer (its on_handoff)
    ("crashoverride._agent.run", "_run"): "gate_agent",  # the agent and its handoffs
    ("crashoverride._repair.recipes", "replay"): "run_agent_code",  # recipe replays
    ("crashoverride._fleet.records", "receive"): "run_agent_code",  # fleet fixes
    # A follow-up is the same pipeline, hence the same agent run (``_core.followup``) and gate.
    ("crashoverride._core.followup", "run_job"): "pipeline.run",
}


def _sources() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in modules().items()}


def unlisted(found: list[Use]) -> list[Use]:
    return [use for use in found if (use.module, use.function, use.name) not in SITES]


def test_the_code_builtins_are_reached_only_in_the_gate() -> None:
    found = [use for name, source in _sources().items() for use in builtin_uses(name, source)]
    assert {(use.module, use.function, use.name) for use in found} == {
        (GATE, "compile_agent", "compile"),
        (GATE, "run_code", "eval"),
    }, found


def test_every_use_of_a_code_running_name_is_listed_with_its_reason() -> None:
    found = [
        use for name, source in _sources().items() for use in uses(name, source, NAMES, ATTRIBUTES)
    ]
    assert unlisted(found) == [], "a new use: argue for it in SITES (how the gate covers it)"
    gone = set(SITES) - {(use.module, use.function, use.name) for use in found}
    assert gone == set(), "listed uses that no longer exist: drop them from SITES"


def test_the_paths_that_run_agent_code_call_the_gate() -> None:
    sources = _sources()
    missing = {
        entry: call
        for entry, call in GATED.items()
        if call not in calls_in(sources[entry[0]], entry[1])
    }
    assert missing == {}


def test_no_followup_module_runs_code_of_its_own() -> None:
    # Follow-ups (every runner) run agent code only through the pipeline's agent run.
    followup_modules = [
        name for name in _sources() if name.startswith(("crashoverride._followups",
                                                         "crashoverride._core.followup"))
    ]  # fmt: skip
    assert "crashoverride._followups.runners" in followup_modules
    sources = _sources()
    for name in followup_modules:
        assert uses(name, sources[name], NAMES, ATTRIBUTES) == [], name
        assert builtin_uses(name, sources[name]) == [], name


# -- the reader finds what it must (planted violations) ------------------------------------------

PLANTED = textwrap.dedent(
    """
    import builtins

    def direct(text):
        return eval(text)

    class Sneaky:
        def handed_on(self):
            run = exec
            return lambda: run("x = 1")

        def spelled(self, text):
            return builtins.compile(text, "<x>", "exec"), getattr(builtins, "eval")

    table = __builtins__["exec"]
    """
)


def test_the_reader_finds_planted_builtins_wherever_they_hide() -> None:
    found = {(use.function, use.name) for use in builtin_uses("planted", PLANTED)}
    assert found == {
        ("direct", "eval"),
        ("Sneaky.handed_on", "exec"),
        ("Sneaky.spelled", "compile"),
        ("Sneaky.spelled", "eval"),
        ("<module>", "exec"),
    }


def test_a_planted_unlisted_use_and_a_planted_ungated_path_fail() -> None:
    # A new module that runs agent code with the gate's primitive, bypassing the gate...
    bypass = textwrap.dedent(
        """
        from crashoverride._security.gate import compile_source, run_code

        async def replay_quietly(snippet, namespace):
            run_code(compile_source(snippet), namespace)
        """
    )
    found = uses("crashoverride._repair.quiet", bypass, NAMES, ATTRIBUTES)
    assert [(use.function, use.name) for use in unlisted(found)] == [
        ("replay_quietly", "run_code"), ("replay_quietly", "compile_source"),
    ]  # fmt: skip
    # ... and recipes.replay with its gate call taken out.
    real = _sources()["crashoverride._repair.recipes"]
    assert "run_agent_code" in calls_in(real, "replay")
    ungated = real.replace("await run_agent_code(owner, call, execute)", "await execute()")
    assert ungated != real and "run_agent_code" not in calls_in(ungated, "replay")
