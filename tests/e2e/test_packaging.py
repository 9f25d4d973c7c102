"""The wheel holds the package from ``src/`` (integrations, ``py.typed``, eval) and nothing else;
built as a release is (``python -m build``), it passes ``twine check`` and, installed into a fresh
venv, runs the doctor, the demo and a recovery."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from crashoverride.testing import MockServer, done

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


# ------------------------------------------------------------------------- ready to release

RECOVERY = """\
from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script

co = CrashOverride(model=script(exec_python("caller['ratio'] = 0.0"), done("ratio set to 0")))
ratio = None
handler = co.handler(prompt="Leave `ratio` set; 0.0 when there is nothing to divide.")
with handler:
    ratio = 1 / 0
print("recovered:", ratio, handler.report.outcome)
"""


def _in(env: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run one of the fresh venv's programs, away from the checkout (nothing may shadow it)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "PYTHONPATH")}  # fmt: skip
    return subprocess.run(
        [str(env / "bin" / args[0]), *args[1:]], cwd=env.parent, capture_output=True, text=True,
        timeout=600, env={**base, **extra},
    )  # fmt: skip


@pytest.mark.slow
def test_the_built_wheel_installs_and_runs_the_doctor_the_demo_and_a_recovery(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=900)  # fmt: skip
    (wheel,) = dist.glob("crashoverride-*.whl")
    (sdist,) = dist.glob("crashoverride-*.tar.gz")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel),
                              str(sdist)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # Everything the command needs is in the wheel (its demo, the Celery scene, the eval
    # scenarios); nothing of the tests is.
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"crashoverride/_cli/demo.py", "crashoverride/_cli/redelivery.py",
            "crashoverride/_cli/redelivery_worker.py", "crashoverride/_cli/main.py",
            "crashoverride/_eval/scenarios/traps_asgi.py"} <= names  # fmt: skip
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n or "conftest" in n]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "crashoverride = crashoverride._cli.main:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )

    # A fresh venv, the wheel itself (not editable) with the demo's extra, from the indexes pip
    # is configured with on this machine.
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    installed = _in(env, "python", "-m", "pip", "install", "-q", f"{wheel}[demo]")
    assert installed.returncode == 0, installed.stderr[-4000:]
    where = _in(env, "python", "-c", "import crashoverride; print(crashoverride.__file__)")
    assert where.stdout.startswith(str(env)), where.stdout + where.stderr

    with MockServer([done("ok")]) as server:
        doctor = _in(env, "crashoverride", "doctor", "--base-url", server.base_url,
                     "--model", "mock-model", OPENAI_API_KEY="sk-test")  # fmt: skip
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith("healthy: a recovery could run now")

    demo = _in(env, "crashoverride", "demo")
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    assert "14/14 checks passed: all claims held (scripted model" in demo.stdout

    # The Celery scene, without celery installed, says what to install.
    redelivery = _in(env, "crashoverride", "demo", "--scene", "redelivery")
    assert redelivery.returncode == 2
    assert "pip install 'crashoverride[demo,celery]'" in redelivery.stderr

    script = tmp_path / "recover.py"
    script.write_text(RECOVERY)
    recovered = _in(env, "python", str(script))
    assert recovered.returncode == 0, recovered.stderr[-4000:]
    assert "recovered: 0.0 recovered" in recovered.stdout.splitlines(), recovered.stdout
