"""A Responses answer as it passes through Envoy: its id and output texts, recorded with the engine that served it
(``cognitora.surface_entry.SurfaceReader.remember_response``), so a follow-up naming it as ``previous_response_id``
is keyed with the whole conversation and pinned to that engine (vLLM keeps stored responses per server)."""

from __future__ import annotations

import json

from cognitora.stream_usage import StreamUsageReader
from cognitora.surface_entry import SurfaceReader
from envoy_extproc.usage import SseUsageScanner
from kvstate.surfaces import SurfaceRequest, response_output_texts

__all__ = ["remember_body", "remember_stream"]


def remember_body(reader: SurfaceReader, read: SurfaceRequest, endpoint: str, body: bytes) -> None:
    """A whole (non-streamed) Responses answer."""
    if b'"id"' not in body:
        return
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return
    if isinstance(data, dict) and isinstance(data.get("id"), str):
        reader.remember_response(read, data["id"], response_output_texts(data), endpoint)


def remember_stream(
    reader: SurfaceReader, read: SurfaceRequest, endpoint: str, sse: SseUsageScanner | StreamUsageReader
) -> None:
    """A streamed Responses answer, as its reader collected it (``response.completed``)."""
    response_id = getattr(sse, "response_id", None)
    if isinstance(response_id, str):
        reader.remember_response(read, response_id, list(getattr(sse, "output_texts", ())), endpoint)
