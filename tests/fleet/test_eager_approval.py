"""Eager fleet fixes and who approves them (issue 22 item 8): no failure has happened, so no
handler owns the fix, and the application's ``approve=`` (sync or async) is asked before the
live function is replaced. A handler declaring a rule of its own is refused when declared
(``tests/security/test_gate_paths.py``), so no approver in force is left unasked."""

from __future__ import annotations

import anyio
import pytest
from structlog.testing import capture_logs

from crashoverride import ApprovalRequest, ConfigurationError, CrashOverride
from crashoverride.testing import script
from tests.fleet.support import close_fleet
from tests.fleet.test_fleet import (  # noqa: F401 (the fixtures: Redis, a fresh function)
    ORIGINAL,
    _fresh_code,
    _publish_by_hand,
    _subscribers,
    events,
    fleet,
    transform,
    url,
)
from tests.helpers import await_for

SOURCE = "def transform(value):\n    return value * 7\n"


@pytest.mark.anyio
async def test_an_eager_fix_waits_for_the_applications_async_approver(url: str) -> None:  # noqa: F811
    asked: list[ApprovalRequest] = []

    async def reviewer(request: ApprovalRequest) -> bool | str:
        await anyio.lowlevel.checkpoint()  # on crashoverride's helper loop, whatever the app's
        asked.append(request)
        return "no code from elsewhere"

    eager = CrashOverride(model=script(), timeout=20, approve=reviewer,
                          coordination=fleet(url, apply_fixes="eager"))  # fmt: skip

    @eager.handler()  # the application's rules: nothing of its own to bypass
    def job(i: int) -> int:
        return transform(i)

    with pytest.raises(ConfigurationError):  # a stricter handler cannot be declared
        eager.handler(approve=lambda call: False)
    with capture_logs() as logs:
        await eager.awarm_up()
        await await_for(lambda: _subscribers(url) == 1)
        await anyio.to_thread.run_sync(_publish_by_hand, url, SOURCE)
        with anyio.fail_after(10):
            await await_for(lambda: events(logs, "fleet.fix_refused"))
    close_fleet(eager)
    assert transform.__code__ is ORIGINAL  # the live function was never replaced
    assert [(r.tool, r.source) for r in asked] == [("apply_fix", "fleet")]
    assert "return value * 7" in asked[0]
    (called,) = events(logs, "fleet.tool_called")
    assert (called["tool"], called["ok"]) == ("apply_fix", False)
    assert "no code from elsewhere" in called["approved_by"]
    assert "no code from elsewhere" in events(logs, "fleet.fix_refused")[0]["reason"]
