"""What the two gateways' surface end-to-end tests share: the official ``openai`` and ``anthropic`` SDKs as the
clients, every surface they speak, and an agent-style session (tools, a growing history) whose cache hits are
compared with what reuse allows (the keys the router computes, as ``tests/sim/test_sim_surfaces.py`` does).

``served_by(headers)`` names the engine that answered, from the gateway's response headers (Envoy:
``x-cognitora-upstream-host``; LiteLLM: ``x-litellm-model-api-base``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from kvstate.prompt import ChatTokenizer, PromptKeyer
from kvstate.surfaces import read_surface, surface_keys, template_traits

BLOCK = 16
"""The sims' block size in these tests (``--block-size``), and the router's (``models[].block_size``)."""

ServedBy = Callable[[Mapping[str, str]], str]

TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file of the repository and return its text.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "run_tests",
        "description": "Run the test suite and return the failures.",
        "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}},
    },
]
AGENT_SYSTEM = (
    "You are a coding agent working in a Python repository. Read files before changing them, run the tests after "
    "every change, and explain each step in one short sentence. " * 8
)


def openai_client(base_url: str, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=60)


def anthropic_client(base_url: str, key: str | None = None) -> anthropic.Anthropic:
    """The anthropic SDK at a gateway: ``auth_token`` is sent as ``Authorization: Bearer`` (what both gateways
    authenticate); without a key, a placeholder ``x-api-key`` the gateway ignores."""
    if key is None:
        return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    return anthropic.Anthropic(base_url=base_url, auth_token=key, max_retries=0, timeout=60)


def exercise_openai(client: openai.OpenAI, model: str, served_by: ServedBy, tag: str) -> dict[str, Any]:
    """Chat, completions, Responses (plain, streamed, continued by ``previous_response_id``), embeddings and a chat
    stream through the openai SDK; returns what was seen. Asserts each answer is the surface's own shape."""
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"{tag} chat: hello"}], max_tokens=5
    )
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 5
    completion = client.completions.create(model=model, prompt=f"{tag} completions: once upon", max_tokens=4)
    assert completion.choices[0].text and completion.usage is not None
    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"{tag} stream"}], max_tokens=4, stream=True
        )
        if c.choices
    ]
    assert "".join(pieces)
    embedded = client.embeddings.create(model=model, input=[f"{tag} embed one", f"{tag} embed two"])
    assert len(embedded.data) == 2 and embedded.data[0].embedding and embedded.usage.prompt_tokens > 0

    instructions = f"{tag}: you answer questions about arithmetic. " * 10
    raw = client.responses.with_raw_response.create(
        model=model, instructions=instructions, input="What is 2+2?", max_output_tokens=6
    )
    first = raw.parse()
    holder = served_by(raw.headers)
    assert first.output_text and first.usage is not None and first.usage.output_tokens > 0
    events = [e.type for e in client.responses.create(model=model, input=f"{tag} hi", max_output_tokens=4, stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    # A follow-up continues the conversation only the engine that stored it holds: each lands there and succeeds.
    continued: list[str] = []
    previous = first.id
    for question in ("And 3+3?", "And 4+4?", "And 5+5?"):
        raw = client.responses.with_raw_response.create(
            model=model, instructions=instructions, input=question, previous_response_id=previous, max_output_tokens=4
        )
        answer = raw.parse()
        assert answer.usage is not None and answer.output_text
        continued.append(served_by(raw.headers))
        previous = answer.id
    return {"holder": holder, "continued": continued}


def exercise_anthropic(
    client: anthropic.Anthropic, model: str, tag: str, *, exact_count: bool = True
) -> dict[str, Any]:
    """Messages (plain, tools, streamed) and count_tokens through the anthropic SDK; returns what was seen.
    ``exact_count``: count_tokens is an engine's count (Envoy), not a gateway's own estimate (LiteLLM)."""
    system = f"{tag}: you are the billing assistant of the Acme Rocket Company. " * 8
    ask: dict[str, Any] = {"model": model, "system": system, "messages": [{"role": "user", "content": "Hi"}]}
    count = client.messages.count_tokens(**ask, tools=TOOLS)
    assert count.input_tokens > 100
    first = client.messages.create(**ask, max_tokens=6, tools=TOOLS)
    assert first.type == "message" and first.role == "assistant" and first.stop_reason == "max_tokens"
    prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    if exact_count:
        assert prompt == count.input_tokens  # the engine's count of the same request, answered unplaced
    with client.messages.stream(**ask, max_tokens=6, tools=TOOLS) as stream:
        names = [event.type for event in stream]
        final = stream.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert "".join(b.text for b in final.content if b.type == "text")
    with_tool = client.messages.create(
        model=model,
        system=system,
        max_tokens=4,
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Read setup.py"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "setup.py"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}]},
        ],
    )
    assert with_tool.content and with_tool.stop_reason == "max_tokens"
    return {"count": count.input_tokens, "prompt": prompt}


def check_bad_bodies(base_url: str, headers: Mapping[str, str]) -> None:
    """Bodies a surface cannot read: a 400 naming the field, never placed, never a 500."""
    cases = [
        ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "nope"}]}]},
            "messages[0].content[0]",
        ),
        ("/v1/responses", {"model": "m", "input": [{"type": "bogus_item"}]}, "input[0]"),
        ("/v1/responses", {"model": "m", "input": "x", "max_output_tokens": "10"}, "max_output_tokens"),
    ]
    for path, body, param in cases:
        r = httpx.post(base_url + path, json=body, headers=dict(headers), timeout=30)
        assert r.status_code == 400, (path, body, r.status_code, r.text)
        assert param in json.dumps(r.json()), (path, r.text)


def engine_counters(urls: list[str]) -> dict[str, tuple[float, float]]:
    """Each engine's own ``(vllm:prompt_tokens_total, vllm:prefix_cache_hits_total)``: what a run of requests cost
    and hit on which engine, whatever the gateway translated the answers' usage into."""
    out: dict[str, tuple[float, float]] = {}
    for base in urls:
        prompt = hits = 0.0
        for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prompt_tokens_total"):
                prompt += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
        out[base] = (prompt, hits)
    return out


@dataclass
class Turn:
    engine: str
    prompt_tokens: int
    """The engine's own count (``vllm:prompt_tokens_total``), whatever the gateway made of the answer's usage."""
    cached_tokens: int
    """The engine's own prefix-cache hits (``vllm:prefix_cache_hits_total``) for this turn."""
    bound: int
    """The most the engine could have had cached: the longest run of leading blocks an earlier turn's prompt had
    (the router's keys, which the sim's prefix cache shares), never the whole prompt."""


@dataclass
class Session:
    turns: list[Turn] = field(default_factory=list)

    engines_reached: set[str] = field(default_factory=set)
    """The engines whose own prompt-token counters grew, turn by turn."""

    @property
    def engines(self) -> set[str]:
        return {t.engine for t in self.turns}

    @property
    def hit_ratio(self) -> float:
        """Cached tokens over the reuse bound, over every turn after the first."""
        bound = sum(t.bound for t in self.turns[1:])
        return sum(t.cached_tokens for t in self.turns[1:]) / bound if bound else 0.0


class Keys:
    """The router's keys of a Messages body (SmolLM2's tokenizer and template, the sims' block size)."""

    def __init__(self, smollm2_dir: Path, model: str) -> None:
        tok = ChatTokenizer(smollm2_dir / "tokenizer.json")
        self.traits = template_traits(tok.template)
        self.keyer = PromptKeyer(model, BLOCK, tok, key_memo_bytes=0)
        self.seen: list[list[int]] = []

    def bound(self, body: Mapping[str, Any], prompt_tokens: int) -> int:
        keys = surface_keys(self.keyer, read_surface("messages", body, traits=self.traits)).keys
        best = 0
        for earlier in self.seen:
            n = 0
            while n < min(len(keys), len(earlier)) and keys[n] == earlier[n]:
                n += 1
            best = max(best, n)
        self.seen.append(keys)
        return min(best, (prompt_tokens - 1) // BLOCK) * BLOCK


def agent_session(
    client: anthropic.Anthropic,
    model: str,
    keys: Keys,
    served_by: ServedBy,
    tag: str,
    engine_urls: list[str],
    turns: int = 20,
) -> Session:
    """A coding agent's session through the anthropic SDK: the same system prompt and tools every turn, the whole
    history resent, a tool call and its result every other turn, the engine's answers appended as they came."""
    system = f"[{tag}] {AGENT_SYSTEM}"
    history: list[dict[str, Any]] = []
    session = Session()
    for turn in range(turns):
        history.append({"role": "user", "content": f"Step {turn}: look at module_{turn}.py and fix what fails."})
        body: dict[str, Any] = {"model": model, "system": system, "tools": TOOLS, "messages": history, "max_tokens": 8}
        before = engine_counters(engine_urls)
        raw = client.messages.with_raw_response.create(**body)
        answer = raw.parse()
        after = engine_counters(engine_urls)
        grew = [url for url in engine_urls if after[url][0] > before[url][0]]
        assert len(grew) == 1, f"turn {turn} reached {grew}"
        prompt = int(after[grew[0]][0] - before[grew[0]][0])
        cached = int(after[grew[0]][1] - before[grew[0]][1])
        session.turns.append(Turn(served_by(raw.headers) or grew[0], prompt, cached, keys.bound(body, prompt)))
        session.engines_reached.add(grew[0])
        text = "".join(b.text for b in answer.content if b.type == "text")
        if turn % 2 == 0:
            call = {"type": "tool_use", "id": f"toolu_{turn}", "name": "read_file", "input": {"path": f"m{turn}.py"}}
            history.append({"role": "assistant", "content": [{"type": "text", "text": text}, call]})
            result = {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": f"def f{turn}(): return {turn}"}
            history.append({"role": "user", "content": [result]})
        else:
            history.append({"role": "assistant", "content": text})
    return session
