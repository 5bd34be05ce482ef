"""What an engine's answer says about itself, for every surface: token usage, achieved cache hit, first token, end.

The gateways read an answer as it passes (Envoy: body chunks as ext_proc forwards them; LiteLLM: the stream it
relays) and hand the core an ``Outcome``; this module is the reading, by surface, with no adapter in it, so an
adapter only picks the reader for the request's surface (``stream_usage_reader``, ``usage_from_body``).

Every reader gives the same ``Usage`` (prompt tokens, generated tokens, cached prompt tokens), whatever the
surface's own field names:

- **chat / completions** (OpenAI SSE, ``data: {...}`` chunks, ``data: [DONE]``): the last ``usage`` object seen
  (the final chunk with ``"choices": []`` when ``stream_options.include_usage``; vLLM's ``continuous_usage_stats``
  puts one in every chunk). First token: the first chunk (vLLM sends its role chunk with the first token's).
  With ``strip_usage_chunk`` the usage-only chunk is removed from what is forwarded (when the gateway, not the
  client, asked for it).
- **Anthropic Messages** (``event: message_start`` ... ``message_stop``): ``input_tokens`` counts only the prompt
  tokens that were *not* read from or written to the cache, so the prompt is ``input_tokens +
  cache_read_input_tokens + cache_creation_input_tokens`` and the cached tokens are ``cache_read_input_tokens``;
  ``message_start`` gives the first figures, each ``message_delta`` the newer ones (vLLM sends all of them there;
  Anthropic's API may send only ``output_tokens``). First token: the first ``content_block_start``/``_delta``
  (vLLM sends ``message_start`` with it, Anthropic's API before it), else the ``message_delta`` of an empty answer.
  End: ``message_stop``; an ``error`` event is an error.
- **OpenAI Responses** (``event: response.created`` ... ``response.completed``): ``usage.input_tokens`` is the
  whole prompt, ``input_tokens_details.cached_tokens`` the cached part, ``output_tokens`` generated. First token:
  the first event after ``response.created``/``response.in_progress``/``response.queued``, which vLLM sends
  *before* the prefill (a gateway that took the first body bytes for the first token would be early by the whole
  prefill). End: ``response.completed``, ``response.incomplete`` (the output cap) or ``response.failed``. The
  response's id and its output texts are kept for ``previous_response_id`` (``kvstate.surfaces.history``).

Only the events that carry figures are decoded as JSON (the start, the end, usage chunks); deltas cost a substring
test each, as the chat reader always did.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvstate.surfaces.history import response_output_texts
from kvstate.surfaces.request import SurfaceName

__all__ = [
    "ChatStreamReader",
    "MessagesStreamReader",
    "ResponsesStreamReader",
    "StreamUsageReader",
    "Usage",
    "stream_usage_reader",
    "usage_from_body",
    "usage_from_object",
]

Clock = Callable[[], float]


@dataclass(frozen=True)
class Usage:
    """An answer's token counts, the same for every surface."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """Prompt tokens the engine read from its prefix cache (None: the answer did not say)."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _openai_usage(usage: Mapping[str, Any]) -> Usage:
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    return Usage(_int(usage.get("prompt_tokens")) or 0, _int(usage.get("completion_tokens")) or 0, cached)


def _anthropic_usage(usage: Mapping[str, Any]) -> Usage:
    uncached = _int(usage.get("input_tokens")) or 0
    read = _int(usage.get("cache_read_input_tokens"))
    written = _int(usage.get("cache_creation_input_tokens")) or 0
    return Usage(uncached + (read or 0) + written, _int(usage.get("output_tokens")) or 0, read)


def _responses_usage(usage: Mapping[str, Any]) -> Usage:
    details = usage.get("input_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    return Usage(_int(usage.get("input_tokens")) or 0, _int(usage.get("output_tokens")) or 0, cached)


_USAGE_OF: dict[SurfaceName, Callable[[Mapping[str, Any]], Usage]] = {
    "chat": _openai_usage,
    "completions": _openai_usage,
    "embeddings": _openai_usage,
    "messages": _anthropic_usage,
    "responses": _responses_usage,
}


def usage_from_object(surface: SurfaceName, usage: Any) -> Usage | None:
    """A ``Usage`` from a surface's ``usage`` object; None when it is absent or not an object."""
    return _USAGE_OF[surface](usage) if isinstance(usage, Mapping) else None


def usage_from_body(surface: SurfaceName, body: bytes) -> Usage | None:
    """The usage of a whole (non-streamed) answer of ``surface``; None when it is not JSON or says none."""
    if b'"usage"' not in body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return usage_from_object(surface, data.get("usage")) if isinstance(data, dict) else None


_EVENT_END = re.compile(rb"\r?\n\r?\n")


class StreamUsageReader:
    """Follows one SSE answer (see the module docstring); ``feed`` it the body's chunks as they pass.

    ``feed`` returns the bytes to forward instead of the chunk, or None when the chunk goes unchanged (always None
    unless a reader strips something). With stripping, events are forwarded whole: a chunk that ends inside an
    event forwards the complete events and holds the rest back until the event completes (or the stream ends).
    """

    strips = False

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self.usage: Usage | None = None
        self.first_token_at: float | None = None
        """The clock's reading when the first generated token was seen (None: not yet)."""
        self.done = False
        """The surface's end-of-answer event arrived (``[DONE]``, ``message_stop``, ``response.completed``...)."""
        self.error: str | None = None
        """The message of an error event, when the stream carried one."""
        self.data_events = 0
        self._pending = b""

    @property
    def first_token(self) -> bool:
        return self.first_token_at is not None

    def feed(self, chunk: bytes, end_of_stream: bool = False) -> bytes | None:
        buf = self._pending + chunk if self._pending else chunk
        pos = 0
        kept: list[bytes] = []
        dropped = False
        for m in _EVENT_END.finditer(buf):
            event = buf[pos : m.end()]
            pos = m.end()
            if self._event(event) and self.strips:
                dropped = True
            else:
                kept.append(event)
        rest = buf[pos:]
        if end_of_stream and rest:
            if self._event(rest) and self.strips:
                dropped = True
            else:
                kept.append(rest)
            rest = b""
        self._pending = rest
        if not self.strips or (not dropped and not rest and buf is chunk):
            return None
        return b"".join(kept)

    def feed_event(self, name: str | None, data: bytes) -> None:
        """One event already split from the stream (its ``event:`` name, if any, and its ``data:`` payload)."""
        self.data_events += 1
        self.on_event(name, data)

    def _event(self, raw: bytes) -> bool:
        name: str | None = None
        data: list[bytes] = []
        for line in raw.splitlines():
            if line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                data.append(line[5:].strip())
        if not data:
            return False
        self.data_events += 1
        return self.on_event(name, b"\n".join(data))

    def on_event(self, name: str | None, data: bytes) -> bool:
        """Read one event; True when it is a usage-only chunk the reader may strip."""
        raise NotImplementedError

    def _saw_first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = self._clock()


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _error_text(obj: Mapping[str, Any]) -> str:
    error = obj.get("error")
    if isinstance(error, Mapping):
        return str(error.get("message") or error.get("type") or "error")[:500]
    return str(obj.get("message") or "error")[:500]


class ChatStreamReader(StreamUsageReader):
    """OpenAI chat completions and completions streams."""

    def __init__(self, strip_usage_chunk: bool = False, clock: Clock = time.monotonic) -> None:
        super().__init__(clock)
        self.strips = strip_usage_chunk

    def on_event(self, name: str | None, data: bytes) -> bool:
        if data == b"[DONE]":
            self.done = True
            self.data_events -= 1  # not a chunk of the answer
            return False
        self._saw_first_token()
        if b'"usage"' not in data and b'"error"' not in data:
            return False
        obj = _json(data)
        if obj is None:
            return False
        if "error" in obj and "choices" not in obj:
            self.error = _error_text(obj)
            return False
        usage = usage_from_object("chat", obj.get("usage"))
        if usage is None:
            return False
        self.usage = usage
        return obj.get("choices") == []


_TYPE = re.compile(rb'^\{\s*"type"\s*:\s*"([A-Za-z_.]+)"')


def _event_type(name: str | None, data: bytes) -> tuple[str | None, dict[str, Any] | None]:
    """The event's type: its ``event:`` line, else the payload's leading ``type`` (else its parsed ``type``)."""
    if name:
        return name, None
    m = _TYPE.match(data)
    if m is not None:
        return m.group(1).decode(), None
    obj = _json(data)
    kind = obj.get("type") if obj is not None else None
    return (kind if isinstance(kind, str) else None), obj


class MessagesStreamReader(StreamUsageReader):
    """Anthropic Messages streams."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        super().__init__(clock)
        self._usage: dict[str, Any] = {}

    def on_event(self, name: str | None, data: bytes) -> bool:
        kind, obj = _event_type(name, data)
        if kind in ("content_block_start", "content_block_delta"):
            self._saw_first_token()
        elif kind == "message_start":
            obj = obj or _json(data)
            message = obj.get("message") if obj else None
            self._merge(message.get("usage") if isinstance(message, Mapping) else None)
        elif kind == "message_delta":
            self._saw_first_token()  # an answer without content blocks: its end is its first token
            obj = obj or _json(data)
            self._merge(obj.get("usage") if obj else None)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            obj = obj or _json(data)
            self.error = _error_text(obj) if obj else "error"
        return False

    def _merge(self, usage: Any) -> None:
        if isinstance(usage, Mapping):
            self._usage.update((k, v) for k, v in usage.items() if v is not None)
            self.usage = _anthropic_usage(self._usage)


_BEFORE_FIRST_TOKEN = frozenset({"response.created", "response.in_progress", "response.queued"})
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesStreamReader(StreamUsageReader):
    """OpenAI Responses streams."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        super().__init__(clock)
        self.response_id: str | None = None
        self.status: str | None = None
        self.output_texts: list[str] = []
        """The answer's ``output_text`` parts (from its final event): what ``previous_response_id`` reuses."""

    def on_event(self, name: str | None, data: bytes) -> bool:
        kind, obj = _event_type(name, data)
        if kind == "response.created":
            obj = obj or _json(data)
            response = obj.get("response") if obj else None
            if isinstance(response, Mapping) and isinstance(response.get("id"), str):
                self.response_id = response["id"]
        elif kind in _RESPONSE_ENDS:
            self._saw_first_token()
            self.done = True
            obj = obj or _json(data)
            response = obj.get("response") if obj else None
            if isinstance(response, Mapping):
                self.usage = usage_from_object("responses", response.get("usage"))
                self.output_texts = response_output_texts(response)
                self.status = response.get("status") if isinstance(response.get("status"), str) else None
                if self.response_id is None and isinstance(response.get("id"), str):
                    self.response_id = response["id"]
                if kind == "response.failed":
                    self.error = _error_text(response) if response.get("error") else "response failed"
        elif kind == "error":
            obj = obj or _json(data)
            self.error = _error_text(obj) if obj else "error"
        elif kind not in _BEFORE_FIRST_TOKEN:
            self._saw_first_token()
        return False


def stream_usage_reader(
    surface: SurfaceName, *, strip_usage_chunk: bool = False, clock: Clock = time.monotonic
) -> StreamUsageReader:
    """The reader of ``surface``'s streams. ``strip_usage_chunk``: chat/completions only (see the module docstring).
    Embeddings do not stream: their reader is the chat one, which finds a usage if a body happens to carry one."""
    if surface == "messages":
        return MessagesStreamReader(clock)
    if surface == "responses":
        return ResponsesStreamReader(clock)
    return ChatStreamReader(strip_usage_chunk, clock)
