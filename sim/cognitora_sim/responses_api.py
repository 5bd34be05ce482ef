"""The simulated engine's OpenAI Responses answers, shaped as vLLM 0.32 shapes them.

Read from ``vllm/entrypoints/openai/responses/`` (``serving.py``, ``streaming_events.py``, ``protocol.py``) and
checked against a real vLLM 0.32 (the contract test validates every shape here with vLLM's own pydantic models):

- ``POST /v1/responses``: the ``ResponsesResponse`` object (``id`` ``resp_...``, ``object: "response"``, the
  request's settings echoed, one ``message`` output item with one ``output_text`` part, ``status``, ``usage`` with
  ``input_tokens`` = the whole prompt and ``input_tokens_details.cached_tokens`` the cached part);
- streamed, each as ``event: TYPE\\ndata: JSON\\n\\n`` with a ``sequence_number`` from 0: ``response.created`` and
  ``response.in_progress`` at once (before the prefill), then with the first token ``response.output_item.added``,
  ``response.content_part.added``, one ``response.output_text.delta`` per chunk, ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``, and ``response.completed`` (the whole response);
- the simulated engine stops every answer at its token cap: ``status: "incomplete"`` with ``incomplete_details:
  {"reason": "max_output_tokens"}``, as vLLM reports a length stop.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ResponseShape", "not_found_body"]


def _usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt_tokens + output_tokens,
    }


def _text_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


@dataclass
class ResponseShape:
    """One answer to a ``/v1/responses`` request: the response object and its stream events."""

    body: Mapping[str, Any]
    """The request body (its settings are echoed in the response)."""
    model: str
    max_output_tokens: int
    response_id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex[:16]}")
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:16]}")
    created_at: int = field(default_factory=lambda: int(time.time()))
    _sequence: int = 0

    def response(
        self, status: str, text: str | None = None, usage: tuple[int, int, int] | None = None
    ) -> dict[str, Any]:
        """The response object: ``in_progress`` without output, or the finished one."""
        b = self.body
        tools = b.get("tools") or []
        output = [] if text is None else [self._item(text, "completed")]
        return {
            "id": self.response_id,
            "created_at": self.created_at,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.get("instructions"),
            "metadata": b.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True) is not False,
            "temperature": float(b["temperature"]) if isinstance(b.get("temperature"), (int, float)) else 1.0,
            "tool_choice": b.get("tool_choice", "auto") if tools else "none",
            "tools": tools,
            "top_p": float(b["top_p"]) if isinstance(b.get("top_p"), (int, float)) else 1.0,
            "background": bool(b.get("background", False)),
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": b.get("max_tool_calls"),
            "previous_response_id": b.get("previous_response_id"),
            "prompt": None,
            "reasoning": b.get("reasoning"),
            "service_tier": b.get("service_tier", "auto"),
            "status": status,
            "text": b.get("text"),
            "top_logprobs": None,
            "truncation": b.get("truncation", "disabled"),
            "usage": None if usage is None else _usage(*usage),
            "user": b.get("user"),
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }

    def _item(self, text: str, status: str, content: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        parts = [_text_part(text, None)] if content is None else content
        return {
            "id": self.message_id,
            "content": parts,
            "role": "assistant",
            "status": status,
            "type": "message",
            "phase": None,
        }

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {**data, "sequence_number": self._sequence, "type": kind}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def start_events(self) -> bytes:
        """``response.created`` and ``response.in_progress``: sent before the prefill."""
        initial = self.response("in_progress")
        return self._event("response.created", {"response": initial}) + self._event(
            "response.in_progress", {"response": initial}
        )

    def first_token_events(self) -> bytes:
        item = self._item("", "in_progress", content=[])
        part = _text_part("", [])
        return self._event("response.output_item.added", {"item": item, "output_index": 0}) + self._event(
            "response.content_part.added",
            {"content_index": 0, "item_id": self.message_id, "output_index": 0, "part": part},
        )

    def delta_event(self, text: str) -> bytes:
        return self._event(
            "response.output_text.delta",
            {"content_index": 0, "delta": text, "item_id": self.message_id, "logprobs": [], "output_index": 0},
        )

    def end_events(self, text: str, prompt_tokens: int, output_tokens: int, cached_tokens: int) -> bytes:
        ids = {"content_index": 0, "item_id": self.message_id}
        return (
            self._event("response.output_text.done", {**ids, "logprobs": [], "output_index": 0, "text": text})
            + self._event("response.content_part.done", {**ids, "output_index": 0, "part": _text_part(text, None)})
            + self._event("response.output_item.done", {"item": self._item(text, "completed"), "output_index": 0})
            + self._event(
                "response.completed",
                {"response": self.response("incomplete", text, (prompt_tokens, output_tokens, cached_tokens))},
            )
        )


def not_found_body(response_id: str) -> dict[str, Any]:
    """vLLM's answer to a ``previous_response_id`` it does not hold (its store is off by default)."""
    return {
        "error": {
            "message": f"Response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }
    }
