"""Cassettes: the model exchanges of a real recovery, stored as JSON and replayed offline.

Only the fields that decide a response are stored and compared (``DECISIVE_FIELDS``). Before
storing, and before comparing, text is made portable and safe:

- secrets are masked with the core ``Redactor`` (secret-looking environment values plus the API
  keys the recorder saw), so a cassette can be committed;
- the working directory, home, temp and interpreter paths become placeholders and memory
  addresses and the random ids of untrusted-data fences are blanked, so a cassette recorded on
  one machine matches on another.

Headers are never stored: credentials travel in them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from crashoverride._agent.prompt import without_fence_ids
from crashoverride._security.redact import RedactedData, Redactor
from crashoverride.testing._chat import DECISIVE_FIELDS, decisive

FORMAT = "crashoverride-cassette/1"
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_SHOWN = 60  # characters of context around a difference in error messages


class CassetteError(Exception):
    """A cassette cannot be used (missing, unreadable, exhausted)."""


class CassetteMismatch(CassetteError):
    """A request did not match the recorded one: the replay stops rather than invent an answer.

    Attributes:
        turn: 1-based number of the request in the cassette.
        field: Where the first difference is, e.g. ``messages[2].content``.
    """

    def __init__(self, message: str, *, turn: int, field: str) -> None:
        super().__init__(message)
        self.turn = turn
        self.field = field


def _path_roots() -> list[tuple[str, str]]:
    roots = {
        os.getcwd(): "<cwd>",
        os.path.expanduser("~"): "<home>",
        tempfile.gettempdir(): "<tmp>",
        sys.prefix: "<prefix>",
        sys.base_prefix: "<base-prefix>",
    }
    # Longest first: the working directory usually lives inside home or temp.
    usable = [(path, name) for path, name in roots.items() if len(path) > 1]
    return sorted(usable, key=lambda pair: len(pair[0]), reverse=True)


def make_scrubber(secrets: Iterable[str] = ()) -> Callable[[Mapping[str, Any]], RedactedData]:
    """A function that redacts and normalises every string inside a JSON document.

    Redacted first (a secret must be masked whole, before a path inside it becomes a
    placeholder), normalised, then redacted as a whole again: what a cassette stores is the
    redactor's output (``RedactedData``), the normalising included."""
    redact = Redactor(secrets)
    roots = _path_roots()

    def text(value: str) -> str:
        value = redact(value)
        for path, name in roots:
            value = value.replace(path, name)
        # A run's fence id is random (it must be unpredictable); recordings must not be.
        return without_fence_ids(_ADDRESS.sub("0x?", value))

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if isinstance(value, list):
            return [scrub(item) for item in value]
        if isinstance(value, dict):
            return {key: scrub(item) for key, item in value.items()}
        return value

    return lambda value: redact.data(scrub(value))


class Cassette:
    """Recorded request/response pairs, in the order the model was asked.

    Each interaction is ``{"request": {model, messages, tools, tool_choice}, "response":
    <chat.completion>}``.
    """

    def __init__(
        self, interactions: Iterable[dict[str, Any]] = (), *, path: str | Path | None = None
    ) -> None:
        self.interactions: list[dict[str, Any]] = list(interactions)
        self.path = Path(path) if path is not None else None

    @classmethod
    def load(cls, path: str | Path) -> Cassette:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CassetteError(f"no cassette at {path}: record it first") from None
        except (OSError, ValueError) as exc:
            raise CassetteError(f"cannot read cassette {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CassetteError(f"{path} is not a {FORMAT} file")
        return cls(data.get("interactions") or [], path=path)

    def save(self, path: str | Path | None = None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise CassetteError("no path to save the cassette to")
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": FORMAT, "interactions": self.interactions}
        # Write then rename: an interrupted recording never leaves half a cassette behind.
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", "utf-8")
        partial.replace(target)
        self.path = target
        return target

    def __len__(self) -> int:
        return len(self.interactions)

    def record(self, request: RedactedData, response: RedactedData) -> None:
        """Add one exchange, as ``make_scrubber`` left it (``request``: its decisive fields)."""
        self.interactions.append({"request": request, "response": response})

    def response_for(self, turn: int, request: dict[str, Any], scrub: Any) -> dict[str, Any]:
        """The recorded response of ``turn`` (1-based) if ``request`` matches its recording."""
        where = f"cassette {self.path}" if self.path is not None else "cassette"
        if turn > len(self.interactions):
            raise CassetteMismatch(
                f"{where}: turn {turn} was requested but only {len(self.interactions)} "
                "were recorded; re-record the cassette",
                turn=turn,
                field="(turn count)",
            )
        recorded = self.interactions[turn - 1]
        received = scrub(decisive(request))
        for name in DECISIVE_FIELDS:
            found = _difference(recorded["request"].get(name), received.get(name), name)
            if found is not None:
                field, detail = found
                raise CassetteMismatch(
                    f"{where}: turn {turn} does not match the recording: {field} differs: "
                    f"{detail}; re-record the cassette if the change is intended",
                    turn=turn,
                    field=field,
                )
        response: dict[str, Any] = recorded["response"]
        return response


def _difference(recorded: Any, received: Any, path: str) -> tuple[str, str] | None:
    """The first place two JSON values differ, as (path, explanation), or None."""
    if isinstance(recorded, dict) and isinstance(received, dict):
        for key in sorted(set(recorded) | set(received)):
            if key not in received:
                return f"{path}.{key}", "recorded but missing from the request"
            if key not in recorded:
                return f"{path}.{key}", "in the request but not in the recording"
            found = _difference(recorded[key], received[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(received, list):
        for index, (old, new) in enumerate(zip(recorded, received, strict=False)):
            found = _difference(old, new, f"{path}[{index}]")
            if found is not None:
                return found
        if len(recorded) != len(received):
            return path, f"recorded {len(recorded)} items, received {len(received)}"
        return None
    if recorded == received:
        return None
    if isinstance(recorded, str) and isinstance(received, str):
        at = next(
            (i for i, (a, b) in enumerate(zip(recorded, received, strict=False)) if a != b),
            min(len(recorded), len(received)),
        )
        start = max(0, at - _SHOWN // 2)
        return path, (
            f"at character {at}: recorded {recorded[start : start + _SHOWN]!r}, "
            f"received {received[start : start + _SHOWN]!r}"
        )
    return path, f"recorded {_short(recorded)}, received {_short(received)}"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
