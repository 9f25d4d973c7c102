"""The pytest plugin, exercised the way a user's test suite uses it (through pytester)."""

from __future__ import annotations

import pytest

from crashoverride.testing import MockServer, Script, done, eval_python, exec_python

pytest_plugins = ["pytester"]

USER_SCRIPT_TESTS = """
import pytest
from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, give_up

def test_recovers(crashoverride_script):
    co = CrashOverride(model=crashoverride_script(exec_python("caller['x'] = 2"), done("set x")))
    handler = co.handler("Leave `x` set.")
    with handler:
        x = int("two")
    assert x == 2
    assert handler.report.recovered and handler.report.diagnosis == "set x"

def test_gives_up(crashoverride_script):
    co = CrashOverride(model=crashoverride_script(give_up("no data")))
    with pytest.raises(ValueError, match="two"):
        with co.handler():
            int("two")

def test_leaves_a_step_unused(crashoverride_script):
    co = CrashOverride(model=crashoverride_script(
        exec_python("caller['x'] = 1"), done("finished"), done("never used")
    ))
    with co.handler():
        int("two")
"""

USER_SERVER_TEST = """
from crashoverride.testing import done, exec_python

def test_over_the_wire(openai_mock_server):
    openai_mock_server.serve([exec_python("caller['x'] = 3"), done("ok")])
    handler = openai_mock_server.crash_override().handler()
    with handler:
        x = int("three")
    assert x == 3 and handler.report.usage.requests == 2
    assert openai_mock_server.requests[0].body["model"] == "scripted"
"""

USER_CASSETTE_TEST = """
SOURCE = {"body": "hello"}

def test_extracts(crashoverride_cassette):
    handler = crashoverride_cassette.crash_override().handler("Leave `article` set.")
    with handler:
        article = SOURCE["article_text"]
    assert article == "hello"
    assert handler.report.recovered
"""


def test_script_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_SCRIPT_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*UnconsumedModelSteps: 1 scripted model step(s)*"])


def test_mock_server_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_wire=USER_SERVER_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_cassette_fixture_records_then_replays_offline(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_news=USER_CASSETTE_TEST)
    missing = pytester.runpytest("-p", "no:cacheprovider")
    missing.assert_outcomes(errors=1)
    missing.stdout.fnmatch_lines(["*no cassette at*run pytest with --crashoverride-record*"])

    real = Script(eval_python("SOURCE"), exec_python("caller['article'] = SOURCE['body']"), done())
    with MockServer(real) as endpoint:
        recording = pytester.runpytest(
            "-p", "no:cacheprovider", "--crashoverride-record",
            f"--crashoverride-upstream={endpoint.base_url}",
        )  # fmt: skip
        endpoint.assert_complete()
    recording.assert_outcomes(passed=1)
    cassette = pytester.path / "cassettes" / "test_news" / "test_extracts.json"
    assert cassette.is_file()

    # The endpoint is gone: the replay is offline.
    replay = pytester.runpytest("-p", "no:cacheprovider")
    replay.assert_outcomes(passed=1)

    # A change in the code under test is a clear failure, not a made-up answer.
    pytester.makepyfile(test_news=USER_CASSETTE_TEST.replace('"hello"', '"changed"'))
    changed = pytester.runpytest("-p", "no:cacheprovider")
    changed.assert_outcomes(failed=1, errors=1)
    changed.stdout.fnmatch_lines(
        ["*turn 2 does not match the recording: messages[[]3[]].content differs*changed*"]
    )
