"""A live patch that makes things worse is put back (``patch_watch``), and the failure that
showed it is recovered afresh. Fleet-wide reverts: tests/integrations/test_fleet_revert.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from crashoverride import ConfigurationError, CrashOverride, RecoveryReport
from crashoverride.testing import done, exec_python, give_up, script

RATES = {"USD": 2}


def convert(value: int) -> int:
    return RATES["EUR"] * value  # the bug: no EUR rate (KeyError)


def narrow(value: int) -> int:  # a function of its own: what its old code raised is its own
    return RATES["EUR"] * value


def windowed(value: int) -> int:
    return RATES["EUR"] * value


ORIGINAL = convert.__code__
CODES = {f: f.__code__ for f in (convert, narrow, windowed)}
# Works for the failing call (rerun() verifies it), and divides by zero for another input.
FIX = "replace_function(convert, 'def convert(value):\\n    return 100 // value\\n')\nrerun()"
# Works for the failing call and raises the same KeyError as before for most other inputs.
NARROW_FIX = (
    "replace_function(narrow, 'def narrow(value):\\n    return {5: 20}[value]\\n')\nrerun()"
)


@pytest.fixture(autouse=True)
def _original_code() -> Iterator[None]:
    for function, code in CODES.items():
        function.__code__ = code
    yield
    for function, code in CODES.items():
        function.__code__ = code


def reverted(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "recovery.patch_reverted"]


@pytest.mark.anyio
async def test_a_patch_that_raises_a_new_exception_type_is_reverted_and_recovered_afresh() -> None:
    reports: list[RecoveryReport] = []
    model = script(
        exec_python(FIX), done("patched"),  # the first failure
        exec_python("set_result(-1)"), done("answered"),  # the failure the patch caused
        exec_python("set_result(-5)"), done("answered"),  # the old bug, recovered afresh
    )  # fmt: skip
    co = CrashOverride(model=model, timeout=30, on_recovery=reports.append)

    @co.handler()
    async def job(value: int) -> int:
        return convert(value)

    with capture_logs() as logs:
        assert await job(5) == 20
        assert convert.__code__ is not ORIGINAL
        assert reverted(logs) == []
        assert await job(0) == -1  # ZeroDivisionError: the old code never raised that here
    (event,) = reverted(logs)
    assert convert.__code__ is ORIGINAL  # the old code runs again, for every caller
    assert "ZeroDivisionError" in event["reason"]
    assert event["targets"] == [f"{__name__}.convert"]
    assert reports[1].via == "agent" and reports[1].outcome == "recovered"
    # The old bug again: recovered by a new agent run, not replayed through the reverted fix.
    assert await job(5) == -5
    assert [r.via for r in reports] == ["agent", "agent", "agent"]
    assert len(model.calls) == 6


def test_a_patch_that_fails_more_often_than_the_old_code_is_reverted() -> None:
    model = script(
        exec_python(NARROW_FIX), done("patched"),
        give_up("not mine"),  # one failure of the new code: no more than the old code's one
        give_up("not mine"),  # a second one: more than before the patch
    )  # fmt: skip
    co = CrashOverride(model=model, timeout=30, breaker_threshold=10)

    @co.handler()
    def job(value: int) -> int:
        return narrow(value)

    with capture_logs() as logs:
        assert job(5) == 20
        with pytest.raises(KeyError):
            job(6)
        assert reverted(logs) == []
        assert narrow.__code__ is not CODES[narrow]
        with pytest.raises(KeyError):
            job(7)
    (event,) = reverted(logs)
    assert narrow.__code__ is CODES[narrow]
    assert "2 failures" in event["reason"] and "1 before" in event["reason"]


def test_a_patch_is_watched_only_for_its_window() -> None:
    model = script(
        exec_python(FIX.replace("convert", "windowed")), done("patched"), give_up("not mine")
    )
    co = CrashOverride(model=model, timeout=30, patch_watch=0.2)

    @co.handler()
    def job(value: int) -> int:
        return windowed(value)

    with capture_logs() as logs:
        assert job(5) == 20
        time.sleep(0.5)  # the window has passed: the patch stands whatever happens next
        with pytest.raises(ZeroDivisionError):
            job(0)
    assert reverted(logs) == []
    assert windowed.__code__ is not CODES[windowed]


@pytest.mark.parametrize("value", [-1, float("nan"), "300", True])
def test_a_bad_watch_window_is_refused_at_construction(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="patch_watch"):
        CrashOverride(patch_watch=value)
