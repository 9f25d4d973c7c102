"""Configuration, validated at construction: the settings table and the fleet's options.

Modules: ``settings`` (the one table of recovery settings: application defaults plus handler
overrides), ``checks`` (the validation each row of the table names), ``coordination``
(``RedisCoordination``, a description that never imports redis).

May import: ``_errors``, ``_security``.
"""
