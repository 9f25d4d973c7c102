"""The cold ``make demo``: a fresh clone, empty pip and uv caches, no uv installed.

What a newcomer runs first. Each sample clones this checkout's committed tree into a temporary
directory and runs ``make demo`` there with ``UV_CACHE_DIR``, ``PIP_CACHE_DIR`` and ``UV_HOME``
pointing at empty directories of the sample's own: uv is bootstrapped with pip, the demo's
dependencies (the base ones and the ``demo`` extra, nothing of ``dev``) are downloaded from the
package index this machine is configured with, the venv is made and the offline demo runs to
its end. The figure is the wall time of the whole command, from the shell's point of view.

Needs the package index (the network), ``git`` and ``make``; it uses neither this checkout's
venvs nor its caches.

    python -m benchmarks.bench_cold_demo [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks._common import Row, format_table, row

TARGET = "< 12 s"
_ROOT = Path(__file__).resolve().parents[1]


def sample() -> tuple[float, str]:
    """One cold ``make demo``: (seconds, the demo's last line)."""
    with tempfile.TemporaryDirectory(prefix="bench-cold-demo-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(_ROOT), str(clone)], check=True)
        env = {
            **os.environ,
            "UV_CACHE_DIR": f"{tmp}/uv-cache",
            "PIP_CACHE_DIR": f"{tmp}/pip-cache",
            "UV_HOME": f"{tmp}/uv-home",  # the Makefile bootstraps uv here, with pip
        }
        env.pop("VIRTUAL_ENV", None)
        began = time.perf_counter()
        done = subprocess.run(
            ["make", "demo"], cwd=clone, env=env, capture_output=True, text=True, check=False
        )
        took = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"make demo failed ({done.returncode}):\n{done.stderr[-2000:]}")
        said = [line for line in done.stdout.splitlines() if "checks passed" in line]
        return took, said[-1].strip() if said else "(the demo's summary line is missing)"


def run(repeats: int = 3) -> list[Row]:
    samples = [sample() for _ in range(repeats)]
    times = [took for took, _ in samples]
    return [
        row(
            "cold `make demo` (fresh clone, empty pip/uv caches, uv bootstrapped)",
            statistics.median(times), "s", target=TARGET,
            note=f"median of {repeats} (worst {max(times):.1f} s); command: "
            "`python -m benchmarks.bench_cold_demo`; the demo said: "
            f"{samples[-1][1][:120]}",
        )
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    print(format_table(run(parser.parse_args().repeats)))


if __name__ == "__main__":
    main()
