"""tools/pip_index_args.py: the Makefile hands uv the index configuration pip has (uv reads no
pip configuration), read as pip reads it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "pip_index_args.py"


def _args(env: dict[str, str]) -> list[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True,
                         timeout=60, env={**base, **env}, check=True)  # fmt: skip
    return shlex.split(out.stdout)


def test_the_file_and_the_variables_become_uv_arguments(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nextra-index-url = file:///a/simple\n    file:///b/simple\n"
        "find-links = /wheels\nconstraint = /c.txt\n[install]\nfind-links = /other-wheels\n"
    )
    args = _args({"PIP_CONFIG_FILE": str(conf), "PIP_INDEX_URL": "https://mirror/simple"})
    # The machine's own global files are read too (as pip does); these come from ours.
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--index-url", "https://mirror/simple") in pairs  # the variable over every file
    assert [p for p in pairs if p[0] == "--extra-index-url"] == [
        ("--extra-index-url", "file:///a/simple"), ("--extra-index-url", "file:///b/simple")
    ]  # fmt: skip
    assert [p for p in pairs if p[0] == "--find-links"] == [("--find-links", "/other-wheels")]
    assert ("--constraint", "/c.txt") in pairs
    # pip takes the best version of all its indexes; uv is asked for the same.
    assert ("--index-strategy", "unsafe-best-match") in pairs


def test_an_unconfigured_pip_gives_uv_nothing() -> None:
    # PIP_CONFIG_FILE=/dev/null: pip reads no configuration file at all.
    assert _args({"PIP_CONFIG_FILE": os.devnull}) == []
