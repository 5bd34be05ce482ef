"""The simulated engine serves Anthropic Messages and OpenAI Responses as vLLM does, to the official SDKs, and its
prefix cache sees exactly the tokens the router keys: one conversation hits the same cached blocks through every
surface where vLLM renders it alike, and only the shared prefix where vLLM does not.

Two engines' worth of models: SmolLM2 as shipped (it renders neither tools nor tool calls), and SmolLM2 with a
template that prints tools and tool calls as JSON (tests/support/surface_cases.py), where Responses and chat differ."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from cognitora.stream_usage import stream_usage_reader
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.prompt import ChatTokenizer, PromptKeyer
from kvstate.surfaces import ResponseHistory, read_surface, surface_keys, surface_token_ids, template_traits
from kvstate.surfaces.request import SurfaceName
from tests.support.surface_cases import SAME_CONVERSATIONS, SYSTEM, TOOLS_TEMPLATE, image_conversation, png

MODEL = "smollm2"
BLOCK = 16


def _model_dir(smollm2_dir: Path, directory: Path, template: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir / name, directory / name)
    (directory / "chat_template.jinja").write_text(template)
    return directory / "tokenizer.json"


class Engine:
    def __init__(self, fleet: SimFleet, tokenizer: Path) -> None:
        self.fleet = fleet
        self.url = fleet.urls[0]
        self.tok = ChatTokenizer(tokenizer)
        self.traits = template_traits(self.tok.template)
        self.keyer = PromptKeyer(MODEL, BLOCK, self.tok, key_memo_bytes=0)
        self.seen: list[list[int]] = []
        """Keys of every prompt sent so far (the engine's cache holds them all: it is far from full)."""

    def keys(self, surface: SurfaceName, body: dict[str, Any], history: ResponseHistory | None = None) -> list[int]:
        return surface_keys(self.keyer, read_surface(surface, body, traits=self.traits, history=history)).keys

    def predicted_cached(self, keys: list[int], prompt_tokens: int) -> int:
        """vLLM's hit: the longest run of leading blocks some earlier prompt had, never the whole prompt."""
        best = 0
        for earlier in self.seen:
            n = 0
            while n < min(len(keys), len(earlier)) and keys[n] == earlier[n]:
                n += 1
            best = max(best, n)
        return min(best, (prompt_tokens - 1) // BLOCK) * BLOCK


@pytest.fixture(scope="module", params=["smollm2", "tools-as-json"])
def engine(
    request: pytest.FixtureRequest, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    work = tmp_path_factory.mktemp(f"sim-surfaces-{request.param}")
    if request.param == "smollm2":
        tokenizer = smollm2_dir / "tokenizer.json"
    else:
        tokenizer = _model_dir(smollm2_dir, work / "model", TOOLS_TEMPLATE)
    extra = ["--block-size", str(BLOCK), "--responses-store"]
    with start_fleet(1, model=MODEL, tokenizer=tokenizer, time_scale=50, log_dir=work, extra_args=extra) as fleet:
        yield Engine(fleet, tokenizer)


def _send(engine: Engine, surface: SurfaceName, body: dict[str, Any]) -> tuple[int, int]:
    """Send ``body`` streamed through the surface's SDK; the (prompt, cached) tokens its answer reports, read by
    the core's stream reader from the raw stream too."""
    if surface == "chat":
        client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="x")
        answer = client.chat.completions.create(**{**body, "max_tokens": 8})  # type: ignore[call-overload]
        usage = answer.usage
        details = usage.prompt_tokens_details
        return usage.prompt_tokens, details.cached_tokens if details else 0
    path = {"messages": "/v1/messages", "responses": "/v1/responses"}[surface]
    reader = stream_usage_reader(surface)
    with httpx.stream("POST", engine.url + path, json={**body, "stream": True}, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        for chunk in resp.iter_raw():
            reader.feed(chunk)
    reader.feed(b"", end_of_stream=True)
    assert reader.done and reader.usage is not None and reader.first_token
    return reader.usage.prompt_tokens, reader.usage.cached_tokens or 0


@pytest.mark.parametrize("conversation", SAME_CONVERSATIONS, ids=lambda c: c.name)
def test_one_conversation_hits_the_cached_blocks_the_keys_predict_through_every_surface(
    engine: Engine, conversation: Any
) -> None:
    json_template = engine.tok.template is not None and "tojson" in (engine.tok.template.source() or "")
    same_messages, same_responses = conversation.renders_alike(prints_tool_calls_as_json=json_template)
    reports: dict[str, tuple[int, int, int]] = {}
    for surface in ("chat", "messages", "responses"):
        body = conversation.body(surface)
        keys = engine.keys(surface, body)
        prompt, cached = _send(engine, surface, body)
        reports[surface] = (prompt, cached, engine.predicted_cached(keys, prompt))
        engine.seen.append(keys)
    for surface, (_prompt, cached, predicted) in reports.items():
        assert cached == predicted, (surface, reports)
    chat_prompt = reports["chat"][0]
    assert (reports["messages"][0] == chat_prompt) is same_messages
    full = (chat_prompt - 1) // BLOCK * BLOCK
    assert (reports["messages"][1] == full) is same_messages
    assert (reports["responses"][1] == full) is same_responses
    if not same_responses:
        assert 0 < reports["responses"][1] < full  # the shared system prompt and tools still hit


def test_messages_through_the_anthropic_sdk(engine: Engine) -> None:
    client = anthropic.Anthropic(base_url=engine.url, api_key="x")
    tools = [{"name": "refund", "description": "Refund an invoice", "input_schema": {"type": "object"}}]
    ask = {"model": MODEL, "system": f"sdk-messages {SYSTEM}", "messages": [{"role": "user", "content": "Hi"}]}
    count = client.messages.count_tokens(**ask, tools=tools)  # type: ignore[arg-type]
    request = read_surface("messages", {**ask, "tools": tools}, traits=engine.traits, count_tokens=True)
    assert count.input_tokens == _prompt_tokens(engine, request)
    first = client.messages.create(**ask, max_tokens=6, tools=tools)  # type: ignore[arg-type]
    assert first.type == "message" and first.role == "assistant" and first.stop_reason == "max_tokens"
    assert first.content[0].type == "text" and first.usage.output_tokens == 6
    assert first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0) == count.input_tokens
    names: list[str] = []
    with client.messages.stream(**ask, max_tokens=6, tools=tools) as stream:  # type: ignore[arg-type]
        names = [event.type for event in stream]
        final = stream.get_final_message()
    assert names[0] == "message_start" and names[1] == "content_block_start" and names[-1] == "message_stop"
    assert names[-3:-1] == ["content_block_stop", "message_delta"]
    assert final.usage.cache_read_input_tokens == (count.input_tokens - 1) // BLOCK * BLOCK  # the same prompt again
    assert "".join(b.text for b in final.content if b.type == "text")
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        client.messages.create(model="other", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [{"type": "x"}]}])
    assert bad.value.body["error"]["param"] == "body.messages[0].content[0].type"  # type: ignore[index]


def _prompt_tokens(engine: Engine, request: Any) -> int:
    return sum(map(len, surface_token_ids(engine.tok, request)))


def test_responses_through_the_openai_sdk_and_previous_response_id(engine: Engine) -> None:
    client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="x")
    instructions = f"sdk-responses {SYSTEM}"
    first = client.responses.create(model=MODEL, instructions=instructions, input="What is 2+2?", max_output_tokens=6)
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    assert first.output_text and first.usage is not None and first.usage.output_tokens == 6
    events = [e.type for e in client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, stream=True)]
    assert events[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert events[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    # The router's side of previous_response_id: it remembers what it saw of the first answer ...
    history = ResponseHistory()
    seen = read_surface("responses", {"instructions": instructions, "input": "What is 2+2?"}, history=history)
    assert seen.chat is not None
    history.remember(first.id, seen.chat.messages, [first.output_text], endpoint=engine.fleet.endpoint_ids[0])
    follow = {"model": MODEL, "instructions": instructions, "input": "And 3+3?", "previous_response_id": first.id}
    resolved = read_surface("responses", follow, traits=engine.traits, history=history)
    unresolved = read_surface("responses", follow, traits=engine.traits)
    assert resolved.previous_endpoint == engine.fleet.endpoint_ids[0]
    second = client.responses.create(**follow, max_output_tokens=4)  # type: ignore[arg-type]
    assert second.usage is not None
    # ... so it keys the prompt the engine computes (the engine holds the first turn: --responses-store).
    assert second.usage.input_tokens == _prompt_tokens(engine, resolved) > _prompt_tokens(engine, unresolved)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown")


def test_an_image_is_cached_by_its_content_whichever_surface_carries_it(engine: Engine) -> None:
    cat = image_conversation(png(11))
    dog = image_conversation(png(12))
    for conv in (cat, dog):  # unique system prompts for this test
        conv["chat"]["messages"][0] = {"role": "system", "content": f"images {SYSTEM}"}
        conv["messages"]["system"] = conv["responses"]["instructions"] = f"images {SYSTEM}"
    chat_keys = engine.keys("chat", cat["chat"])
    prompt, cached = _send(engine, "chat", {"model": MODEL, **cat["chat"]})
    assert cached == engine.predicted_cached(chat_keys, prompt) == 0
    engine.seen.append(chat_keys)
    for surface in ("messages", "responses"):
        body = {"model": MODEL, **cat[surface]}
        prompt, cached = _send(engine, surface, body)  # type: ignore[arg-type]
        assert cached == (prompt - 1) // BLOCK * BLOCK  # past the image: the same image, the same blocks
    other_keys = engine.keys("messages", {"model": MODEL, **dog["messages"]})
    prompt, cached = _send(engine, "messages", {"model": MODEL, **dog["messages"]})
    assert cached == engine.predicted_cached(other_keys, prompt)
    assert 0 < cached < (prompt - 1) // BLOCK * BLOCK  # the system prompt hits, the other image does not


def test_render_endpoints_give_the_router_s_token_ids(engine: Engine) -> None:
    conversation = SAME_CONVERSATIONS[1]
    for surface in ("messages", "responses"):
        body = conversation.body(surface)
        got = httpx.post(f"{engine.url}/v1/{surface}/render", json=body, timeout=30).json()["token_ids"]
        request = read_surface(surface, body, traits=engine.traits)  # type: ignore[arg-type]
        assert got == surface_token_ids(engine.tok, request)[0]
    bad = httpx.post(f"{engine.url}/v1/responses", json={"model": MODEL, "input": [{"type": "nope"}]}, timeout=30)
    assert bad.status_code == 400 and json.loads(bad.text)["error"]["param"] == "body.input[0].type"


def test_embeddings_take_every_input_vllm_takes(engine: Engine) -> None:
    client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="x")
    texts = client.embeddings.create(model=MODEL, input=["the cat sat", "a dog ran far"])
    ids = client.embeddings.create(model=MODEL, input=[[1, 2, 3, 4], [5, 6]])
    assert [len(d.embedding) for d in texts.data] == [256, 256] and ids.usage.prompt_tokens == 6
    request = read_surface("embeddings", {"input": ["the cat sat", "a dog ran far"]})
    assert texts.usage.prompt_tokens == _prompt_tokens(engine, request)
    with pytest.raises(openai.BadRequestError, match="input"):
        client.embeddings.create(model=MODEL, input=[{"text": "x"}])  # type: ignore[list-item]
