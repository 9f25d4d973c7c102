"""A recovered or failed exception, and a ``CrashOverride`` itself, survive pickling and copying.

Frameworks pickle exceptions (process pools, Celery's result backend) and their configuration
(Celery pickles its app, with ``app.conf.crashoverride`` in it): the mark a recovery leaves on an
exception must not hold the ``CrashOverride`` (and its lock), and an instance must pickle.
"""

from __future__ import annotations

import copy
import gc
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from crashoverride import CrashOverride
from crashoverride.testing import give_up, script


def _failed(co: CrashOverride) -> KeyError:
    with pytest.raises(KeyError) as info:
        with co.handler(prompt="never recovered"):
            raise KeyError("missing")
    return info.value


def test_a_failed_recoverys_exception_pickles_with_its_note() -> None:
    exc = _failed(CrashOverride(model=script(give_up("no way"))))
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is KeyError and again.args == ("missing",)
    assert [n for n in again.__notes__ if n.startswith("crashoverride:")] == [
        n for n in exc.__notes__ if n.startswith("crashoverride:")
    ]
    assert any(n.startswith("crashoverride:") for n in again.__notes__)


def test_the_mark_does_not_hold_the_instance() -> None:
    co = CrashOverride(model=script(give_up("no way")))
    exc = _failed(co)
    gc.collect()
    held = [r for r in gc.get_referrers(co) if r is vars(exc) or r is exc]
    assert held == []  # the exception keeps no reference that would keep ``co`` alive
    assert all(value is not co for value in vars(exc).values())


def test_an_outer_handler_of_the_same_instance_still_lets_the_marked_exception_pass() -> None:
    co = CrashOverride(model=script(give_up("no way")))
    with pytest.raises(KeyError) as info:
        with co.handler(prompt="outer"):
            with co.handler(prompt="inner"):
                raise KeyError("missing")
    notes = [n for n in info.value.__notes__ if n.startswith("crashoverride:")]
    assert len(notes) == 1  # one exception, one recovery, one note


def test_a_crash_override_pickles_and_deep_copies() -> None:
    co = CrashOverride(project_prompt="billing service", timeout=12)
    for twin in (pickle.loads(pickle.dumps(co)), copy.deepcopy(co), copy.copy(co)):
        assert isinstance(twin, CrashOverride) and twin is not co
        assert twin.handler(prompt="x").settings.project_prompt == "billing service"
        assert twin.handler(prompt="x").settings.timeout == 12


def _decorated_failure() -> None:
    co = CrashOverride(model=script(give_up("no way")))

    @co.handler(prompt="compute")
    def compute() -> None:
        raise KeyError("missing")

    compute()


@pytest.mark.slow
def test_a_process_pool_hands_the_parent_the_original_exception() -> None:
    with ProcessPoolExecutor(max_workers=1) as pool:
        future = pool.submit(_decorated_failure)
        with pytest.raises(KeyError) as info:
            future.result(timeout=120)
    assert any(n.startswith("crashoverride:") for n in info.value.__notes__)
