"""Coordination through Redis: one agent run per failure across a fleet, and fixes that travel.

Modules: ``backend`` (single-flight with a lease, breaker, budget, fix records), ``waiter``
(a waiter's wait for the leader's outcome), ``link`` (the one connection to Redis, usable from
any thread or loop), ``scripts`` (the Redis layout and its Lua scripts), ``records`` (signed
fix records: made, verified, applied), ``eager`` (``apply_fixes="eager"``: apply records as
they are published; and hear revocations),
``revocation`` (a reverted fix's record revoked fleet-wide, signed like a record), ``effects``
(the journal of declared effects of units with an id, signed entries in Redis, for a retry on
any process).

May import: ``_errors``, ``_placement``, ``_security``, ``_config``, ``_observe``, ``_effects``,
``_repair``, ``_admission``; type-only: ``_core.recovery``.
"""
