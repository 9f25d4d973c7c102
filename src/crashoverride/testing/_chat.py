"""The chat-completions wire format: scripted turns to completions, completions to SSE chunks.

Every response goes through one shape, a complete ``chat.completion`` dict: scripted turns are
rendered to it, cassettes store it, and a streaming request gets it cut into chunks. So a script
or a cassette serves streaming and non-streaming clients alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from crashoverride.testing._steps import Message, ToolCall, Turn

# The request fields that decide what a model answers; the rest (stream, temperature unset,
# headers...) must not make a cassette miss.
DECISIVE_FIELDS = ("model", "messages", "tools", "tool_choice")
_PIECE = 24  # characters per streamed delta: several deltas, so clients really reassemble


def decisive(body: dict[str, Any]) -> dict[str, Any]:
    return {name: body.get(name) for name in DECISIVE_FIELDS}


def _estimate_tokens(value: Any) -> int:
    # Deterministic stand-in for usage, so reports show non-zero, reproducible numbers.
    return max(1, len(json.dumps(value, ensure_ascii=False)) // 4)


def completion_for_turn(turn: Turn, request: dict[str, Any], number: int) -> dict[str, Any]:
    """Render one scripted turn as the completion an OpenAI-compatible server would return."""
    texts = [item.text for item in turn.items if isinstance(item, Message)]
    calls = [
        {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        for item in turn.items
        if isinstance(item, ToolCall)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    prompt_tokens = _estimate_tokens(request.get("messages", []))
    completion_tokens = _estimate_tokens(message)
    return {
        "id": f"chatcmpl-mock-{number}",
        "object": "chat.completion",
        "created": 0,
        "model": str(request.get("model", "scripted")),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _pieces(text: str) -> Iterator[str]:
    for start in range(0, len(text), _PIECE):
        yield text[start : start + _PIECE]


def chunks(completion: dict[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """Cut a completion into ``chat.completion.chunk`` events, as a streaming server sends them."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    base = {
        "id": completion.get("id", "chatcmpl-mock"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", "scripted"),
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(message.get("content") or ""):
        yield chunk({"content": piece})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        opening = {"name": function.get("name", ""), "arguments": ""}
        head = {"index": index, "id": call.get("id"), "type": "function", "function": opening}
        yield chunk({"tool_calls": [head]})
        for piece in _pieces(function.get("arguments") or ""):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice.get("finish_reason") or "stop")
    if include_usage and completion.get("usage") is not None:
        yield {**base, "choices": [], "usage": completion["usage"]}


def sse_events(completion: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    for event in chunks(completion, include_usage=include_usage):
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def error_body(message: str, kind: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": None}}).encode()
