"""A websocket endpoint whose upstream changed under a live connection: the quotes service
nests the price under ``last`` now. The connection must stay open: the failed message is
answered from the repaired code, and the messages after it need no recovery."""

from __future__ import annotations

from typing import Any

from crashoverride._eval._apps import converse, socket_service
from crashoverride._eval._scenario import LATER, STATE, Check, Env, Scenario, equal, holds
from crashoverride._eval._scenario import one_recovery as _one_recovery
from crashoverride.testing import Script, done, eval_python
from crashoverride.testing.asgi import patch, replay_message, send_json

APP = "crashoverride._eval.apps.websocket"
PROMPT = "Answer the message with a correct reply; repair the code for later messages."

# Ground truth: what the quotes service says, in the shape the clients read.
ACME = {"symbol": "ACME", "price": "12.50", "currency": "EUR"}
LATER_REPLIES = [
    {"symbol": "BOLT", "price": "7.05", "currency": "EUR"},
    {"symbol": "CORE", "price": "101.20", "currency": "USD"},
]


async def play_quotes(env: Env, app: Any) -> list[Check]:
    web = socket_service(env.co, PROMPT, "/quotes", app.quotes)
    talk = await converse(web, "/quotes", ["ACME", "BOLT", "core"])
    return [
        equal(STATE, "the failed message's reply", talk.replies[0], ACME),
        equal(LATER, "later replies", talk.replies[1:], LATER_REPLIES),
        holds(LATER, not talk.raised, "the connection ended on the application's exception"),
        _one_recovery(env),
    ]


FIXED_QUOTE = """\
def quote_of(symbol):
    # The quotes service nests the price and its currency under "last" now.
    last = QUOTES[symbol]["last"]
    return {"symbol": symbol, "price": last["amount"], "currency": last["currency"]}
"""

QUOTES_FIELD = Scenario(
    name="websocket.quote_shape", kind="asgi", expect="fix",
    about="a live quotes feed: the upstream nests the price under `last` now",
    project_prompt="A websocket quotes feed over the market data service (QUOTES). Clients "
    "read symbol, price (a string) and currency.",
    app=APP, play=play_quotes,
    reference=Script(
        eval_python("QUOTES['ACME']"), patch("quote_of", FIXED_QUOTE), replay_message(),
        done("The price is under last.amount now; quote_of reads it and the message was "
             "handled again."),
    ),
    bad={
        "reply_only": Script(
            send_json({"symbol": "ACME", "price": "12.50", "currency": "EUR"}),
            done("Answered the client."),
        ),
        "invents": Script(
            send_json({"symbol": "ACME", "price": "12.00", "currency": "EUR"}),
            done("Answered with a price."),
        ),
        "claims": Script(done("Fixed: the feed works again.")),
    },
)  # fmt: skip

SCENARIOS = (QUOTES_FIELD,)
