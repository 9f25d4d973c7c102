"""Exceptions raised by crashoverride itself (never in place of a user's exception)."""

from __future__ import annotations


class ConfigurationError(TypeError, ValueError):
    """A CrashOverride or handler argument is invalid.

    Raised at construction time so that a misconfiguration surfaces when the application starts,
    not when the first failure happens. It derives from both ``TypeError`` and ``ValueError``
    because it reports wrong types as well as wrong values.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument
