"""Whatever failed, the text handed to the model stays bounded."""

from __future__ import annotations

from crashoverride._security.text import (
    MESSAGE_LIMIT,
    TRACEBACK_LIMIT,
    describe_exception,
    format_traceback,
    render_value,
)


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


def test_recursion_error_traceback_is_bounded_and_says_what_was_elided() -> None:
    try:
        _recurse(0)
    except RecursionError as exc:
        text = format_traceback(exc)
    assert len(text) <= TRACEBACK_LIMIT
    assert "RecursionError" in text
    assert "_recurse" in text


def test_deep_alternating_stack_keeps_head_and_tail() -> None:
    def ping(n: int) -> None:
        if n == 0:
            raise ValueError("bottom")
        pong(n - 1)

    def pong(n: int) -> None:
        ping(n - 1)

    try:
        ping(400)
    except ValueError as exc:
        text = format_traceback(exc)
    assert "middle frames of this traceback were elided" in text
    assert "ValueError: bottom" in text
    assert text.count("in ping") + text.count("in pong") < 60


def test_huge_message_is_clipped() -> None:
    exc = ValueError("x" * 5_000_000)
    assert len(describe_exception(exc)) < MESSAGE_LIMIT + 200
    try:
        raise exc
    except ValueError as caught:
        assert len(format_traceback(caught)) <= TRACEBACK_LIMIT


def test_large_values_render_bounded() -> None:
    assert len(render_value(b"\0" * 50_000_000)) < 5_000
    assert len(render_value(list(range(1_000_000)))) < 5_000

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert "Broken" in render_value(Broken())  # a placeholder, not an exception
