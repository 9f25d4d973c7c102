"""Task workers whose input changed shape: weights now in grams under a new name, and a
partner's CSV export that switched its delimiter."""

from __future__ import annotations

from typing import Any

from crashoverride._eval._apps import task
from crashoverride._eval._scenario import LATER, STATE, Check, Env, Scenario, equal, one_recovery
from crashoverride.testing import Script, done, eval_python
from crashoverride.testing.tasks import patch, rerun, set_result

APP = "crashoverride._eval.apps.tasks_data"
CLAIM = done("Fixed: the task completes now.")


async def run_tasks(env: Env, prompt: str, work: Any, inputs: list[Any]) -> list[Any]:
    """``work`` on every input as a protected task; None where it failed."""
    guarded = task(env.co, prompt)(work)
    results = []
    for value in inputs:
        try:
            results.append(await guarded(value))
        except Exception:
            results.append(None)
    return results


def judged(env: Env, results: list[Any], truth: list[Any]) -> list[Check]:
    return [equal(STATE, "first result", results[0], truth[0]),
            equal(LATER, "later results", results[1:], truth[1:]), one_recovery(env)]  # fmt: skip


# -- units changed ---------------------------------------------------------------------------


async def play_units(env: Env, app: Any) -> list[Check]:
    results = await run_tasks(env, "Return the parcel's postage in cents.", app.postage_for,
                              ["p-1", "p-2", "p-3"])  # fmt: skip
    return judged(env, results, [690, 450, 2130])


FIXED_POSTAGE = """\
async def postage_for(parcel_id):
    # The warehouse reports grams under `weight_g` now.
    return postage_cents(PARCELS[parcel_id]["weight_g"] / 1000)
"""

UNITS = Scenario(
    name="task.units_changed", kind="task", expect="fix",
    about="the warehouse reports `weight_g` in grams instead of `weight_kg`",
    project_prompt="A postage task. Weights come from the warehouse API (PARCELS).",
    app=APP, play=play_units,
    reference=Script(
        eval_python("PARCELS[args[0]]"), patch("postage_for", FIXED_POSTAGE), rerun(),
        done("Weights are grams under weight_g now; converted to kg."),
    ),
    bad={
        "wrong_function": Script(
            patch("postage_cents", "def postage_cents(weight_kg):\n"
                  "    weight_kg = weight_kg / 1000 if weight_kg > 100 else weight_kg\n"
                  "    extra = max(0, -(-int(weight_kg * 1000 - 1000) // 1000))\n"
                  "    return 450 + 120 * extra\n"),
            rerun(), done("postage_cents accepts grams."),
        ),
        "wrong_units": Script(
            patch("postage_for", "async def postage_for(parcel_id):\n"
                  "    return postage_cents(PARCELS[parcel_id]['weight_g'])\n"),
            rerun(), done("Read weight_g."),
        ),
        "shallow": Script(set_result(690), done("Computed this parcel's postage.")),
    },
)  # fmt: skip


# -- the CSV delimiter changed ---------------------------------------------------------------


async def play_csv(env: Env, app: Any) -> list[Check]:
    results = await run_tasks(env, "Return the units sold that day.", app.units_sold,
                              ["mon", "tue"])  # fmt: skip
    return judged(env, results, [15, 5])


FIXED_ROWS = """\
def parse_rows(text):
    # The partner switched the delimiter to ";": let the header line tell.
    delimiter = ";" if ";" in text.partition("\\n")[0] else ","
    return list(csv.DictReader(io.StringIO(text), delimiter=delimiter))
"""

CSV = Scenario(
    name="task.csv_delimiter", kind="task", expect="fix",
    about="a partner's CSV export switched its delimiter to `;`",
    project_prompt="A sales report task over the partner's nightly CSV exports (EXPORTS).",
    app=APP, play=play_csv,
    reference=Script(
        eval_python("EXPORTS[args[0]][:40]"), patch("parse_rows", FIXED_ROWS), rerun(),
        done("The export uses ';' now; parse_rows reads the delimiter from the header."),
    ),
    bad={
        "invents": Script(set_result(0), done("No sales.")),
        "claims": Script(CLAIM),
    },
)  # fmt: skip

SCENARIOS = (UNITS, CSV)
