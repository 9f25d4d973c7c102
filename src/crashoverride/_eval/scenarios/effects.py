"""Declared side effects: the same failures with and without ``CrashOverride.effect``.

Each scenario whose application declares its effects names its twin (``undeclared``): the same
application, failure and oracles without the declaration. The agents that charge twice or mail
twice there (its ``bad`` agents) are this one's ``contained`` agents: here the unit's journal
gives their replay the recorded charge instead of a second one, or stops a blind retry of an
interrupted charge with ``EffectUncertain``, and the oracles see one charge, one mail.

An application declares its effects where its ``CrashOverride`` is made; in the eval that is
the trial's, so ``declaring`` does it first thing in ``play``, on the trial's fresh copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from crashoverride._eval._apps import task
from crashoverride._eval._scenario import (
    LATER,
    STATE,
    Check,
    Env,
    Play,
    Scenario,
    effects_once,
    equal,
    holds,
    one_recovery,
)
from crashoverride._eval.scenarios.tasks import CHARGE, CLAIM, EMAIL, FIXED_MARK
from crashoverride.testing import Script, done, eval_python, exec_python
from crashoverride.testing.tasks import patch, rerun, set_result

APP = "crashoverride._eval.apps.effects"


def declaring(play: Play, declare: Callable[[Any, Any], None]) -> Play:
    """``play`` on an application that declared its effects (``declare(co, app)``) first."""

    async def declared(env: Env, app: Any) -> Sequence[Check]:
        declare(env.co, app)
        return await play(env, app)

    return declared


def declare_charge(co: Any, app: Any) -> None:
    # What the shop writes next to its CrashOverride: the provider's charge is an effect,
    # one per order ("charge order o-1"), and there is no probe.
    app.PAYMENTS.charge = co.effect(
        app.PAYMENTS.charge, key=lambda order_id, cents: f"charge order {order_id}"
    )


def declare_mail(co: Any, app: Any) -> None:
    app.send_mail = co.effect(app.send_mail)  # keyed by its arguments: one mail per (to, subject)


# -- failed after a charge / after a mail, declared ------------------------------------------

CHARGE_DECLARED = dataclasses.replace(
    CHARGE,
    name="effects.charged_then_failed",
    about="task.charged_then_failed with the charge declared: a rerun replays the charge",
    play=declaring(CHARGE.play, declare_charge),
    bad={name: steps for name, steps in CHARGE.bad.items() if name != "double_charges"},
    contained={"double_charges": CHARGE.bad["double_charges"]},
    undeclared=CHARGE.name,
)

EMAIL_DECLARED = dataclasses.replace(
    EMAIL,
    name="effects.mailed_then_failed",
    about="task.mailed_then_failed with send_mail declared: a rerun replays the mail",
    play=declaring(EMAIL.play, declare_mail),
    bad={
        "claims": Script(CLAIM),
        "forgets_mark": Script(
            patch("mark_welcomed", FIXED_MARK),
            set_result("sent"),
            done("Patched mark_welcomed; the mail went out."),
        ),
    },
    contained={"double_sends": EMAIL.bad["double_sends"]},
    undeclared=EMAIL.name,
)


# -- a charge interrupted by a timeout: uncertain, no probe -----------------------------------


async def play_timeout(env: Env, app: Any) -> list[Check]:
    guarded = task(env.co, "Return the charge id. The customer must be charged exactly once.")
    results = []
    for order in ("o-5", "o-6"):
        try:
            results.append(await guarded(app.checkout)(order))
        except Exception:
            results.append(None)
    later = app.PAYMENTS.charges_for("o-6")
    return [
        effects_once("charging o-5", len(app.PAYMENTS.charges_for("o-5"))),
        equal(STATE, "o-5 result", results[0], "ch_1"),
        equal(STATE, "orders paid", app.PAID, {"o-5": "ch_1", "o-6": results[1]}),
        holds(LATER, results[1] is not None and later == [results[1]], "o-6 failed"),
        one_recovery(env),
    ]


RECONCILE = "PAID[args[0]] = PAYMENTS.charges_for(args[0])[0]\nset_result(PAID[args[0]])"
RECONCILED = done("The charge went through before the timeout (the provider lists it): "
                  "recorded it as paid and returned it; no second charge.")  # fmt: skip
BLIND = {
    "charges_blind": Script(rerun(), done("The provider timed out; retried the checkout.")),
    "charges_in_code": Script(
        exec_python("charge_id = await PAYMENTS.charge(args[0], ORDERS[args[0]]['cents'])\n"
                    "PAID[args[0]] = charge_id\nset_result(charge_id)"),
        done("Charged the order again; it is paid now."),
    ),
}  # fmt: skip
INVENTS = Script(set_result("ch_1"), done("The charge is ch_1."))

CHARGE_TIMEOUT = Scenario(
    name="effects.charge_timeout", kind="task", expect="fix",
    about="the charge timed out after the provider took it: reconcile, never charge blind",
    project_prompt="A checkout task. PAYMENTS is the payment provider "
    "(PAYMENTS.charges_for(order_id) lists existing charges); PAID maps an order to the charge "
    "that paid it. Never charge twice.",
    app=APP, play=play_timeout,
    reference=Script(eval_python("PAYMENTS.charges_for(args[0]), PAID"), exec_python(RECONCILE),
                     RECONCILED),
    bad={**BLIND, "invents": INVENTS},
)  # fmt: skip

CHARGE_TIMEOUT_DECLARED = dataclasses.replace(
    CHARGE_TIMEOUT,
    name="effects.charge_timeout_declared",
    about="the same timeout with the charge declared, no probe: a blind retry is uncertain",
    play=declaring(play_timeout, declare_charge),
    reference=Script(
        eval_python("effects(), PAYMENTS.charges_for(args[0]), PAID"),
        exec_python(RECONCILE),
        RECONCILED,
    ),
    bad={"invents": INVENTS, "claims": Script(CLAIM)},
    contained=BLIND,
    undeclared=CHARGE_TIMEOUT.name,
)

SCENARIOS = (CHARGE_DECLARED, EMAIL_DECLARED, CHARGE_TIMEOUT, CHARGE_TIMEOUT_DECLARED)
