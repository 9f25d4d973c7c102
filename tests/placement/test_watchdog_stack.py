"""The stop reaches everything the snippet runs on its thread, wherever that code was compiled.

A loop that swallows every ``BaseException`` used to be stopped only in code compiled under the
snippet's own file name: the same loop behind ``exec(compile(src, "<x>", "exec"))``, ``exec(str)``,
a module made from a string or an application function the snippet called kept the owner's
thread long after the recovery's deadline. Each scenario runs the public ``with`` handler in a
daemon thread; ``released`` is the test's own way out, set only once the verdict is in.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import types
from typing import Any

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import done, exec_python, script

TIMEOUT = 2.0
MARGIN = 20.0  # wide: the machine is shared; a swallowed stop spins on for good

# What every scenario's snippet starts with: it binds ``released`` and says it ran (a recovery
# that timed out before running it would prove nothing).
PREFIX = "released = caller['flag']\ncaller['box']['ran'] = True\n"
# Calls ``{}`` until it returns, swallowing whatever it raises: every call sits inside the
# ``try``, so a stop landing anywhere in the loop is swallowed.
SWALLOWED = (
    "while True:\n    try:\n        {}\n        break\n    except BaseException:\n        pass\n"
)
LOOP = SWALLOWED.format("while not released.is_set(): pass")
# The same loop, keeping what it catches (no stop is ever freed).
KEEPING = (
    "while True:\n"
    "    try:\n"
    "        while not released.is_set(): pass\n"
    "        break\n"
    "    except BaseException as stop:\n"
    "        kept.append(stop)\n"
)
# One step of a loop driven from C (``map``): swallows what it catches and returns.
SWALLOWING_CALL = (
    "def once(_):\n"
    "    try:\n"
    "        while not released.is_set(): pass\n"
    "    except BaseException as stop:\n"
    "        pass\n"
    "    return released.is_set()\n"
)
# A generator that survives every exception but its closing.
TICKS = (
    "def ticks():\n"
    "    while True:\n"
    "        try:\n"
    "            if released.is_set():\n"
    "                return\n"
    "            yield\n"
    "        except GeneratorExit:\n"
    "            raise\n"
    "        except BaseException:\n"
    "            pass\n"
)
SPIN_DEF = "def spin():\n" + "".join("    " + line + "\n" for line in LOOP.splitlines())


def spin_in_application_code(released: threading.Event) -> None:
    """Application code the snippet calls: a worker loop that survives everything."""
    while True:
        try:
            while not released.is_set():
                pass
            break
        except BaseException:  # it swallows the stop too
            pass


SNIPPETS = {
    # With a plain dict for names: the snippet's own ``locals`` mapping is Python code that
    # runs outside the ``try`` (matching ``except BaseException``) and would let a stop out.
    "exec_of_compiled_code": f"exec(compile({LOOP!r}, '<x>', 'exec'), {{'released': released}})",
    "exec_of_a_string": f"exec({LOOP!r}, {{'released': released}})",
    "eval_of_compiled_code": f"eval(compile({LOOP!r}, '<x>', 'exec'), {{'released': released}})",
    "a_function_made_from_a_code_object": (
        "import types\n"
        f"module = compile({SPIN_DEF!r}, '<y>', 'exec')\n"
        "body = next(c for c in module.co_consts if isinstance(c, types.CodeType))\n"
        "types.FunctionType(body, {'released': released})()\n"
    ),
    "a_lambda_made_by_exec": (
        "scope = {'released': released}\n"
        "exec('spin = lambda: any(released.is_set() for _ in iter(int, 1))', scope)\n"
        f"exec({SWALLOWED.format('spin()')!r}, scope)\n"
    ),
    "a_module_made_by_importlib_from_a_string": (
        "import importlib.util\n"
        "class FromText:\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, module):\n"
        f"        exec(compile({SPIN_DEF!r}, 'made_here.py', 'exec'), module.__dict__)\n"
        "spec = importlib.util.spec_from_loader('made_here', FromText())\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "module.released = released\n"
        "module.spin()\n"
    ),
    "application_code_the_snippet_calls": "caller['spin'](released)",
    "a_loop_that_keeps_every_stop_it_catches": (
        f"kept = []\nexec({KEEPING!r}, {{'released': released, 'kept': kept}})\n"
    ),
    "loops_in_loops_that_keep_every_stop_they_catch": (
        "kept = []\n"
        + KEEPING.replace(
            "while not released.is_set(): pass",
            f"exec({KEEPING!r}, {{'released': released, 'kept': kept}})",
        )
    ),
    "a_c_loop_calling_a_function_that_swallows": (
        "scope = {'released': released}\n"
        f"exec({SWALLOWING_CALL!r}, scope)\n"
        "any(map(scope['once'], iter(int, 1)))\n"
    ),
    "a_c_loop_calling_a_function_that_keeps_what_it_catches": (
        "scope = {'released': released, 'kept': []}\n"
        f"exec({SWALLOWING_CALL.replace('pass', 'kept.append(stop)')!r}, scope)\n"
        "any(map(scope['once'], iter(int, 1)))\n"
    ),
    "a_generator_driven_by_compiled_code": (
        "scope = {'released': released}\n"
        f"exec({TICKS!r}, scope)\n"
        f"exec({SWALLOWED.format('for _ in ticks(): pass')!r}, scope)\n"
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """One recovery first: the first one of a process imports the agent's machinery, which
    can take longer than the scenarios' short timeout before their snippet even starts."""
    co = CrashOverride(model=script(exec_python("caller['value'] = 1"), done()), timeout=120)
    value = 0
    with co.handler():
        raise KeyError("warm-up")
    assert value == 1


def _recover(
    snippet: str, **names: Any
) -> tuple[threading.Thread, dict[str, Any], threading.Event]:
    """Start a ``with`` block whose recovery runs ``snippet``; wait for it, within reason.

    ``outcome`` holds what the block raised (``error``) and what the snippet left in
    ``caller['box']``; ``names`` are more locals of the block.
    """
    released = threading.Event()
    outcome: dict[str, Any] = {}
    co = CrashOverride(
        model=script(exec_python(PREFIX + snippet), done()),
        timeout=TIMEOUT,
    )

    def app() -> None:
        # The block's locals, which the snippet reads through ``caller``.
        flag, spin, box = released, spin_in_application_code, outcome  # noqa: F841
        work = names.get("work")  # noqa: F841
        try:
            with co.handler():
                raise KeyError("x")
        except BaseException as exc:  # recorded for the test to assert on, never hidden
            outcome["error"] = exc

    thread = threading.Thread(target=app, daemon=True)
    thread.start()
    thread.join(TIMEOUT + MARGIN)
    return thread, outcome, released


def _timed_out(exc: BaseException) -> bool:
    return any("ran out" in n or "timed out" in n for n in getattr(exc, "__notes__", []))


@pytest.mark.parametrize("snippet", SNIPPETS.values(), ids=list(SNIPPETS))
def test_a_swallowing_loop_is_stopped_wherever_it_was_compiled(snippet: str) -> None:
    thread, outcome, released = _recover(snippet)
    try:
        assert not thread.is_alive(), "the loop swallowed every stop and still holds the thread"
    finally:
        released.set()
    error = outcome.get("error")
    assert outcome.get("ran"), outcome
    assert isinstance(error, KeyError), outcome  # the application's own exception
    assert _timed_out(error), error.__notes__


def test_cleanup_on_the_way_out_of_a_stop_still_runs() -> None:
    # The stop must not leave the application's locks taken: what runs because the stop goes
    # on (``finally``, ``__exit__``, the functions they call) runs to its end, even once the
    # snippet around it swallowed the stop.
    lock = threading.Lock()
    steps: list[str] = []

    class Held:
        def __enter__(self) -> None:
            lock.acquire()

        def __exit__(self, *exc_info: object) -> None:
            steps.append("exit")
            lock.release()

    done: list[bool] = []

    def wait(released: threading.Event) -> None:
        while not done:  # no call: the strike lands in this loop
            pass

    def work(released: threading.Event) -> None:
        steps.append("enter")
        try:
            with Held():
                # In a function of its own: on 3.13.0 a strike landing on a loop's back edge
                # can skip the ``finally`` of that same frame, whatever the watchdog does.
                wait(released)
        finally:
            steps.append("finally")

    thread, outcome, released = _recover(SWALLOWED.format("caller['work'](released)"), work=work)
    try:
        assert not thread.is_alive(), "the snippet still holds the thread"
        assert outcome.get("ran"), outcome
        assert _timed_out(outcome["error"]), outcome
        assert lock.acquire(timeout=MARGIN), "the stop left the application's lock taken"
    finally:
        done.append(True)
        released.set()
    assert steps == ["enter", "exit", "finally"]


def test_a_thread_the_snippet_starts_is_not_stopped_but_does_not_hold_the_block() -> None:
    # The stop covers the owner's thread only: a thread the snippet starts runs on its own
    # (threads the application starts when the snippet calls it look just the same, and
    # stopping those would break the application). The snippet waiting for it is stopped.
    work = "def work():\n    try:\n        spin()\n    finally:\n        box['ended'] = True\n"
    started = (
        "import threading\n"
        "box = caller['box']\n"
        "scope = {'released': released, 'box': box}\n"
        f"exec(compile({SPIN_DEF + work!r}, '<z>', 'exec'), scope)\n"
        "threading.Thread(target=scope['work'], daemon=True).start()\n"
        + SWALLOWED.format("while 'ended' not in box: pass")
    )
    thread, outcome, released = _recover(started)
    try:
        assert not thread.is_alive(), "the snippet waiting for its thread held the block"
        assert outcome.get("ran"), outcome
        error = outcome.get("error")
        assert isinstance(error, KeyError), outcome
        assert _timed_out(error), error.__notes__
        assert "ended" not in outcome  # documented: the snippet's own thread runs on
    finally:
        released.set()
    ends = time.monotonic() + MARGIN
    while "ended" not in outcome and time.monotonic() < ends:
        time.sleep(0.01)
    assert outcome.get("ended")


def test_before_the_deadline_agent_code_runs_untraced() -> None:
    # The happy path pays nothing: no trace function is installed until time is up, neither
    # for the snippet nor for the application code it calls.
    seen: dict[str, object] = {}

    def probe() -> None:  # application code the snippet calls
        seen["application"] = sys.gettrace()

    snippet = (
        "import sys\n"
        "caller['seen']['snippet'] = sys.gettrace()\n"
        "caller['probe']()\n"
        "caller['value'] = 1\n"
    )
    co = CrashOverride(model=script(exec_python(snippet), done()), timeout=30)
    value = 0
    with co.handler():
        raise KeyError("x")
    assert value == 1
    assert seen == {"snippet": None, "application": None}


def test_a_stop_landing_in_a_gc_callback_is_not_reported_and_still_stops() -> None:
    # A strike lands wherever the owner's thread checks for pending work, and that can be Python
    # code CPython runs on the side (a ``gc.callbacks`` entry, as hypothesis registers, a
    # ``__del__``, a weakref callback), where an exception cannot propagate: CPython reports it
    # to ``sys.unraisablehook`` ("Exception ignored in ...") and goes on. That report is our
    # own stop, not an error of the application's: it must not reach the hook, and the code
    # below the guard must still be stopped by a later strike.
    reported: list[object] = []
    previous = sys.unraisablehook
    armed = threading.Event()
    owner: list[int] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:  # the application's gc callback
        if phase == "start" and armed.is_set() and threading.get_ident() in owner:
            armed.clear()
            while True:  # long enough for the deadline to pass in here, the first strike lands
                pass

    def work(released: threading.Event) -> None:  # application code the snippet calls
        owner.append(threading.get_ident())
        armed.set()
        gc.collect()

    sys.unraisablehook = reported.append
    gc.callbacks.append(on_gc)
    try:
        snippet = "caller['work'](released)\nwhile True: pass\n"
        thread, outcome, released = _recover(snippet, work=work)
    finally:
        gc.callbacks.remove(on_gc)
        hook, sys.unraisablehook = sys.unraisablehook, previous
    try:
        assert not thread.is_alive(), "the code after the gc callback still holds the thread"
    finally:
        released.set()
    assert owner and not armed.is_set(), "the gc callback never ran on the owner's thread"
    assert reported == [], [getattr(r, "exc_value", r) for r in reported]
    assert _timed_out(outcome["error"]), outcome
    # What is reported that is not our stop still reaches the application's hook.
    hook(types.SimpleNamespace(exc_type=ValueError, exc_value=ValueError("app"), object=None))
    assert [type(r.exc_value) for r in reported] == [ValueError]  # type: ignore[attr-defined]
