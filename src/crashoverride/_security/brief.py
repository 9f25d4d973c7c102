"""``Brief``: what a block is, for the agent, with trusted text and untrusted values kept apart.

Every brief is made of trusted template parts and untrusted values, and a value can only ever
be rendered inside a fence (issue 21). The parts are text written with the code: crashoverride's
templates, or a custom integration's own. They are fixed at import (``tests/architecture/
test_fences.py`` checks every construction), and the agent reads them as instructions. The values
are everything a particular occurrence brings with it: a request's method and target, a task's
id and retry count, the name of the function that failed. Each one is fenced as data on its
own, under its label, and the parts refer to it by that label ("the task shown above").

A brief built any other way cannot reach the model: ``Block`` accepts only a ``Brief``, and a
``Brief`` offers no way to put a value into its parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import LiteralString, Protocol


class Fencing(Protocol):
    """Marks text as untrusted data (``crashoverride._agent.prompt.Fence``)."""

    def __call__(self, text: str, source: str) -> str: ...


class Brief:
    """Trusted text about a block, and the untrusted values it refers to.

    Args:
        *parts: The trusted text, joined by line breaks (empty parts are left out). Write it;
            never build it from anything the occurrence brought (use a value).
        **values: The untrusted values, by label (an identifier: it names the fence). Each is
            shown as ``str(value)``, fenced, before the parts.
    """

    __slots__ = ("parts", "values")

    parts: tuple[str, ...]
    values: Mapping[str, str]

    def __init__(self, *parts: LiteralString, **values: object) -> None:
        for part in parts:
            if type(part) is not str:
                raise TypeError(f"a brief's parts are text, got {type(part).__name__}")
        for label in values:
            if not label.isidentifier():  # it is written into the fence's marker
                raise ValueError(f"a brief's value label must be an identifier, got {label!r}")
        self.parts = parts
        self.values = MappingProxyType({label: str(value) for label, value in values.items()})

    def render(self, fence: Fencing, redact: Callable[[str], str]) -> str:
        """The text for the agent: each value redacted and fenced, then the parts."""
        shown = [fence(redact(value), label) for label, value in self.values.items()]
        about = "This occurrence:\n" + "\n".join(shown) + "\n\n" if shown else ""
        return about + redact("\n".join(part for part in self.parts if part))

    def __repr__(self) -> str:
        return f"Brief({len(self.parts)} parts, values={sorted(self.values)})"


NO_BRIEF = Brief()
