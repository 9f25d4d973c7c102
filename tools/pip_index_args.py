"""Print this machine's pip index configuration as ``uv pip install`` arguments.

uv reads no pip configuration: the Makefile hands it what pip would use, so uv installs from the
same indexes, find-links and constraints. Read here as pip reads it (``pip config list`` says the
same, but costs a second or two of pip's start-up): the configuration files in pip's order
(global: ``$XDG_CONFIG_DIRS/pip/pip.conf``, ``/etc/pip.conf``; user: ``~/.pip/pip.conf``,
``~/.config/pip/pip.conf``, skipped when ``$PIP_CONFIG_FILE`` names a file; the interpreter's
``sys.prefix/pip.conf``; ``$PIP_CONFIG_FILE``, none at all when it is the null device), each
file's ``[install]`` section over its ``[global]`` one, then the ``PIP_*`` variables over all.
Where pip may choose among several indexes it takes the best version of all of them;
``--index-strategy unsafe-best-match`` asks uv for the same. Prints nothing when pip is
unconfigured (uv then uses PyPI, as pip does).
"""

from __future__ import annotations

import configparser
import os
import shlex
import sys
from pathlib import Path

# pip's option -> uv's, and whether pip's value is a whitespace-separated list.
OPTIONS = {
    "index-url": ("--index-url", False),
    "extra-index-url": ("--extra-index-url", True),
    "find-links": ("--find-links", True),
    "constraint": ("--constraint", True),
    "trusted-host": ("--allow-insecure-host", True),
}


def files() -> list[Path]:
    """The configuration files pip reads, lowest priority first (pip's own order)."""
    chosen = os.environ.get("PIP_CONFIG_FILE")
    if chosen == os.devnull:
        return []  # pip: no configuration file at all
    dirs = os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    found = [Path(d) / "pip" / "pip.conf" for d in dirs.split(os.pathsep) if d]
    found.append(Path("/etc/pip.conf"))
    if not (chosen and Path(chosen).exists()):  # pip skips the user's files then
        home = Path.home()
        config_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
        found += [home / ".pip" / "pip.conf", config_home / "pip" / "pip.conf"]
    found.append(Path(sys.prefix) / "pip.conf")  # the interpreter's (a virtualenv's) own
    if chosen:
        found.append(Path(chosen))
    return found


def settings() -> dict[str, str]:
    config: dict[str, str] = {}
    for path in files():
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                config.update(parser.items(section))
    for name in OPTIONS:
        variable = "PIP_" + name.upper().replace("-", "_")
        if variable in os.environ:
            config[name] = os.environ[variable]
    return config


def main() -> None:
    config = settings()
    args: list[str] = []
    for name, (flag, many) in OPTIONS.items():
        if config.get(name, "").strip():
            for value in config[name].split() if many else [config[name].strip()]:
                args += [flag, value]
    if config.get("extra-index-url", "").strip():
        args += ["--index-strategy", "unsafe-best-match"]
    print(shlex.join(args))


if __name__ == "__main__":
    main()
