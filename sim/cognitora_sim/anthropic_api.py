"""The simulated engine's Anthropic Messages answers, shaped as vLLM 0.32 shapes them.

Read from ``vllm/entrypoints/anthropic/serving.py`` and checked against a real vLLM 0.32 (the contract test
validates every shape here with vLLM's own pydantic models):

- ``POST /v1/messages``: ``{"id": "chatcmpl-...", "type": "message", "role": "assistant", "content": [{"type":
  "text", "text"}], "model", "stop_reason", "usage"}`` (no ``stop_sequence`` key: vLLM drops None fields);
- streamed: ``event: message_start`` (sent with the first token, ``usage`` ``{input_tokens: prompt, output_tokens:
  0}``), ``content_block_start`` (an empty text block), one ``content_block_delta`` (``text_delta``) per chunk,
  ``content_block_stop``, ``message_delta`` (``stop_reason``, ``stop_sequence: null``, the final usage),
  ``message_stop``; each as ``event: NAME\\ndata: JSON\\n\\n``;
- ``usage``: ``input_tokens`` is the prompt *minus* the cached tokens, ``cache_read_input_tokens`` the cached
  tokens, ``cache_creation_input_tokens`` 0 (vLLM reports no cache writes on this path);
- ``POST /v1/messages/count_tokens``: ``{"input_tokens", "context_management": {"original_input_tokens"}}``;
- errors raised while serving: ``{"type": "error", "error": {"type", "message"}}`` with the HTTP status; a body
  that does not validate gets FastAPI's answer, ``{"error": {"message", "type": "Bad Request", "param":
  "body.<field>", "code": 400}}``.

The simulated engine stops every answer at its token cap, so ``stop_reason`` is ``max_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "count_tokens_body",
    "error_body",
    "message_body",
    "stream_delta",
    "stream_end",
    "stream_start",
    "usage_body",
]


def usage_body(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": max(0, prompt_tokens - cached_tokens),
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


def message_body(
    rid: str, model: str, text: str, prompt_tokens: int, output_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": "max_tokens",
        "usage": usage_body(prompt_tokens, output_tokens, cached_tokens),
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def stream_start(rid: str, model: str, prompt_tokens: int) -> bytes:
    """``message_start`` and the text block's ``content_block_start``: sent with the first token."""
    message: dict[str, Any] = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
    }
    return _event("message_start", {"type": "message_start", "message": message}) + _event(
        "content_block_start",
        {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0},
    )


def stream_delta(text: str) -> bytes:
    return _event(
        "content_block_delta",
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}, "index": 0},
    )


def stream_end(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> bytes:
    """``content_block_stop``, ``message_delta`` (the final usage) and ``message_stop``."""
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": usage_body(prompt_tokens, output_tokens, cached_tokens),
    }
    return (
        _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        + _event("message_delta", delta)
        + _event("message_stop", {"type": "message_stop"})
    )


def count_tokens_body(input_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "context_management": {"original_input_tokens": input_tokens}}


def error_body(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}
