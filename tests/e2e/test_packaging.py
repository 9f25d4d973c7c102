"""The wheel holds the package from ``src/`` (integrations, ``py.typed``, eval) and nothing else."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contents_and_import(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("crashoverride-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "crashoverride/__init__.py" in names
    assert "crashoverride/integrations/__init__.py" in names
    assert "crashoverride/py.typed" in names
    # ``crashoverride eval`` ships its scenarios and their applications.
    assert {"crashoverride/_eval/scenarios/traps_asgi.py", "crashoverride/_eval/apps/traps_asgi.py",
            "crashoverride/_eval/_runner.py"} <= names  # fmt: skip
    # Only the package and its metadata: no tests/, benchmarks/ or examples/ beside it.
    assert all(n.startswith(("crashoverride/", "crashoverride-")) for n in names), names

    # Import from the wheel alone (no dependencies needed just to import the package).
    target = tmp_path / "site"
    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True,
        timeout=600,
    )  # fmt: skip
    code = (
        "import crashoverride, crashoverride.integrations, sys;"
        "print(crashoverride.__file__, crashoverride.integrations.__file__)"
    )
    out = subprocess.run(
        [str(env / "bin" / "python"), "-c", code],
        env={"PYTHONPATH": str(target)},
        cwd=tmp_path,  # not the checkout: nothing there may shadow the wheel
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert str(target) in out.stdout
    assert "integrations" in out.stdout
