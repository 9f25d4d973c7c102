"""A missing optional dependency is named, with the extra that installs it, where it is needed.

Each check runs a fresh interpreter whose ``sys.meta_path`` starts with a finder that refuses
the optional packages, as if they were not installed (uninstalling them would break the other
tests running on this machine).
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import crashoverride.integrations

ROOT = Path(__file__).resolve().parents[2]

# The top-level packages each extra brings (pyproject.toml's optional dependencies).
EXTRAS_PACKAGES = {
    "celery": ("celery", "kombu", "billiard", "vine"),
    "redis": ("redis",),
    "starlette": ("starlette",),
    "otel": ("opentelemetry",),
    "sentry": ("sentry_sdk",),
    "scrapy": ("scrapy", "twisted"),
    "arq": ("arq",),
    "demo": ("uvicorn",),  # and starlette, the starlette extra's
}

BLOCKER = """
import importlib.abc, json, sys

BLOCKED = set(json.loads(sys.argv[1]))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
"""


def _run(blocked: tuple[str, ...], body: str) -> dict[str, str]:
    """Run ``body`` with ``blocked`` refused; it prints one JSON line, returned here."""
    code = BLOCKER + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(blocked)],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


IMPORT_MODULE = """
import importlib, json
try:
    importlib.import_module(sys.argv[2])
except ImportError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"error": ""}))
"""


def _integration_modules() -> list[str]:
    return sorted(
        f"crashoverride.integrations.{info.name}"
        for info in pkgutil.iter_modules(crashoverride.integrations.__path__)
        if not info.name.startswith("_")
    )


def _import_without(blocked: tuple[str, ...], module: str) -> dict[str, str]:
    code = BLOCKER + textwrap.dedent(IMPORT_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(blocked), module],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_celery_integration_without_celery_names_the_extra() -> None:
    result = _import_without(EXTRAS_PACKAGES["celery"], "crashoverride.integrations.celery")
    assert result["error"] in {"ImportError", "ModuleNotFoundError"}
    assert "pip install 'crashoverride[celery]'" in result["message"]


def test_every_extra_of_the_project_is_in_the_table() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    tools = {"all", "dev", "docs", "bench"}  # extras for our tools, not for the runtime
    assert set(extras) - tools == set(EXTRAS_PACKAGES)


@pytest.mark.parametrize("module", _integration_modules())
def test_every_integration_either_needs_no_extra_or_names_its_extra(module: str) -> None:
    # With every optional package refused, an integration imports (it needs none), or fails
    # naming the one extra whose packages it needs: refusing only that extra's packages fails
    # the same way (an extra's packages may need another extra's: arq needs redis).
    everything = tuple(pkg for pkgs in EXTRAS_PACKAGES.values() for pkg in pkgs)
    result = _import_without(everything, module)
    if not result["error"]:
        return
    named = [extra for extra in EXTRAS_PACKAGES if f"'crashoverride[{extra}]'" in result["message"]]
    assert len(named) == 1, result["message"]
    (extra,) = named
    assert f"pip install 'crashoverride[{extra}]'" in result["message"]
    alone = _import_without(EXTRAS_PACKAGES[extra], module)
    assert f"pip install 'crashoverride[{extra}]'" in alone.get("message", ""), alone
    assert _import_without((), module) == {"error": ""}


def test_redis_coordination_without_redis_is_a_configuration_error() -> None:
    result = _run(
        EXTRAS_PACKAGES["redis"],
        """
        import json
        from crashoverride import ConfigurationError, RedisCoordination
        for kwargs in ({"url": "redis://127.0.0.1:6379/0"}, {"client_factory": lambda: None}):
            try:
                RedisCoordination(**kwargs, key=b"k" * 16)
            except ConfigurationError as exc:
                print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
            else:
                print(json.dumps({"error": ""}))
                break
        """,
    )
    assert result["error"] == "ConfigurationError"
    assert "pip install 'crashoverride[redis]'" in result["message"]


def test_redis_coordination_is_described_without_importing_redis() -> None:
    # The check for the package finds it without importing it: constructing the configuration
    # stays cheap, and nothing connects until a protected block fails.
    result = _run(
        (),
        """
        import json, sys
        from crashoverride import RedisCoordination
        RedisCoordination("redis://127.0.0.1:6379/0", key=b"k" * 16)
        print(json.dumps({"imported": "redis" in sys.modules}))
        """,
    )
    assert result == {"imported": False}
