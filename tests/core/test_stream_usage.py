"""``cognitora.stream_usage``: usage, cache hit, first token and end, read from every surface's answers.

The streams are a real vLLM 0.32's (tests/data/vllm_streams/PROVENANCE.md): a 109-token prompt of which 96 were
cached, 6 tokens generated. The Anthropic-API orderings vLLM does not produce (``message_start`` long before the
first token; ``message_delta`` with only ``output_tokens``) are Anthropic's documented stream.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cognitora.stream_usage import (
    MessagesStreamReader,
    ResponsesStreamReader,
    Usage,
    stream_usage_reader,
    usage_from_body,
)
from envoy_extproc.usage import SseUsageScanner

STREAMS = Path(__file__).parents[1] / "data" / "vllm_streams"
RECORDED = Usage(prompt_tokens=109, completion_tokens=6, cached_tokens=96)


def _chunks(data: bytes, seed: int) -> list[bytes]:
    """``data`` cut at random places (a proxy forwards whatever its reads return)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, 25)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("surface", ["messages", "responses", "chat"])
@pytest.mark.parametrize("split", ["whole", "bytes", "random"])
def test_a_recorded_vllm_stream_gives_its_usage_however_it_is_cut(surface: str, split: str) -> None:
    data = (STREAMS / f"{surface}_cached.sse").read_bytes()
    reader = stream_usage_reader(surface)  # type: ignore[arg-type]
    chunks = {"whole": [data], "bytes": [data[i : i + 1] for i in range(len(data))], "random": _chunks(data, 7)}[split]
    for i, chunk in enumerate(chunks):
        assert reader.feed(chunk, end_of_stream=i == len(chunks) - 1) is None  # nothing rewritten
    assert reader.usage == RECORDED
    assert reader.done and reader.first_token and reader.error is None


@pytest.mark.parametrize("surface", ["messages", "responses"])
def test_a_whole_answer_gives_the_same_usage(surface: str) -> None:
    assert usage_from_body(surface, (STREAMS / f"{surface}_cached.json").read_bytes()) == RECORDED  # type: ignore[arg-type]
    assert usage_from_body(surface, b"not json") is None  # type: ignore[arg-type]
    assert usage_from_body(surface, b'{"id": "x"}') is None  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _events(data: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in data.split(b"\n\n") if e.strip()]


def test_a_responses_stream_reaches_its_first_token_after_the_events_vllm_sends_before_the_prefill() -> None:
    events = _events((STREAMS / "responses_cached.sse").read_bytes())
    clock = Clock()
    reader = ResponsesStreamReader(clock)
    for t, event in enumerate(events, start=1):
        clock.now = float(t)
        reader.feed(event)
    # response.created and response.in_progress come at once, before the prefill: the first token is the third.
    assert reader.first_token_at == 3.0
    completed = json.loads(events[-1].split(b"data: ", 1)[1])
    assert reader.response_id == completed["response"]["id"] and reader.response_id.startswith("resp_")
    assert reader.output_texts == [completed["response"]["output"][0]["content"][0]["text"]]
    assert reader.status == "incomplete"  # stopped by max_output_tokens


_START_USAGE = {
    "input_tokens": 25,
    "cache_read_input_tokens": 1500,
    "cache_creation_input_tokens": 10,
    "output_tokens": 1,
}
_ANTHROPIC_API_EVENTS = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude",
                "usage": _START_USAGE,
            },
        },
    ),
    ("ping", {"type": "ping"}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}}),
    ("message_stop", {"type": "message_stop"}),
]
ANTHROPIC_API_STREAM = b"".join(
    f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in _ANTHROPIC_API_EVENTS
)


def test_an_anthropic_api_stream_counts_cached_and_written_tokens_into_the_prompt() -> None:
    clock = Clock()
    reader = MessagesStreamReader(clock)
    for t, event in enumerate(_events(ANTHROPIC_API_STREAM), start=1):
        clock.now = float(t)
        reader.feed(event)
    # input_tokens counts only what was neither read from nor written to the cache.
    assert reader.usage == Usage(prompt_tokens=25 + 1500 + 10, completion_tokens=15, cached_tokens=1500)
    assert reader.first_token_at == 3.0  # content_block_start, not message_start (sent before generation)
    assert reader.done


def test_streams_without_event_lines_are_read_by_their_payloads() -> None:
    for surface in ("messages", "responses"):
        data = (STREAMS / f"{surface}_cached.sse").read_bytes()
        bare = b"\n".join(line for line in data.split(b"\n") if not line.startswith(b"event:"))
        reader = stream_usage_reader(surface)  # type: ignore[arg-type]
        reader.feed(bare, end_of_stream=True)
        assert reader.usage == RECORDED and reader.done


def test_error_events_are_reported() -> None:
    anthropic = MessagesStreamReader()
    anthropic.feed(
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    )
    assert anthropic.error == "Overloaded" and not anthropic.done
    responses = ResponsesStreamReader()
    failed = {"type": "response.failed", "response": {"id": "resp_9", "status": "failed", "error": {"message": "boom"}}}
    responses.feed(b"event: response.failed\ndata: " + json.dumps(failed).encode() + b"\n\n")
    assert responses.error == "boom" and responses.done and responses.response_id == "resp_9"
    chat = stream_usage_reader("chat")
    chat.feed(b'data: {"error": {"message": "engine overloaded", "code": 503}}\n\n')
    assert chat.error == "engine overloaded"


@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_chat_reader_forwards_and_strips_exactly_as_the_envoy_scanner_it_replaces(strip: bool, seed: int) -> None:
    data = (STREAMS / "chat_cached.sse").read_bytes()
    core, envoy = stream_usage_reader("chat", strip_usage_chunk=strip), SseUsageScanner(strip_usage_chunk=strip)
    out_core, out_envoy = [], []
    chunks = _chunks(data, seed)
    for i, chunk in enumerate(chunks):
        end = i == len(chunks) - 1
        a, b = core.feed(chunk, end), envoy.feed(chunk, end)
        out_core.append(chunk if a is None else a)
        out_envoy.append(chunk if b is None else b)
    assert out_core == out_envoy
    assert (core.usage.prompt_tokens, core.usage.completion_tokens, core.usage.cached_tokens) == (  # type: ignore[union-attr]
        envoy.usage.prompt_tokens,  # type: ignore[union-attr]
        envoy.usage.completion_tokens,  # type: ignore[union-attr]
        envoy.usage.cached_tokens,  # type: ignore[union-attr]
    )
    assert (core.done, core.data_events) == (envoy.done, envoy.data_events)
    if strip:
        assert b'"choices":[]' not in b"".join(out_core)
