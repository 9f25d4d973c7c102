"""Persisting a fix: a CGI-style script is recovered once, and its next run needs no recovery.

The scripts run as real subprocesses; only their model is scripted.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crashoverride._repair.persist import REFUSED

ROOT = Path(__file__).resolve().parents[2]

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    from crashoverride._repair.persist import SourceEditor

    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    editor = SourceEditor(allowed=True, style="write", recovery_id="rec_test",
                          redact=lambda s: s, fields=dict)  # fmt: skip
    with pytest.raises(SyntaxError):
        editor.persist_file_edit(str(target), "x = 1", bad)
    assert target.read_text() == "x = 1\n"


def _editor(style: str = "write", recovery_id: str = "rec_test") -> Any:
    from crashoverride._repair.persist import SourceEditor

    return SourceEditor(allowed=True, style=style, recovery_id=recovery_id,
                        redact=lambda s: s, fields=dict)  # fmt: skip


def test_writing_a_fix_keeps_the_file_mode(tmp_path: Path) -> None:
    target = tmp_path / "tool.py"
    target.write_text("#!/usr/bin/env python\nx = 1\n")
    target.chmod(0o755)  # an executable script must stay executable after its fix
    _editor().persist_file_edit(str(target), "x = 1", "x = 2")
    assert target.read_text() == "#!/usr/bin/env python\nx = 2\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    (backup,) = tmp_path.glob("tool.py.rec_test.bak")  # restoring it is a plain rename
    assert stat.S_IMODE(backup.stat().st_mode) == 0o755


def test_writing_through_a_symlink_updates_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    target = real / "mod.py"
    target.write_text("x = 1\n")
    link = tmp_path / "mod.py"
    link.symlink_to(target)
    out = _editor().persist_file_edit(str(link), "x = 1", "x = 2")
    assert out.startswith("written")
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert target.read_text() == "x = 2\n"
    (backup,) = tmp_path.glob("mod.py.rec_test.bak")  # the backup sits where it always did
    assert backup.read_text() == "x = 1\n"


def test_a_leftover_temporary_file_is_never_written_through(tmp_path: Path) -> None:
    # A fixed temporary name collides with a leftover (or another writer's) file; here the
    # leftover is a symlink, and writing "the temporary file" clobbered whatever it points at.
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    (tmp_path / "mod.py.crashoverride-tmp").symlink_to(victim)
    _editor().persist_file_edit(str(target), "x = 1", "x = 2")
    assert target.read_text() == "x = 2\n" and not target.is_symlink()
    assert victim.read_text() == "precious\n"


def test_a_failed_write_leaves_the_file_and_no_temporary_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")

    def refuse(src: Any, dst: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk gone"):
        _editor().persist_file_edit(str(target), "x = 1", "x = 2")
    monkeypatch.undo()
    assert target.read_text() == "x = 1\n"
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == ["mod.py", "mod.py.rec_test.bak"]


def test_two_proposals_for_one_file_keep_both_patches(tmp_path: Path) -> None:
    target = tmp_path / "mod.py"
    target.write_text("x = 1\ny = 1\n")
    editor = _editor(style="patch")
    first = editor.persist_file_edit(str(target), "x = 1", "x = 2")
    second = editor.persist_file_edit(str(target), "y = 1", "y = 2")
    patches = sorted(tmp_path.glob("mod.py.rec_test*.patch"))
    assert len(patches) == 2, (first, second)
    texts = "".join(p.read_text() for p in patches)
    assert "+x = 2" in texts and "+y = 2" in texts
    assert all(p.stat().st_mode & 0o111 == 0 for p in patches)  # a patch is not a program
    assert sorted(str(c.file) for c in editor.changes) == [str(p) for p in patches]
    assert target.read_text() == "x = 1\ny = 1\n"


def test_two_writes_in_one_recovery_keep_the_original_backup(tmp_path: Path) -> None:
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")
    editor = _editor()
    editor.persist_file_edit(str(target), "x = 1", "x = 2")
    editor.persist_file_edit(str(target), "x = 2", "x = 3")
    assert target.read_text() == "x = 3\n"
    first, second = (change.file for change in editor.changes)
    assert first != second
    assert Path(first).read_text() == "x = 1\n" and Path(second).read_text() == "x = 2\n"
