"""Checks that text an attacker chose reached the model only inside the run's fences."""

from __future__ import annotations

import re
from typing import Any

from tests.integrations.asgi_support import first_input


def fenced_only(model: Any, payload: str) -> str:
    """``payload`` is in what ``model`` was first given, and only inside this run's fences.

    Returns that input. The fence id is the one the instructions name; text between a
    well-formed pair of its markers is data, everything else is the trusted part.
    """
    call = model.first_call
    assert call is not None, "the agent never ran"
    (nonce,) = set(re.findall(r'untrusted-data id="([0-9a-f]{12})"', call.system_instructions))
    text = first_input(model)
    assert payload in text
    fence = re.compile(
        rf'<untrusted-data id="{nonce}" source="[^"]*">\n.*?\n</untrusted-data id="{nonce}">',
        re.DOTALL,
    )
    outside = fence.sub("[data]", text)
    assert payload not in outside, outside
    assert "Objective for this block" not in outside, outside
    return text
