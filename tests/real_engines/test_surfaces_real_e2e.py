"""Every request surface against a real vLLM 0.32: the router's tokens are the engine's, token for token, and the
engine's own prefix-cache counters agree with what the block keys predict, whichever surface a conversation takes.

One engine of its own (not the session pair), started with ``--enable-scale-out`` (vLLM serves its
``/v1/{chat/completions,messages,responses}/render`` routes only then) and ``--chat-template`` a template that prints
tools, tool calls, tool call ids and reasoning as JSON (tests/support/surface_cases.py), so any
difference in how a surface
builds them shows in the tokens. Each test's prompts start with a salt of their own: blocks cached by an earlier
test never match.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cognitora.stream_usage import stream_usage_reader, usage_from_body
from cognitora_sim.harness.real_engines.launch import BLOCK_SIZE, MODEL, RealEngineFleet, start_engines
from cognitora_sim.harness.real_engines.provision import ProvisionError, RealEngineInstall, provision
from kvstate.prompt import ChatTokenizer, PromptKeyer
from kvstate.surfaces import SurfaceName, read_surface, surface_keys, surface_token_ids, template_traits
from tests.real_engines.traffic import prefix_cache_hits
from tests.support.surface_cases import SAME_CONVERSATIONS, SINGLE_SURFACE, TOOLS_TEMPLATE, Conversation

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

RENDER = {
    "chat": "/v1/chat/completions/render",
    "messages": "/v1/messages/render",
    "responses": "/v1/responses/render",
}
GENERATE = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


class Engine:
    def __init__(self, fleet: RealEngineFleet, template: Path) -> None:
        self.url = fleet.urls[0]
        self.tok = ChatTokenizer(fleet.install.checkpoint / "tokenizer.json", template)
        self.traits = template_traits(self.tok.template)
        self.keyer = PromptKeyer(MODEL, BLOCK_SIZE, self.tok, key_memo_bytes=0)

    def ids(self, surface: SurfaceName, body: dict[str, Any], *, count_tokens: bool = False) -> list[int]:
        request = read_surface(surface, body, traits=self.traits, count_tokens=count_tokens)
        (ids,) = surface_token_ids(self.tok, request)
        return ids

    def keys(self, surface: SurfaceName, body: dict[str, Any]) -> list[int]:
        return surface_keys(self.keyer, read_surface(surface, body, traits=self.traits)).keys


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    try:
        install: RealEngineInstall = provision(say=print)
    except ProvisionError as exc:
        pytest.fail(f"real vLLM engines could not be provisioned on this machine: {exc}", pytrace=False)
    work = tmp_path_factory.mktemp("real-surfaces")
    template = work / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    extra = ["--enable-scale-out", "--chat-template", str(template)]
    with start_engines(1, work, kv_events=False, extra_args=extra, install=install) as fleet:
        print("real vLLM engine ready in", fleet.engines[0].started_s, "s")
        yield Engine(fleet, template)


def _salted(conversation: Conversation, surface: str, salt: str) -> dict[str, Any]:
    """The conversation's body with ``salt`` leading its system prompt (each surface's own field for it), and its
    tools' descriptions (the template prints the tools first)."""
    body = conversation.body(surface)
    if "tools" in body:
        tools = [dict(t) for t in body["tools"]]
        for tool in tools:
            if "function" in tool:
                tool["function"] = {**tool["function"], "description": salt + tool["function"]["description"]}
            else:
                tool["description"] = salt + tool["description"]
        body = {**body, "tools": tools}
    if surface == "chat":
        first = body["messages"][0]
        return {**body, "messages": [{**first, "content": salt + first["content"]}, *body["messages"][1:]]}
    if surface == "messages":
        system = body["system"]
        if isinstance(system, list):
            return {**body, "system": [{**system[0], "text": salt + system[0]["text"]}, *system[1:]]}
        return {**body, "system": salt + system}
    return {**body, "instructions": salt + body["instructions"]}


CASES = [(c.name, s, c.body(s)) for c in SAME_CONVERSATIONS for s in ("chat", "messages", "responses")] + [
    (c.name, c.surface, c.full_body()) for c in SINGLE_SURFACE
]


@pytest.mark.parametrize(("name", "surface", "body"), CASES, ids=[f"{n}-{s}" for n, s, _ in CASES])
def test_every_surface_tokenizes_as_the_real_engine(
    engine: Engine, name: str, surface: Any, body: dict[str, Any]
) -> None:
    answer = httpx.post(engine.url + RENDER[surface], json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert engine.ids(surface, body) == answer.json()["token_ids"]
    if surface == "messages":
        ask = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
        counted = httpx.post(f"{engine.url}/v1/messages/count_tokens", json=ask, timeout=120).json()["input_tokens"]
        assert counted == len(engine.ids("messages", ask, count_tokens=True))


def _send(engine: Engine, surface: str, body: dict[str, Any], stream: bool) -> tuple[int, int]:
    """(prompt tokens, cached tokens) the engine reports, read by the core's readers from its raw answer."""
    body = {**body, "stream": stream} if surface != "chat" else {**body, "max_tokens": 4, "stream": stream}
    if surface == "chat" and stream:
        body["stream_options"] = {"include_usage": True}
    if not stream:
        answer = httpx.post(engine.url + GENERATE[surface], json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        usage = usage_from_body(surface, answer.content)  # type: ignore[arg-type]
    else:
        reader = stream_usage_reader(surface)  # type: ignore[arg-type]
        with httpx.stream("POST", engine.url + GENERATE[surface], json=body, timeout=300) as answer:
            assert answer.status_code == 200, answer.read()
            for chunk in answer.iter_raw():
                reader.feed(chunk)
        reader.feed(b"", end_of_stream=True)
        assert reader.done and reader.first_token and reader.error is None
        usage = reader.usage
    assert usage is not None and usage.cached_tokens is not None
    return usage.prompt_tokens, usage.cached_tokens


@pytest.mark.parametrize("conversation", SAME_CONVERSATIONS, ids=lambda c: c.name)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_engine_s_own_prefix_cache_agrees_with_the_keys_through_every_surface(
    engine: Engine, conversation: Conversation, stream: bool
) -> None:
    salt = f"[{uuid.uuid4().hex}] "
    seen: list[list[int]] = []
    full = 0
    for surface in ("chat", "messages", "responses"):
        body = _salted(conversation, surface, salt)
        keys = engine.keys(surface, body)  # type: ignore[arg-type]
        before = prefix_cache_hits(engine.url)
        prompt, cached = _send(engine, surface, body, stream)
        counted = prefix_cache_hits(engine.url) - before
        assert prompt == len(engine.ids(surface, body))  # type: ignore[arg-type]
        shared = max((_common(keys, k) for k in seen), default=0)
        predicted = min(shared, (prompt - 1) // BLOCK_SIZE) * BLOCK_SIZE
        assert cached == predicted == counted, (surface, cached, predicted, counted)
        seen.append(keys)
        if surface == "chat":
            full = (prompt - 1) // BLOCK_SIZE * BLOCK_SIZE
            assert cached == 0
        else:
            same = conversation.renders_alike(prints_tool_calls_as_json=True)[surface == "responses"]
            assert (cached == full) is same, (surface, cached, full)
            assert cached > 0  # the salted system prompt (and tools) always hit


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_responses_stream_reports_its_first_token_after_the_prefill_not_at_its_first_event(engine: Engine) -> None:
    """vLLM sends ``response.created`` before it prefills: on a long cold prompt the first bytes arrive alone, and
    the reader does not take them for the first token."""
    salt = f"[{uuid.uuid4().hex}] "
    body = {"model": MODEL, "instructions": salt + "Count the words. " * 200, "input": "Go.", "max_output_tokens": 2}
    reader = stream_usage_reader("responses")
    after_first_chunk: bool | None = None
    with httpx.stream("POST", f"{engine.url}/v1/responses", json={**body, "stream": True}, timeout=300) as answer:
        for chunk in answer.iter_raw():
            reader.feed(chunk)
            if after_first_chunk is None:
                after_first_chunk = reader.first_token
                first_bytes_at = time.monotonic()
    assert after_first_chunk is False  # response.created / in_progress only
    assert reader.done and reader.first_token_at is not None and reader.first_token_at > first_bytes_at
    assert reader.usage is not None and reader.usage.prompt_tokens > 600 and reader.usage.cached_tokens == 0
