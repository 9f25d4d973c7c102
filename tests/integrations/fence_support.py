"""Checks that text an attacker chose reached the model only inside the run's fences."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from tests.integrations.asgi_support import first_input

# What a reader may take for "<", "/" or a letter of the markers' name: the tests' own fold,
# independent of the fence's (NFKC, marks and invisible characters dropped, and the
# Cyrillic and Greek letters that look like Latin ones).
_LOOKS_LIKE = str.maketrans({
    "‹": "<", "\u3008": "<", "\u27e8": "<", "❮": "<", "ᐸ": "<", "∕": "/", "⧸": "/",
    "а": "a", "е": "e", "ѕ": "s", "т": "t", "г": "r", "ԁ": "d", "υ": "u", "ս": "u",
    "α": "a", "ε": "e", "τ": "t", "ո": "n", "п": "n",
    "ᴜ": "u", "ɴ": "n", "ᴛ": "t", "ʀ": "r", "ꜱ": "s", "ᴇ": "e", "ᴅ": "d", "ᴀ": "a",
})  # fmt: skip


def read_as_a_model_might(text: str) -> str:
    text = unicodedata.normalize("NFKD", text)
    kept = (c for c in text if unicodedata.category(c) not in ("Mn", "Me", "Cf"))
    return unicodedata.normalize("NFKC", "".join(kept)).translate(_LOOKS_LIKE).lower()


MARKER = re.compile(r"<[\W_]*untrusted[\W_]*data")


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
    for inside in fence.findall(text):  # nothing in the data reads as a marker of any fence
        data = inside.split("\n", 1)[1].rsplit("\n", 1)[0]
        assert not MARKER.search(read_as_a_model_might(data)), data
    return text
