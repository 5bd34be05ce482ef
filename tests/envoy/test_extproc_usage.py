"""Usage from OpenAI responses: JSON bodies, and SSE streams cut at arbitrary byte boundaries (as Envoy forwards)."""

from __future__ import annotations

import json

import pytest

from envoy_extproc.usage import SseUsageScanner, Usage, usage_from_json

USAGE = {"prompt_tokens": 120, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 96}}


def sse(*events: object) -> bytes:
    return b"".join(f"data: {json.dumps(e) if not isinstance(e, str) else e}\n\n".encode() for e in events)


def token(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def test_json_body_usage_with_cached_tokens() -> None:
    body = json.dumps({"choices": [], "usage": USAGE}).encode()
    assert usage_from_json(body) == Usage(prompt_tokens=120, completion_tokens=7, cached_tokens=96)


def test_json_body_without_cache_details_reports_unknown_cache_hit() -> None:
    body = json.dumps({"usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
    assert usage_from_json(body) == Usage(3, 2, None)


@pytest.mark.parametrize("body", [b"", b"not json", b'{"usage": "x"}', b'["usage"]', b'{"id": 1}'])
def test_json_body_without_usable_usage_is_none(body: bytes) -> None:
    assert usage_from_json(body) is None


def feed_in_pieces(scanner: SseUsageScanner, stream: bytes, size: int) -> bytes:
    """Feed ``stream`` ``size`` bytes at a time; return what the client would receive."""
    out = b""
    pieces = [stream[i : i + size] for i in range(0, len(stream), size)] or [b""]
    for i, piece in enumerate(pieces):
        forwarded = scanner.feed(piece, end_of_stream=i == len(pieces) - 1)
        out += piece if forwarded is None else forwarded
    return out


STREAM_WITH_ADDED_USAGE = sse(token("Hel"), token("lo"), {"choices": [], "usage": USAGE}, "[DONE]")
CLIENT_VIEW = sse(token("Hel"), token("lo"), "[DONE]")


@pytest.mark.parametrize("size", [1, 7, 33, 64, 10_000])
def test_router_added_usage_chunk_is_stripped_at_any_chunking(size: int) -> None:
    scanner = SseUsageScanner(strip_usage_chunk=True)
    assert feed_in_pieces(scanner, STREAM_WITH_ADDED_USAGE, size) == CLIENT_VIEW
    assert scanner.usage == Usage(120, 7, 96)
    assert scanner.done
    assert scanner.data_events == 3


@pytest.mark.parametrize("size", [1, 13, 10_000])
def test_client_requested_usage_chunk_reaches_the_client(size: int) -> None:
    scanner = SseUsageScanner(strip_usage_chunk=False)
    assert feed_in_pieces(scanner, STREAM_WITH_ADDED_USAGE, size) == STREAM_WITH_ADDED_USAGE
    assert scanner.usage == Usage(120, 7, 96)


def test_chunks_on_event_boundaries_are_forwarded_untouched() -> None:
    scanner = SseUsageScanner(strip_usage_chunk=True)
    assert scanner.feed(sse(token("a")), end_of_stream=False) is None
    assert scanner.feed(sse(token("b")), end_of_stream=False) is None


def test_usage_in_a_content_chunk_is_kept() -> None:
    """Engines with continuous usage stats put usage on chunks that also carry tokens: only usage-only goes."""
    stream = sse({**token("x"), "usage": USAGE}, "[DONE]")
    scanner = SseUsageScanner(strip_usage_chunk=True)
    assert feed_in_pieces(scanner, stream, 5) == stream
    assert scanner.usage == Usage(120, 7, 96)


def test_null_usage_and_garbage_do_not_break_the_scan() -> None:
    stream = sse({**token("x"), "usage": None}, '{broken json with "usage"') + b": comment\n\n" + sse("[DONE]")
    scanner = SseUsageScanner(strip_usage_chunk=True)
    assert feed_in_pieces(scanner, stream, 4) == stream
    assert scanner.usage is None
    assert scanner.done


def test_crlf_framing_and_unterminated_last_event() -> None:
    stream = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\r\n\r\ndata: [DONE]'
    scanner = SseUsageScanner(strip_usage_chunk=True)
    assert feed_in_pieces(scanner, stream, 9) == b"data: [DONE]"
    assert scanner.usage == Usage(1, 1, None)
    assert scanner.done
