"""Declared side effects and the journal of a unit of work.

Modules: ``journal`` (the unit of work — a request, a task call, a decorated call, a ``with``
block, a follow-up —, the attempt running in this context, and the entries of what its
declared effects did), ``effect`` (the stand-in of a function declared with
``CrashOverride.effect``: a replay of the unit, and the agent's own code, find what an earlier
attempt already did instead of doing it again).

May import: ``_errors``, ``_security``, ``_observe`` (the last two on the replay path only: an
effect's happy path imports nothing).
"""
