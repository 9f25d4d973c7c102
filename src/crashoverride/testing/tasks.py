"""Steps for rehearsing decorated-function, asyncio-task and Celery-task recoveries.

script(set_result(42), done("used the cached value"))
script(patch("parse", "def parse(text):\\n    return int(text.strip())\\n"), rerun(), done())
"""

from __future__ import annotations

from typing import Any

from crashoverride.testing._steps import ToolCall, exec_python
from crashoverride.testing.asgi import patch

__all__ = ["patch", "rerun", "set_result"]


def set_result(value: Any, *, call_id: str | None = None) -> ToolCall:
    """The failed call or task returns ``value`` (given as its ``repr``, so keep it literal)."""
    return exec_python(f"set_result({value!r})", call_id=call_id)


def rerun(*, call_id: str | None = None) -> ToolCall:
    """After a repair, the call or task is made once more with the same arguments."""
    return exec_python("rerun()", call_id=call_id)
