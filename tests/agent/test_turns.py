"""A report counts the model turns the run took however the run ended (issue 24 §3.5).

The turns used to be read off the SDK's result, which a run that ends in an exception does
not have: a failed report said ``turns=0`` next to the tool call the first turn made.
"""

from __future__ import annotations

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import MockServer, exec_python, http_error


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        # The first turn calls a tool; the endpoint refuses the second.
        ([exec_python("x = 1"), http_error(400, times=None)], "BadRequestError"),
        # Two turns, each a tool call, and the run is out of turns.
        ([exec_python("x = 1"), exec_python("x = 2")], "max_turns (2) exceeded"),
    ],
    ids=["endpoint-error-on-turn-2", "max-turns"],
)
def test_a_failed_run_reports_the_turns_and_tokens_it_took(
    steps: list[object], reason: str
) -> None:
    with MockServer(steps) as server:
        co = CrashOverride(model="m", base_url=server.base_url, api_key="k", timeout=60,
                           max_turns=2)  # fmt: skip
        handler = co.handler()
        with pytest.raises(KeyError), handler:
            raise KeyError("price")
    report = handler.report
    assert report is not None and report.outcome == "failed"
    assert reason in report.reason
    answered = len(report.tool_calls)  # one tool call per model answer in these scripts
    assert answered >= 1
    assert report.turns == answered
    assert report.usage.requests == answered
    assert report.usage.input_tokens > 0 and report.usage.output_tokens > 0


def test_an_unreachable_endpoint_is_named_in_the_note_without_its_credentials() -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    co = CrashOverride(model="m", base_url="http://scott:tiger-pw@127.0.0.1:9/v1?key=abc",
                       api_key="k", timeout=60)  # fmt: skip
    handler = co.handler()
    with pytest.raises(KeyError) as caught, handler:
        raise KeyError("price")
    report = handler.report
    assert report is not None and report.outcome == "failed"
    assert report.reason.startswith("APIConnectionError: Connection error.")
    assert "http://127.0.0.1:9/v1" in report.reason
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "http://127.0.0.1:9/v1" in notes
    for secret in ("tiger-pw", "scott", "key=abc"):
        assert secret not in report.reason and secret not in notes
