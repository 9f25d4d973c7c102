"""The public signatures accept what users write: a user's file, type-checked as they would.

The file sits outside the checkout (no project configuration applies) and imports the package
this test run imports, so the signatures checked are the ones under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import crashoverride

USER_CODE = textwrap.dedent(
    """
    from crashoverride import ApprovalRequest, Approver, CrashOverride


    def approve(request: ApprovalRequest) -> bool:
        return request.tool != "exec_python" or "import" not in request


    async def approve_async(request: ApprovalRequest) -> bool | str:
        return True if request.source == "builtin" else f"{request.tool}: not reviewed"


    def approve_text(code: str) -> bool:  # an approver written for snippets still fits
        return "open(" not in code


    co = CrashOverride(approve=approve)
    CrashOverride(approve=approve_async)
    CrashOverride(approve=approve_text)
    co.handler(approve=approve)
    co.handler(prompt="p", approve=approve_async)
    chosen: Approver = approve_async
    co.handler(approve=chosen)
    """
)


def _package_root() -> Path | None:
    """Where the imported ``crashoverride`` lives, unless it is an installed copy (which mypy
    finds by itself, and refuses on MYPYPATH)."""
    root = Path(crashoverride.__file__).resolve().parents[1]
    return None if root.name in ("site-packages", "dist-packages") else root


def test_typed_sync_and_async_approvers_pass_mypy_strict(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(USER_CODE)
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    root = _package_root()
    if root is not None:
        env["MYPYPATH"] = str(root)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "user.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.stdout.strip() == "Success: no issues found in 1 source file", done.stdout
    assert done.returncode == 0, done.stderr
