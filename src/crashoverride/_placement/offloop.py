"""Importing modules from async code without stalling the application's event loop.

The recovery machinery (structlog, anyio, the agent) takes tens to hundreds of milliseconds to
import the first time; an async application's first failure imports it in a thread while the
loop goes on serving. Only the standard library here: this runs before anything else is loaded.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any


def loaded(name: str) -> bool:
    """Whether ``name`` is imported and finished (not half-way through in another thread)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


async def load(*names: str) -> None:
    """Import ``names`` (those not loaded yet) in one worker thread and wait for them there."""
    missing = [name for name in names if not loaded(name)]
    if not missing:
        return

    def work() -> None:
        for name in missing:
            importlib.import_module(name)

    asyncio = sys.modules.get("asyncio")
    loop = asyncio.events._get_running_loop() if asyncio is not None else None
    if loop is not None:
        future = loop.create_future()

        def thread() -> None:
            try:
                work()
                error: BaseException | None = None
            except BaseException as exc:  # handed to the loop below, which re-raises it
                error = exc
            try:
                loop.call_soon_threadsafe(_settle, future, error)
            except RuntimeError:  # the loop closed meanwhile (its recovery was cancelled)
                pass

        threading.Thread(target=thread, name="crashoverride-import", daemon=True).start()
        await future
        return
    trio = sys.modules.get("trio")
    if trio is not None:
        await trio.to_thread.run_sync(work)
        return
    work()  # another backend: nothing to hand the import to


def _settle(future: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
