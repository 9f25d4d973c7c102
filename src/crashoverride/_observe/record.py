"""A ``RecoveryReport`` as a JSON document, and back: what the ledger keeps and Sentry shows.

One shape, versioned by ``schema``: a reader accepts any record of the same major version and
ignores fields it does not know (a newer writer may add some). Every text is scanned on the
way out (``scanned_data``), the last line of defence behind the recovery's own redactor (the
report is already redacted), and a record read back is scanned again by its reader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from crashoverride._observe.report import RecoveryReport, SourceChange, Usage
from crashoverride._security.audit import ToolCallRecord
from crashoverride._security.redact import RedactedData, scanned_data

KIND: Final = "crashoverride.recovery"
VERSION: Final = 1
SCHEMA: Final = f"{KIND}/{VERSION}"


def to_record(report: RecoveryReport) -> RedactedData:
    """``report`` as plain JSON types, with its schema."""
    return scanned_data({"schema": SCHEMA, **dataclasses.asdict(report)})


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {field.name for field in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def from_record(data: Mapping[str, Any]) -> RecoveryReport:
    """The report a record holds.

    Raises:
        ValueError: Not a recovery record, or one of another major version.
    """
    schema = data.get("schema")
    kind, _, version = str(schema).rpartition("/")
    if kind != KIND or version.split(".")[0] != str(VERSION):
        raise ValueError(f"not a {SCHEMA} record (schema {schema!r})")
    values = _known(RecoveryReport, data)
    values["tool_calls"] = tuple(
        ToolCallRecord(**_known(ToolCallRecord, item)) for item in data.get("tool_calls", ())
    )
    values["usage"] = Usage(**_known(Usage, data.get("usage", {})))
    values["source_changes"] = tuple(
        SourceChange(**_known(SourceChange, item)) for item in data.get("source_changes", ())
    )
    values["occurrence"] = tuple(
        (str(pair[0]), str(pair[1]))
        for pair in data.get("occurrence", ())
        if isinstance(pair, list | tuple) and len(pair) == 2
    )
    return RecoveryReport(**values)
