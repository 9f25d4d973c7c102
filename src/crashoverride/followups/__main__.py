"""``python -m crashoverride.followups APP PAYLOAD``: one follow-up in a process of its own.

Started by ``SubprocessRunner``. ``APP`` is ``"module:attribute"`` naming a ``CrashOverride``;
``PAYLOAD`` is a JSON file this process reads and deletes. Exit status 0 means succeeded.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def load_app(path: str) -> object:
    module_name, _, attribute = path.partition(":")
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m crashoverride.followups MODULE:ATTR PAYLOAD.json")
        return 2
    app_path, payload_path = argv
    with open(payload_path, encoding="utf-8") as file:
        payload = json.load(file)
    # The payload holds a traceback and the executed code: do not leave it in /tmp.
    os.unlink(payload_path)
    from crashoverride._core.followup import run_payload

    result = run_payload(payload, load_app(app_path), runner="SubprocessRunner")
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
