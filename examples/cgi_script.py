"""A CGI-style script: a new process per request, so a runtime repair alone would be lost.

``shipping_fee`` was never written. The first run fails inside the protected block; the agent
implements the function in the live process, answers this request, and persists the fix to this
file (``allow_source_changes=True``). Every later run imports the fixed source and needs no
recovery at all.

    python examples/cgi_script.py 3.5            # offline: proposes the fix as a .patch file
    python examples/cgi_script.py 3.5 --write    # offline: writes the fix into this file
    python examples/cgi_script.py 3.5 --live     # a real model (OPENAI_API_KEY) instead

Offline the model is scripted (agents.testing.ScriptedModel) and the script says so. ``--write``
edits this file and keeps a ``.bak`` copy next to it; run it on a copy if you want to keep the
example as shipped.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from crashoverride import CrashOverride


def shipping_fee(weight_kg: float) -> float:
    """4.90 up to 1 kg, then 1.20 for every started kilogram above it."""
    raise NotImplementedError("shipping_fee")


def scripted_agent() -> Any:
    from crashoverride.testing import done, exec_python, script

    # `def` in the agent's session binds a session name; `globals()[...]` is the module's
    # function, whose code replace_function swaps so every caller runs the new one.
    implement = (
        "import math\n"
        "def shipping_fee(weight_kg):\n"
        '    """4.90 up to 1 kg, then 1.20 for every started kilogram above it."""\n'
        "    extra = max(0, math.ceil(weight_kg - 1))\n"
        "    return round(4.90 + 1.20 * extra, 2)\n"
        "replace_function(globals()['shipping_fee'], shipping_fee)"
    )
    return script(
        exec_python("print(show_source(shipping_fee))"),
        exec_python(implement),
        exec_python("caller['fee'] = shipping_fee(caller['weight'])\ncaller['fee']"),
        exec_python("print(persist_function(globals()['shipping_fee']))"),
        done("Implemented shipping_fee from its docstring and persisted it."),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weight", type=float)
    parser.add_argument("--write", action="store_true", help="write the fix into this file")
    parser.add_argument("--live", action="store_true", help="use a real model")
    args = parser.parse_args()
    if not args.live:
        print("(offline: the model is scripted, no AI involved)")
    co = CrashOverride(
        project_prompt="A shipping-fee CGI script. Fees follow the rules in the docstrings.",
        model=None if args.live else scripted_agent(),
        allow_source_changes=True,
        source_changes="write" if args.write else "patch",
    )
    weight = args.weight
    fee = None
    handler = co.handler(
        prompt="Leave `fee` holding the fee for `weight`. Implement missing pricing code from "
        "its docstring and persist it so the next request needs no recovery."
    )
    with handler:
        fee = shipping_fee(weight)
    report = handler.report
    print(json.dumps({"weight_kg": weight, "fee": fee}))
    if report is None:
        print("no recovery was needed")
    else:
        print(f"recovery {report.outcome}: {report.diagnosis}")
        for change in report.source_changes:
            print(f"source change {change.kind}: {change.path} ({change.file})")


if __name__ == "__main__":
    main()
