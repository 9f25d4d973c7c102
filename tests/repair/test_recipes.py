"""Recipes: a recovered ``with`` block's state repair replays on the next occurrence, with no
model call, when the handler's postcondition then holds; across a fleet through the fix record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from crashoverride import ApprovalRequest, CrashOverride, RedisCoordination
from crashoverride.testing import Script, done, exec_python, script
from tests.fleet.support import FLEET_KEY, clean, close_fleet, fleet_redis, new_namespace
from tests.fleet.test_fleet_persist import stored_values

REPAIR = "caller['total'] = caller['x'] * 2"
REPAIR_AND_PATCH = (
    "replace_function(compute, 'def compute(x):\\n    return x * 2\\n')\n"
    "caller['total'] = compute(caller['x'])"
)


def compute(x: int) -> int:
    raise NotImplementedError("compute")


ORIGINAL = compute.__code__


@pytest.fixture(autouse=True)
def _fresh_code() -> Iterator[None]:
    compute.__code__ = ORIGINAL
    yield
    compute.__code__ = ORIGINAL


def doubled(names: Any) -> bool:
    return bool(names["total"] == names["x"] * 2)


def block(co: CrashOverride, x: int, **options: Any) -> int:
    total = 0
    with co.handler(prompt="total is twice x", **options):
        total = compute(x)
    return total


def test_a_recovered_with_block_replays_its_recipe_with_no_model_call() -> None:
    model = script(exec_python(REPAIR), done("set total"))
    reports: list[Any] = []
    co = CrashOverride(model=model, on_recovery=reports.append)
    assert block(co, 3, postcondition=doubled) == 6
    with capture_logs() as logs:
        assert block(co, 5, postcondition=doubled) == 10  # the same failure, another frame
    assert len(model.calls) == 2  # the first recovery's two turns, nothing more
    first, second = reports
    assert first.via == "agent"
    assert (second.via, second.fleet_role, second.outcome) == ("recipe", "recipe", "recovered")
    assert "saved 2 model calls" in second.reason
    (succeeded,) = [e for e in logs if e["event"] == "recovery.succeeded"]
    assert succeeded["model_calls_saved"] == 2


def test_without_a_postcondition_nothing_is_replayed() -> None:
    model = Script(exec_python(REPAIR), done("set total")).run(exec_python(REPAIR), done()).model()
    co = CrashOverride(model=model)
    assert block(co, 3) == 6
    assert block(co, 4) == 8
    assert len(model.calls) == 4  # two agent runs: a recipe is never judged by itself


def test_a_recipe_whose_postcondition_fails_hands_over_to_the_agent() -> None:
    wrong = "caller['total'] = 6"  # right for x=3 only: a value, not a repair
    model = Script(exec_python(wrong), done()).run(exec_python(REPAIR), done()).model()
    co = CrashOverride(model=model)
    assert block(co, 3, postcondition=doubled) == 6
    with capture_logs() as logs:
        assert block(co, 4, postcondition=doubled) == 8
    assert len(model.calls) == 4
    assert [e["via"] for e in logs if e["event"] == "recovery.succeeded"] == ["agent"]


def fleet(url: str, namespace: str) -> RedisCoordination:
    return RedisCoordination(url, namespace=namespace, key=FLEET_KEY, op_timeout=2.0)


def test_a_recipe_travels_in_the_fix_record_to_a_process_started_later() -> None:
    with fleet_redis() as url:
        namespace = new_namespace()

        first_model = script(exec_python(REPAIR_AND_PATCH), done("patched"))
        first = CrashOverride(model=first_model, coordination=fleet(url, namespace))
        assert block(first, 3, postcondition=doubled) == 6
        compute.__code__ = ORIGINAL  # a process started later
        later_model = script()
        reports: list[Any] = []
        later = CrashOverride(
            model=later_model, coordination=fleet(url, namespace), on_recovery=reports.append
        )
        with capture_logs() as logs:
            assert block(later, 7, postcondition=doubled) == 14
        close_fleet(first, later)
        clean(url, namespace)
    assert len(later_model.calls) == 0
    (report,) = reports
    assert (report.via, report.fleet_role) == ("recipe", "recipe")
    assert report.fix_record.startswith("fix_")
    assert compute(1) == 2  # the code fix came with it
    assert [e["event"] for e in logs if e["event"].startswith("fleet.")] == ["fleet.fix_applied"]


PROVIDER_KEY = "sk-proj-" + "Q7x" * 13 + "z"  # the OpenAI key format: found by its shape
KNOWN_PASSWORD = "Tr0ub4dor&3-horse"  # a plain value, known as a secret from the frame's locals


def secret_block(co: CrashOverride, x: int) -> int:
    db_password = KNOWN_PASSWORD  # the recovery's redactor knows this value
    total = 0
    with co.handler(prompt="total is twice x", postcondition=doubled):
        total = compute(x) + len(db_password) * 0
    return total


@pytest.mark.parametrize(
    "secret", [PROVIDER_KEY, KNOWN_PASSWORD], ids=["provider-key", "known-local-value"]
)
def test_a_recipe_holding_a_secret_stays_in_its_process(secret: str) -> None:
    repair = f"caller['token'] = {secret!r}\n" + REPAIR_AND_PATCH

    with fleet_redis() as url:
        namespace = new_namespace()
        model = script(exec_python(repair), done("patched"))
        reports: list[Any] = []
        co = CrashOverride(
            model=model, on_recovery=reports.append,
            coordination=fleet(url, namespace),
        )  # fmt: skip
        with capture_logs() as logs:
            assert secret_block(co, 3) == 6
        stored = stored_values(url, namespace)
        compute.__code__ = ORIGINAL  # the same failure again, in this process
        assert secret_block(co, 5) == 10
        close_fleet(co)
        clean(url, namespace)
    assert secret.encode() not in stored  # no byte of it reached Redis
    assert b"return x * 2" in stored  # the code fix itself was published
    (withheld,) = [e for e in logs if e["event"] == "fleet.recipe_withheld"]
    assert "secret" in withheld["reason"] and withheld["recovery_id"] == reports[0].recovery_id
    assert [e["event"] for e in logs if e["event"].startswith("fleet.")] == [
        "fleet.lease_taken", "fleet.recipe_withheld", "fleet.fix_published",
    ]  # fmt: skip
    assert len(model.calls) == 2  # in this process the recipe still serves the second failure
    assert (reports[1].via, reports[1].fleet_role) == ("recipe", "recipe")


@pytest.mark.parametrize(
    "secret", [PROVIDER_KEY, KNOWN_PASSWORD], ids=["provider-key", "known-local-value"]
)
def test_a_code_fix_holding_a_secret_stays_in_its_process(secret: str) -> None:
    # The agent wrote a secret into the new code itself: this process runs it, but publishing it
    # would copy the secret into Redis and every process. The fix is withheld, with an event.
    source = f"def compute(x):\n    token = {secret!r}\n    return x * 2 + len(token) * 0\n"
    repair = f"replace_function(compute, {source!r})\ncaller['total'] = compute(caller['x'])"

    with fleet_redis() as url:
        namespace = new_namespace()

        model = script(exec_python(repair), done("patched"))
        co = CrashOverride(model=model, coordination=fleet(url, namespace))
        with capture_logs() as logs:
            assert secret_block(co, 3) == 6
        stored = stored_values(url, namespace)
        assert compute(1) == 2  # fixed here all the same
        compute.__code__ = ORIGINAL  # a process started later: it must run its own agent
        later_model = script(exec_python(REPAIR_AND_PATCH), done("patched"))
        later = CrashOverride(model=later_model, coordination=fleet(url, namespace))
        assert secret_block(later, 4) == 8
        close_fleet(co, later)
        clean(url, namespace)
    assert secret.encode() not in stored  # no byte of it reached Redis
    (withheld,) = [e for e in logs if e["event"] == "fleet.fix_withheld"]
    assert withheld["targets"] == [f"{__name__}.compute"]
    assert "secret" in withheld["reason"]
    assert len(later_model.calls) == 2  # nothing usable arrived: the agent ran there


# -- the gate: a replay is agent code like any other (approve=, the audit trail, the mode) ------


def test_a_replay_passes_the_handlers_approver_and_is_in_the_audit_trail() -> None:
    seen: list[ApprovalRequest] = []

    def reviewer(call: ApprovalRequest) -> bool:
        seen.append(call)
        return True

    reports: list[Any] = []
    co = CrashOverride(model=script(exec_python(REPAIR), done("set total")),
                       on_recovery=reports.append)  # fmt: skip
    assert block(co, 3, postcondition=doubled, approve=reviewer) == 6
    seen.clear()
    with capture_logs() as logs:
        assert block(co, 5, postcondition=doubled, approve=reviewer) == 10
    (asked,) = seen  # the handler's approver saw the snippet before it ran on the new frame
    assert (asked, asked.tool, asked.source, asked.is_code) == (
        REPAIR, "exec_python", "recipe", True,
    )  # fmt: skip
    replayed = reports[1]
    assert replayed.via == "recipe"
    trail = [(c.tool, c.source, c.ok, c.approved_by) for c in replayed.tool_calls]
    assert trail == [("exec_python", "recipe", True, f"approved by {reviewer.__qualname__}")]
    assert replayed.tool_calls[0].code == REPAIR
    called = [(e["tool"], e["source"], e["ok"], e["approved_by"])
              for e in logs if e["event"] == "recovery.tool_called"]  # fmt: skip
    assert called == trail


def test_a_replay_the_approver_denies_never_runs_and_the_agent_takes_over() -> None:
    # The recipe would set the right total (a replay would recover): the denial decides.
    def reviewer(call: ApprovalRequest) -> bool | str:
        return "no replays" if call.source == "recipe" else True

    model = Script(exec_python(REPAIR), done("set total")).run(exec_python(REPAIR), done()).model()
    reports: list[Any] = []
    co = CrashOverride(model=model, approve=reviewer, on_recovery=reports.append)
    assert block(co, 3, postcondition=doubled) == 6
    assert block(co, 4, postcondition=doubled) == 8
    assert len(model.calls) == 4  # the agent ran again
    second = reports[1]
    assert second.via == "agent"
    denied = second.tool_calls[0]
    assert (denied.tool, denied.source, denied.ok) == ("exec_python", "recipe", False)
    assert "no replays" in denied.approved_by and denied.result.startswith("Not run")


def test_diagnose_mode_never_replays_a_recipe() -> None:
    model = Script(exec_python(REPAIR), done("set total")).run(done("the diagnosis")).model()
    reports: list[Any] = []
    co = CrashOverride(model=model, on_recovery=reports.append)
    assert block(co, 3, postcondition=doubled) == 6
    with pytest.raises(NotImplementedError):  # diagnose mode never suppresses, nor changes state
        block(co, 5, postcondition=doubled, mode="diagnose")
    diagnosed = reports[1]
    assert (diagnosed.via, diagnosed.outcome) == ("agent", "failed")
    assert not [c for c in diagnosed.tool_calls if c.ok]
    # The recipe still serves the repair handler: diagnose mode did not consume it.
    assert block(co, 6, postcondition=doubled) == 12
    assert reports[2].via == "recipe"
