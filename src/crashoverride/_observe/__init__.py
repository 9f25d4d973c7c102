"""What a recovery tells the world: events, the report, and the systems it reports to.

Modules: ``events`` (every structlog event name, and the one emitter), ``report`` (the public
``RecoveryReport``), ``record`` (a report as JSON and back), ``transcript`` (a recovery as plain
text), ``ledger`` (``on_recovery`` sinks that keep reports), ``observers`` (which telemetry
systems the application set up), ``otel`` (OpenTelemetry spans and metrics), ``sentry``
(Sentry events). ``otel`` and ``sentry`` load only when the application configured them.

May import: ``_version``, ``_security``.
"""
