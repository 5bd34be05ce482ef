"""Token usage from OpenAI responses: a JSON body, or an SSE stream read chunk by chunk as Envoy forwards it.

Only payloads that mention ``"usage"`` are decoded: a stream of thousands of token chunks costs a substring search
per chunk, not a JSON parse.

When the router (not the client) asked the engine for ``stream_options.include_usage``, the engine appends one
chunk with ``"choices": []`` and the usage. The client did not ask for it and may not expect an empty ``choices``,
so ``SseUsageScanner(strip_usage_chunk=True)`` removes exactly that chunk from what the client receives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SseUsageScanner", "Usage", "usage_from_json"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """``usage.prompt_tokens_details.cached_tokens``: the prefix-cache hit the engine achieved (None: not reported)."""


def usage_from_mapping(usage: Any) -> Usage | None:
    """A ``Usage`` from an OpenAI ``usage`` object; None when it is absent or not an object."""
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        cached_tokens=cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_from_json(body: bytes) -> Usage | None:
    """Usage of a non-streamed response body; None when the body is not JSON or carries no usage."""
    if b'"usage"' not in body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return usage_from_mapping(data.get("usage")) if isinstance(data, dict) else None


_EVENT_END = re.compile(rb"\r?\n\r?\n")


class SseUsageScanner:
    """Follows one SSE response: the last usage seen, whether ``data: [DONE]`` arrived, how many data events.

    ``feed`` returns the bytes to forward instead of the chunk, or None when the chunk goes unchanged. Without
    stripping it always returns None. With stripping, events are forwarded whole: a chunk that ends inside an
    event forwards the complete events and holds the rest back until the event completes (or the stream ends).
    """

    def __init__(self, strip_usage_chunk: bool) -> None:
        self.strip_usage_chunk = strip_usage_chunk
        self.usage: Usage | None = None
        self.done = False
        self.data_events = 0
        self._pending = b""

    def feed(self, chunk: bytes, end_of_stream: bool) -> bytes | None:
        buf = self._pending + chunk if self._pending else chunk
        pos = 0
        kept: list[bytes] = []
        dropped = False
        for m in _EVENT_END.finditer(buf):
            event = buf[pos : m.end()]
            pos = m.end()
            if self._scan_event(event) and self.strip_usage_chunk:
                dropped = True
            else:
                kept.append(event)
        rest = buf[pos:]
        if end_of_stream and rest:
            if self._scan_event(rest) and self.strip_usage_chunk:
                dropped = True
            else:
                kept.append(rest)
            rest = b""
        self._pending = rest
        if not self.strip_usage_chunk or (not dropped and not rest and buf is chunk):
            return None  # forwarded as it came (without stripping, the tail is kept only to scan it later)
        return b"".join(kept)

    def _scan_event(self, event: bytes) -> bool:
        """Record what the event says; True when it is a usage-only chunk (``choices`` empty, usage present)."""
        usage_only = False
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            self.data_events += 1
            if b'"usage"' not in payload:
                continue
            try:
                data = json.loads(payload)
            except (ValueError, UnicodeDecodeError):
                continue
            if not isinstance(data, dict):
                continue
            usage = usage_from_mapping(data.get("usage"))
            if usage is not None:
                self.usage = usage
                usage_only = data.get("choices") == []
        return usage_only
