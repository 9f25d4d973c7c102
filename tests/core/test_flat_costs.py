"""What a recovery looks at stays bounded however big the failure is (issue 25 §2).

Each test instruments what a recovery touches (how often it reads a frame's locals, which
parts of a huge value it renders or scans) instead of timing it: the figures are in
``benchmarks/bench_scaling.py``.
"""

from __future__ import annotations

import reprlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from crashoverride import CrashOverride
from crashoverride._placement.frames import CallerLocals
from crashoverride._security import bounded, masking, secrets
from crashoverride._security.text import safe_repr, summarize_locals
from crashoverride.testing import eval_python, give_up, script
from tests.helpers import first_input

# ---------------------------------------------------------------- reads of a frame's locals


def _many_locals(count: int) -> Callable[[CrashOverride], None]:
    """A function with ``count`` locals whose protected block fails."""
    lines = "\n".join(f"    v{i} = {i}" for i in range(count))
    source = f"def protected(co):\n{lines}\n    with co.handler():\n        raise KeyError('k')\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<many locals>", "exec"), namespace)
    return namespace["protected"]  # type: ignore[no-any-return]


@pytest.fixture
def frame_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every read of the live frame behind a ``CallerLocals`` (each one, on 3.11 and
    3.12, rebuilds the whole ``f_locals`` dict)."""
    reads = [0]
    live = CallerLocals._live

    def counted(self: CallerLocals) -> Any:
        reads[0] += 1
        return live.__get__(self)

    monkeypatch.setattr(CallerLocals, "_live", property(counted))
    return reads


def _reads_of_one_recovery(count: int, reads: list[int]) -> int:
    reads[0] = 0
    co = CrashOverride(model=script(give_up("no")))
    with pytest.raises(KeyError):
        _many_locals(count)(co)
    return reads[0]


def test_a_recovery_reads_the_frame_as_often_whatever_its_number_of_locals(
    frame_reads: list[int],
) -> None:
    # Reading one local at a time (the mapping mixins' ``items()``) made 10,000 locals cost
    # 10,000 rebuilds of a 10,000-entry dict: 4.7 s on 3.11.
    few = _reads_of_one_recovery(10, frame_reads)
    many = _reads_of_one_recovery(600, frame_reads)
    assert 0 < many == few
    assert many <= 10


def test_summarising_a_frames_locals_reads_the_frame_once(frame_reads: list[int]) -> None:
    lines = "\n".join(f"    v{i} = {i}" for i in range(300))
    source = f"def owner():\n{lines}\n    return CallerLocals(sys._getframe())\n"
    namespace: dict[str, Any] = {"CallerLocals": CallerLocals, "sys": sys}
    exec(compile(source, "<owner>", "exec"), namespace)
    caller: CallerLocals = namespace["owner"]()
    frame_reads[0] = 0
    text = summarize_locals(caller)
    assert frame_reads[0] == 1
    assert "more (inspect them with eval_python)" in text
    assert dict(caller.items()) == caller.snapshot() and len(caller.snapshot()) == 300
    assert list(caller.keys()) == list(caller) and len(caller.values()) == len(caller)
    assert caller.get("v7") == 7 and caller.get("absent", "default") == "default"


# ----------------------------------------------------------------------- huge values, bounded


class _SpyBytes(bytes):
    renders: ClassVar[list[int]] = []

    def __repr__(self) -> str:
        type(self).renders.append(len(self))
        return super().__repr__()


class _SpyBytearray(bytearray):
    renders: ClassVar[list[int]] = []

    def __repr__(self) -> str:
        type(self).renders.append(len(self))
        return super().__repr__()


@pytest.mark.parametrize("kind", [_SpyBytes, _SpyBytearray])
def test_a_huge_bytes_value_is_never_rendered_whole(kind: type[Any]) -> None:
    kind.renders = []
    value = kind(b"ab\x00" * 400_000)
    shown = safe_repr(value)
    assert kind.renders == []  # only a slice of each end was rendered
    # The same text as rendering it all and shortening that (what reprlib does).
    plain = kind.__mro__[1](b"ab\x00" * 400_000)
    whole = reprlib.Repr()
    whole.maxother = 160
    assert shown == whole.repr(plain)
    assert len(shown) == 160


def test_a_huge_string_is_scanned_only_where_its_repr_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scanned: list[int] = []
    mask = secrets.mask

    def spy(text: str, *args: Any) -> str:
        scanned.append(len(text))
        return mask(text, *args)

    monkeypatch.setattr(secrets, "mask", spy)
    token = "sk-proj-" + "Q7f" * 20
    # A key across the point where the repr cuts the head: still masked whole.
    text = "x" * 100 + token + "y" * 5_000_000 + " password=hunter2"
    shown = safe_repr(text)
    assert max(scanned) < 2_000  # of 5 MB
    assert token[:20] not in shown and "Q7fQ7f" not in shown
    assert "hunter2" not in shown
    # A string short enough is scanned whole, as before.
    scanned.clear()
    safe_repr("z" * 1_500)
    assert scanned == [1_500]


class _Walked(list[str]):
    """A big list that records how many of its items anything iterated over."""

    yielded = 0

    def __iter__(self) -> Iterator[str]:
        for item in super().__iter__():
            type(self).yielded += 1
            yield item


class _Bulky:
    """A value whose repr is large, and records how often it was asked for."""

    renders = 0

    def __len__(self) -> int:
        return 10**9

    def __repr__(self) -> str:
        type(self).renders += 1
        return "Bulky(" + "x" * 1_000_000 + ")"


def test_a_recovery_touches_a_bounded_part_of_huge_locals() -> None:
    _Walked.yielded = 0
    _Bulky.renders = 0
    model = script(give_up("no"))
    co = CrashOverride(model=model)
    words = _Walked(f"word {i}" for i in range(200_000))
    bulky = _Bulky()
    blob = _SpyBytes(b"z" * 5_000_000)
    _SpyBytes.renders = []
    with pytest.raises(KeyError), co.handler():
        raise KeyError(f"{len(words)} {len(blob)} {len(bulky)}")
    assert 0 < _Walked.yielded <= 1_000
    assert _Bulky.renders == 1  # its repr is the application's; it is asked for once
    assert _SpyBytes.renders == []
    # What the model was shown of them: bounded.
    (call, *_) = model.calls
    assert len(str(call)) < 64_000


def test_masking_still_sees_a_secret_at_the_cut_of_a_huge_string() -> None:
    shortener = masking.masking_repr(secrets.is_secret_name, maxstring=40)
    secret = "ghp_" + "A1b2C3d4E5" * 4
    text = "p" * 30 + secret + "q" * 100_000
    assert secret not in shortener.repr(text) and secret[:12] not in shortener.repr(text)


def test_a_huge_secret_value_is_masked_without_compiling_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import re

    from crashoverride._security.redact import MASK, Redactor

    compiled: list[int] = []
    compile_ = re.compile

    def spy(pattern: Any, *args: Any) -> Any:
        compiled.append(len(pattern))
        return compile_(pattern, *args)

    monkeypatch.setattr(re, "compile", spy)
    # A key file held under a secret-looking name: compiling its 1 MB into the redactor's
    # pattern took seconds (a regex compile costs time in the length of its literal).
    key_file = "".join(f"{i:08x}" for i in range(125_000))
    redact = Redactor([key_file, "hunter2-long-enough"])
    assert max(compiled, default=0) < 10_000
    shown = redact(f"loaded {key_file} with hunter2-long-enough")
    assert shown == f"loaded {MASK} with {MASK}"
    assert key_file[:64] not in redact.constant(f"({key_file})")


def test_the_secret_walk_looks_at_a_bounded_number_of_locals() -> None:
    class Counted(dict[str, object]):
        looked = 0

        def items(self) -> Any:
            for pair in super().items():
                Counted.looked += 1
                yield pair

    names = Counted({f"v{i}": f"value {i}" for i in range(50_000)})
    names["password"] = "hunter2-and-more"
    found = masking.secret_values([names], secrets.is_secret_name)
    assert Counted.looked <= 1_000
    # What the summary shows first is what the walk looks at: the first names.
    first = Counted({"db_password": "s3cret-value", **{f"v{i}": "x" for i in range(5_000)}})
    assert "s3cret-value" in masking.secret_values([first], secrets.is_secret_name)
    assert found == []  # the 50,001st name was never reached


# ------------------------------------------------------- an application's __repr__, bounded


class _Hoard:
    """A naive container: its repr renders every item it holds (pandas bounds its own repr;
    this one does not), and it records how often that was asked for."""

    renders = 0

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.label = "nightly import"

    def __repr__(self) -> str:
        type(self).renders += 1
        return f"Hoard({self.items!r})"


class _Refusing:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class _Money:
    """Small, with a repr of its own: the model is shown the application's rendering."""

    def __init__(self, cents: int) -> None:
        self.cents = cents

    def __repr__(self) -> str:
        return f"Money({self.cents / 100:.2f} EUR)"


def test_a_local_whose_repr_renders_all_its_data_is_shown_without_calling_that_repr() -> None:
    _Hoard.renders = 0
    model = script(eval_python("hoard"), give_up("cannot fix the import"))
    co = CrashOverride(model=model)
    hoard = _Hoard(list(range(3_000_000)))
    refusing = _Refusing()
    price = _Money(1250)
    error = KeyError("sku-42")
    with pytest.raises(KeyError) as raised, co.handler():
        raise error
    assert raised.value is error  # the user's exception, untouched
    assert _Hoard.renders == 0  # 3 million items were never rendered to show 160 characters
    text = first_input(model)
    assert len(text) < 64_000
    # What the model is told instead: the type, why, and the object's attributes, walked here.
    assert "hoard (_Hoard) = <_Hoard object, repr not called (its data would render" in text
    assert "items=[0, 1, 2, 3, 4, 5, 6, 7, ...], label='nightly import'" in text
    assert "price (_Money) = Money(12.50 EUR)" in text  # an ordinary repr is still called
    assert f"refusing (_Refusing) = <_Refusing instance at {id(refusing):#x}>" in text
    # The same bound when the agent asks for the value: a tool result renders it alike.
    (*_, returned) = model.calls[1].input
    assert isinstance(returned, dict)
    assert "<_Hoard object, repr not called" in str(returned.get("output"))
    assert _Hoard.renders == 0
    assert len(hoard.items) == 3_000_000 and price.cents == 1250


def test_the_reprs_one_summary_calls_share_one_budget() -> None:
    # Forty objects, each just under what one value may render: their reprs are called until
    # the summary's budget is spent, and the rest are shown by their attributes.
    hoards = {f"h{i}": _Hoard([7] * (bounded.HEAVY // 5)) for i in range(40)}
    each = bounded.estimate(hoards["h0"])
    assert bounded.HEAVY / 2 < each < bounded.HEAVY
    _Hoard.renders = 0
    text = summarize_locals(hoards)
    assert 1 <= _Hoard.renders <= bounded.BUDGET // each < 40
    assert text.count("repr not called") >= 1
    # A value on its own has the whole budget again.
    _Hoard.renders = 0
    assert safe_repr(hoards["h39"]).startswith("Hoard([7, 7, 7")
    assert _Hoard.renders == 1


def test_builtin_containers_and_their_subclasses_are_walked_not_rendered() -> None:
    class Rows(list[int]):
        pass

    class Tags(set[int]):
        pass

    rows, tags = Rows(range(5_000_000)), Tags(range(2_000_000))
    assert safe_repr(rows) == "[0, 1, 2, 3, 4, 5, 6, 7, ...]"  # list's own repr, shortened
    assert safe_repr(tags).startswith("{") and safe_repr(tags).endswith(", ...}")
    assert safe_repr({3, 1, 2}) == "{1, 2, 3}"  # small sets sorted, as reprlib shows them
    assert safe_repr(ValueError("v" * 5_000_000)).startswith("ValueError('vvv")
    assert safe_repr(KeyError("a", 2)) == "KeyError('a', 2)"
    huge = 7**40_000  # past the int-to-text limit (a ValueError), or slow without one
    assert safe_repr(huge) == f"<int of about {int(huge.bit_length() * 0.30103) + 1} digits>"


class _Proxy:
    """Holds a million rows in a private slot; any code of its own that runs is counted."""

    __slots__ = ("__rows", "name")
    touched = 0

    def __init__(self) -> None:
        self.__rows = list(range(1_000_000))
        self.name = "orders"

    def __getattr__(self, attribute: str) -> Any:
        type(self).touched += 1
        raise AttributeError(attribute)

    def __repr__(self) -> str:
        type(self).touched += 1
        return f"Proxy({self.__rows})"


class _LoudError(Exception):
    def __repr__(self) -> str:
        return f"LoudError({self.args[0]})"


def test_a_value_too_big_to_render_is_shown_by_attributes_read_without_its_code() -> None:
    _Proxy.touched = 0
    shown = safe_repr(_Proxy())
    assert shown.startswith("<_Proxy object, repr not called")
    assert "__rows=[0, 1, 2, 3, 4, 5, 6, 7, ...], name='orders'>" in shown
    assert _Proxy.touched == 0  # neither its repr nor its __getattr__ ran
    # An exception's arguments are counted and shown too (they live out of its __dict__).
    loud = safe_repr(_LoudError("m" * 5_000_000))
    assert loud.startswith("<_LoudError object, repr not called") and "args=('mmm" in loud
    assert safe_repr(_LoudError("short")) == "LoudError(short)"
