"""The fast tier cannot start processes or servers: tests/conftest.py fails a test that does."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # runs a pytest in a subprocess


def test_a_fast_test_that_starts_a_process_or_a_server_fails(pytester: pytest.Pytester) -> None:
    # The conftest sorts tests by their folder under tests/: give it the same layout.
    pytester.mkdir("tests")
    (pytester.path / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    pytester.makeini(
        "[pytest]\nmarkers =\n    slow: slow\nfilterwarnings = error\naddopts = -p no:cacheprovider"
    )
    (pytester.path / "tests" / "test_tiers_probe.py").write_text(
        "import socket, subprocess, sys\n"
        "import pytest\n"
        "from crashoverride.testing import MockServer, done\n\n"
        "@pytest.fixture\n"
        "def server():\n"
        "    with socket.socket() as s:\n"
        "        s.bind(('127.0.0.1', 0))\n"
        "        s.listen()\n"
        "        yield s\n\n"
        "def test_spawns():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n\n"
        "def test_listens(server):\n"
        "    pass\n\n"
        "@pytest.mark.slow\n"
        "def test_slow_may_spawn(server):\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n\n"
        "def test_the_kits_mock_server_is_in_process():\n"
        "    with MockServer([done()]):\n"
        "        pass\n\n"
        "def test_plain():\n"
        "    pass\n"
    )
    result = pytester.runpytest_subprocess("tests", "-q")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*a fast test started a process or a server*",
            "*started a subprocess: *",
        ]
    )
    result.stdout.fnmatch_lines(["*listened on ('127.0.0.1', *"])
    outcome = {
        line.split(" ")[1].split("::")[-1]
        for line in result.stdout.lines
        if line.startswith(("FAILED", "ERROR"))
    }
    assert outcome == {"test_spawns", "test_listens"}
