"""The declared layering: which unit (subpackage, or module at the top) may import which.

Units are listed lowest first. A unit may import units of its own row and of rows above it in
this list (lower layers), never one further down. Each subpackage's docstring says the same in
words ("May import: ..."); ``test_map`` checks that the words and this table agree.
"""

from __future__ import annotations

from typing import Final

LAYERS: Final[tuple[tuple[str, ...], ...]] = (
    ("_errors", "_version"),  # leaves: our exceptions, the version string
    ("_placement",),  # where code runs: bridge, owner thread, watchdog, frames, deadline
    ("_security",),  # secrets, redaction, fences, the verdict, the gate, the audit records
    ("_config",),  # settings and their validation; the fleet's configuration
    ("_observe",),  # events, the report, transcript, ledger, OpenTelemetry, Sentry
    ("_effects",),  # declared side effects, units of work and their journals
    ("_diagnose",),  # read-only evaluation: forked snapshot, static reader, confinement
    ("_repair",),  # live patching, persistence, recipes, the change journal
    ("_agent",),  # one Agents SDK run: tools, namespace, prompt, clients
    ("_admission",),  # credentials, limits, single-flight, the coordination protocol
    ("_fleet",),  # the Redis backend of coordination, fix records, eager apply
    ("_followups",),  # follow-up jobs, sessions, runners
    ("_core",),  # the pipeline and its records: entry, recovery, prepare, block, follow-up run
    ("_handler",),  # the with / async with / decorator front
    ("_app",),  # the composition root: CrashOverride
    ("integration", "followups"),  # public contracts built on the core
    ("__init__",),  # the public face
    ("integrations", "testing"),  # framework integrations, the offline rehearsal kit
    ("_eval",),  # crashoverride eval: scenarios against a model
    ("_cli",),  # the command
    ("__main__",),
)

# Lazy imports that point up, each a deliberate exception with its reason. Closed: a new one
# fails the suite until it is argued for here.
UPWARD: Final[dict[tuple[str, str], str]] = {
    ("crashoverride", "crashoverride._eval"): (
        "crashoverride.evaluate (documented) is the eval harness, which drives the integrations"
    ),
}

RANK: Final[dict[str, int]] = {unit: rank for rank, row in enumerate(LAYERS) for unit in row}
