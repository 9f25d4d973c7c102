"""Persisting a fix: a CGI-style script is recovered once, and its next run needs no recovery.

The scripts run as real subprocesses; only their model is scripted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crashoverride._persist import REFUSED

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''\
"""A CGI-style script: one invocation per request."""
import sys

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script


def price(qty):
    raise NotImplementedError("price: 3 per item, 10 per dozen")


FIX = (
    "replace_function(price, 'def price(qty):\\\\n    dozens, rest = divmod(qty, 12)\\\\n"
    "    return dozens * 10 + rest * 3\\\\n')\\n"
    "caller['total'] = price(int(sys.argv[1]))"
)
co = CrashOverride(
    model=script(exec_python(FIX), exec_python("print(persist_function(price))"),
                 done("implemented price and persisted it")),
    allow_source_changes={allow},
    source_changes={style!r},
)
total = None
handler = co.handler(prompt="Leave `total` holding the price of the order.")
with handler:
    total = price(int(sys.argv[1]))
print("total", total)
report = handler.report
print("recovery", report.outcome if report else "none")
if report:
    for call in report.tool_calls:
        print("tool", call.result)
    for change in report.source_changes:
        print("change", change.kind, change.file)
'''


def _write_script(tmp_path: Path, *, allow: bool, style: str) -> Path:
    path = tmp_path / "order.py"
    path.write_text(SCRIPT.replace("{allow}", str(allow)).replace("{style!r}", repr(style)))
    return path


def _run(path: Path, qty: int) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(path), str(qty)],
        capture_output=True, text=True, timeout=120, env=env, cwd=path.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_recovered_fix_is_written_and_the_next_run_needs_no_recovery(tmp_path: Path) -> None:
    path = _write_script(tmp_path, allow=True, style="write")
    original = path.read_text()
    first = _run(path, 14)
    assert "total 16" in first and "recovery recovered" in first
    assert "change written" in first
    source = path.read_text()
    assert "raise NotImplementedError" not in source
    assert "dozens, rest = divmod(qty, 12)" in source
    backups = list(tmp_path.glob("order.py.rec_*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == original
    second = _run(path, 25)  # a fresh process: the fix now comes from the file
    assert "total 23" in second and "recovery none" in second


def test_patch_style_proposes_without_touching_the_source(tmp_path: Path) -> None:
    path = _write_script(tmp_path, allow=True, style="patch")
    original = path.read_text()
    out = _run(path, 12)
    assert "total 10" in out and "change proposed" in out
    assert path.read_text() == original
    (patch,) = tmp_path.glob("order.py.rec_*.patch")
    text = patch.read_text()
    assert text.startswith("--- a/order.py") and "+    dozens, rest = divmod(qty, 12)" in text
    assert "-    raise NotImplementedError" in text


def test_persistence_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = _write_script(tmp_path, allow=False, style="write")
    original = path.read_text()
    out = _run(path, 1)
    # The live repair still happened; only the file write was refused, and the agent was told.
    assert "total 3" in out
    assert "PermissionError" in out and REFUSED.split(":")[0] in out
    assert path.read_text() == original
    assert not list(tmp_path.glob("order.py.rec_*"))


@pytest.mark.parametrize("bad", ["print(", "def price(qty) return 1"])
def test_a_fix_that_does_not_parse_is_never_written(tmp_path: Path, bad: str) -> None:
    from crashoverride._persist import SourceEditor

    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    editor = SourceEditor(allowed=True, style="write", recovery_id="rec_test",
                          redact=lambda s: s, fields=dict)  # fmt: skip
    with pytest.raises(SyntaxError):
        editor.persist_file_edit(str(target), "x = 1", bad)
    assert target.read_text() == "x = 1\n"
