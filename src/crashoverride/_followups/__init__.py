"""Follow-up jobs: background agent runs a recovery asks for, and the runners that own them.

Modules: ``job`` (what a follow-up is, its result and its payload), ``inherit`` (what a
follow-up inherits from its recovery: the settings it runs under, wherever it runs),
``session`` (how a recovery asks for follow-ups and hands them over), ``runners`` (where
follow-ups run), ``taskgroup`` (``TaskGroupRunner``). Running one is the core's
(``_core.followup``), handed in as a callable.

May import: ``_security``, ``_config``, ``_observe``.
"""
