"""ASGI endpoints whose code meets a change: a pagination cursor turned opaque, money turned
``Decimal``, account ids turned into strings, and an endpoint still raising
``NotImplementedError`` that must be implemented from its docstring and its callers."""

from __future__ import annotations

from typing import Any

from crashoverride._eval._apps import judge_requests, service
from crashoverride._eval._scenario import Check, Env, Scenario
from crashoverride.testing import Script, done, eval_python, exec_python
from crashoverride.testing.asgi import patch, replay_request, respond

APP = "crashoverride._eval.apps.asgi_code"
PROMPT = "Answer with a correct response; repair the code for later requests."
CLAIM = done("Fixed: the request now succeeds.")


# -- a pagination cursor changed format ------------------------------------------------------


async def play_cursor(env: Env, app: Any) -> list[Check]:
    web = service(env.co, PROMPT, ("/export", app.export), ("/count", app.count))
    return await judge_requests(env, web, ("/export", {"items": app.ITEMS}),
                                [("/count", {"count": len(app.ITEMS)})])  # fmt: skip


FIXED_PAGING = """\
async def all_items():
    # Cursors are opaque tokens now: pass them back as they came.
    items, cursor = [], None
    while True:
        page = await fetch_page(cursor)
        items += page["items"]
        if page["next"] is None:
            return items
        cursor = page["next"]
"""

CURSOR = Scenario(
    name="asgi.cursor_format", kind="asgi", expect="fix",
    about="the list API's cursors went from offsets to opaque tokens",
    project_prompt="An export API over an upstream list API (fetch_page). Exports must hold "
    "every item exactly once.",
    app=APP, play=play_cursor,
    reference=Script(
        eval_python("await fetch_page(None)"), patch("all_items", FIXED_PAGING), replay_request(),
        done("Cursors are opaque now; all_items passes them back unchanged."),
    ),
    bad={
        "first_page_only": Script(
            patch("all_items", "async def all_items():\n"
                  "    return (await fetch_page(None))['items']\n"),
            replay_request(), done("Export no longer fails."),
        ),
        "claims": Script(CLAIM),
    },
)  # fmt: skip


# -- Decimal vs float money ------------------------------------------------------------------


async def play_money(env: Env, app: Any) -> list[Check]:
    web = service(env.co, PROMPT, ("/price/{item}", app.price))
    return await judge_requests(
        env, web, ("/price/notebook", {"item": "notebook", "gross": "3.23"}),
        [("/price/pen", {"item": "pen", "gross": "2.80"}),
         ("/price/mug", {"item": "mug", "gross": "10.75"})],
    )  # fmt: skip


FIXED_GROSS = """\
def gross(net):
    # Money is Decimal: no float on the way, half-up to the cent.
    from decimal import ROUND_HALF_UP, Decimal

    taxed = Decimal(net) * (1 + Decimal(str(TAX)))
    return taxed.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
"""

MONEY = Scenario(
    name="asgi.decimal_money", kind="asgi", expect="fix",
    about="net prices arrive as Decimal; the tax rate is a float",
    project_prompt="A price API. Money is Decimal, rounded half-up to the cent (house rule).",
    app=APP, play=play_money,
    reference=Script(
        eval_python("NET, TAX"), patch("gross", FIXED_GROSS), replay_request(),
        done("Prices are Decimal; gross computes in Decimal and rounds half-up."),
    ),
    bad={
        "floats": Script(
            patch("gross", "def gross(net):\n    return round(float(net) * (1 + TAX), 2)\n"),
            replay_request(), done("Converted to float."),
        ),
        "claims": Script(CLAIM),
    },
)  # fmt: skip


# -- account ids became strings --------------------------------------------------------------


async def play_ids(env: Env, app: Any) -> list[Check]:
    web = service(env.co, PROMPT, ("/accounts/{account}", app.balance))
    return await judge_requests(
        env, web, ("/accounts/acc_1002", {"account": "acc_1002", "balance_cents": 120}),
        [("/accounts/acc_1001", {"account": "acc_1001", "balance_cents": 5000})],
    )  # fmt: skip


STRING_IDS = Scenario(
    name="asgi.string_ids", kind="asgi", expect="fix",
    about="account ids changed from numbers to strings like `acc_1001`",
    project_prompt="A balance API over the account service (ACCOUNTS). Balances come from "
    "there only.",
    app=APP, play=play_ids,
    reference=Script(
        eval_python("list(ACCOUNTS)[:3]"),
        patch("account_key", "def account_key(raw):\n    # Ids are strings now.\n"
              "    return raw if raw.startswith('acc_') else int(raw)\n"),
        replay_request(), done("Account ids are strings now; account_key keeps them."),
    ),
    bad={
        "wrong_account": Script(
            exec_python("respond(200, {'account': 'acc_1002', "
                        "'balance_cents': ACCOUNTS['acc_1001']['balance_cents']})"),
            done("Answered with the balance."),
        ),
        "invents": Script(respond(200, {"account": "acc_1002", "balance_cents": 0}),
                          done("Answered.")),
    },
)  # fmt: skip


# -- implement it just in time ---------------------------------------------------------------


async def play_points(env: Env, app: Any) -> list[Check]:
    web = service(env.co, PROMPT, ("/points", app.points))
    return await judge_requests(
        env, web, ("/points?total=2599&tier=gold", {"points": 50}),
        [("/points?total=450&tier=gold", {"points": 0}),
         ("/points?total=1000", {"points": 10})],
    )  # fmt: skip


POINTS_SOURCE = """\
def loyalty_points(total_cents, tier):
    # One point per full euro, doubled for gold; nothing under 5 euros.
    if total_cents < 500:
        return 0
    earned = total_cents // 100
    return earned * 2 if tier == "gold" else earned
"""

NOT_IMPLEMENTED = Scenario(
    name="asgi.not_implemented", kind="asgi", expect="fix",
    about="an endpoint's helper raises NotImplementedError; its docstring says what it does",
    project_prompt="A loyalty API. Implement missing pricing rules from their docstrings.",
    app=APP, play=play_points,
    reference=Script(
        exec_python("import inspect\nprint(inspect.getsource(loyalty_points))\n"
                    "print(inspect.getsource(receipt_footer))"),
        patch("loyalty_points", POINTS_SOURCE), replay_request(),
        done("Implemented loyalty_points from its docstring and replayed."),
    ),
    bad={
        "guesses": Script(
            patch("loyalty_points", "def loyalty_points(total_cents, tier):\n"
                  "    return total_cents // 100\n"),
            replay_request(), done("Implemented loyalty_points."),
        ),
        "shallow": Script(respond(200, {"points": 50}), done("Answered.")),
    },
)  # fmt: skip

SCENARIOS = (CURSOR, MONEY, STRING_IDS, NOT_IMPLEMENTED)
