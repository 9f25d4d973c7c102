"""Whether a failure gets a recovery, and with whom it is coordinated.

Modules: ``credentials`` (can a model be reached at all: the first, cheapest check),
``limits`` (concurrency slots, single-flight, circuit breaker), ``coordination`` (the
coordination protocol and its in-process backend; the fleet's is in ``_fleet``, chosen by the
composition root).

May import: ``_placement``, ``_config``, ``_repair``; type-only: ``_core.recovery``.
"""
