"""Print this machine's pip index configuration as ``uv pip install`` arguments.

uv reads no pip configuration (pip.conf, ``PIP_*`` variables): the Makefile hands it what
``pip config list`` says, so uv installs from the same indexes, find-links and constraints as
pip would. Where pip may choose from several indexes it takes the best version of all of them;
``--index-strategy unsafe-best-match`` asks uv for the same. Prints nothing when pip is
unconfigured (uv then uses PyPI, as pip does).
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's option -> uv's, and whether pip's value is a whitespace-separated list.
OPTIONS = {
    "index-url": ("--index-url", False),
    "extra-index-url": ("--extra-index-url", True),
    "find-links": ("--find-links", True),
    "constraint": ("--constraint", True),
    "trusted-host": ("--allow-insecure-host", True),
}


def settings() -> dict[str, str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    found: dict[str, str] = {}
    environment: dict[str, str] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        scope, _, name = key.partition(".")
        if scope not in (":env:", "global", "install"):
            continue
        # Environment variables override the files, as they do for pip.
        (environment if scope == ":env:" else found)[name] = shlex.split(value)[0]
    return {**found, **environment}


def main() -> None:
    config = settings()
    args: list[str] = []
    for name, (flag, many) in OPTIONS.items():
        if name in config:
            for value in config[name].split() if many else [config[name]]:
                args += [flag, value]
    if "extra-index-url" in config:
        args += ["--index-strategy", "unsafe-best-match"]
    print(shlex.join(args))


if __name__ == "__main__":
    main()
