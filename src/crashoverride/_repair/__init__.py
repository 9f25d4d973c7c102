"""Changing the live process, and remembering what changed.

Modules: ``patching`` (live code repair that reaches every caller), ``persist`` (writing a fix
to its source file, or proposing it as a patch), ``recipes`` (a recovered block's state repair,
replayed on its next occurrence), ``journal`` (the change journal: what a recovery's agent code
changed, per recovery), ``watch`` (the patch watch: a live patch that makes its function fail
more, or differently, is reverted).

May import: ``_placement``, ``_security``, ``_observe``, ``_diagnose``; type-only:
``_core.recovery`` (recipes).
"""
