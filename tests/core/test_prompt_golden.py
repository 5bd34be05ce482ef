"""Golden: the token ids the router computes are the ones the engine tokenizes, over real HTTP.

The simulated engine (``cognitora sim``) follows vLLM's prompt rules on its ``/tokenize``, ``/v1/completions/render``
and generation endpoints; the router reads the same request fields through ``RouteRequest``. Two models: SmolLM2
as shipped, and a variant whose tokenizer adds a BOS and whose template prints ``bos_token`` and the tools
(tests/support/bos_model.py), where chat and completions disagree on who adds the BOS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cognitora.config import config_from_dict
from cognitora.core.router import Router
from cognitora.request import RouteRequest
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.keys import chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer, prompt_token_ids, read_prompt
from tests.support.bos_model import BOS_ID, write_bos_model

MODEL = "smollm2"
SYSTEM = "You are the billing assistant of the Acme Rocket Company. Answer briefly. " * 8
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund an invoice",
            "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "lookup_plan"}},
]
HISTORY = [
    {"role": "system", "content": SYSTEM},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Why was I charged twice?"}, {"type": "text", "text": "Invoice 7."}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "refund", "arguments": '{"invoice": "7"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "refunded"},
    {"role": "user", "content": "Thanks! And my plan?"},
]


@dataclass
class Engine:
    fleet: SimFleet
    tokenizer: Path
    bos: bool

    @property
    def url(self) -> str:
        return self.fleet.urls[0]


@pytest.fixture(scope="module", params=["smollm2", "bos-template"])
def engine(
    request: pytest.FixtureRequest, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    work = tmp_path_factory.mktemp(f"golden-{request.param}")
    tokenizer = smollm2_dir / "tokenizer.json" if request.param == "smollm2" else write_bos_model(work / "model")
    with start_fleet(1, model=MODEL, tokenizer=tokenizer, time_scale=20, log_dir=work) as fleet:
        yield Engine(fleet, tokenizer, request.param != "smollm2")


def router_for(engine: Engine, **model: Any) -> Router:
    config = config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0},
            "models": [
                {"name": MODEL, "tokenizer": str(engine.tokenizer), "endpoints": [{"url": engine.url}], **model}
            ],
        }
    )
    return Router(config, MemoryStore())


def post(engine: Engine, path: str, body: dict[str, Any]) -> Any:
    resp = httpx.post(f"{engine.url}{path}", json={"model": MODEL, **body}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


CHATS: dict[str, dict[str, Any]] = {
    "plain": {"messages": HISTORY[:2]},
    "tools": {"messages": HISTORY, "tools": TOOLS},
    "no generation prompt": {"messages": HISTORY[:2], "add_generation_prompt": False},
    "special tokens on top": {"messages": HISTORY[:2], "add_special_tokens": True},
}


@pytest.mark.parametrize("case", list(CHATS))
def test_chat_ids_equal_the_engines_tokenize(engine: Engine, case: str) -> None:
    body = CHATS[case]
    theirs = post(engine, "/tokenize", body)["tokens"]
    ours = prompt_token_ids(ChatTokenizer(engine.tokenizer), read_prompt(**body))
    assert ours == [theirs]
    if engine.bos:
        leading = 2 if body.get("add_special_tokens") else 1
        assert theirs[:leading] == [BOS_ID] * leading and theirs[leading] != BOS_ID


@pytest.mark.parametrize("add_special_tokens", [None, False])
def test_completion_text_ids_equal_the_engines_tokenize(engine: Engine, add_special_tokens: bool | None) -> None:
    body: dict[str, Any] = {"prompt": SYSTEM + "Q: why was I charged twice?\nA:"}
    if add_special_tokens is not None:
        body["add_special_tokens"] = add_special_tokens
    theirs = post(engine, "/tokenize", body)["tokens"]
    assert prompt_token_ids(ChatTokenizer(engine.tokenizer), read_prompt(**body)) == [theirs]
    assert (theirs[0] == BOS_ID) == (engine.bos and add_special_tokens is None)


@pytest.mark.parametrize(
    "prompt",
    [["first: " + SYSTEM, "second: " + SYSTEM], [11, 22, 33, 44] * 10, [[11, 22, 33] * 8, [5, 6]]],
    ids=["strings", "token ids", "token-id lists"],
)
def test_completion_batches_equal_the_engines_render(engine: Engine, prompt: Any) -> None:
    theirs = [item["prompt_token_ids"] for item in post(engine, "/v1/completions/render", {"prompt": prompt})]
    assert prompt_token_ids(ChatTokenizer(engine.tokenizer), read_prompt(prompt=prompt)) == theirs


@pytest.mark.parametrize(
    "fields",
    [
        {"messages": HISTORY, "tools": TOOLS},
        {"prompt": ["first: " + SYSTEM, "second: " + SYSTEM]},
        {"prompt": [[11, 22, 33] * 8, [5, 6]]},
    ],
    ids=["chat with tools", "text batch", "token-id batch"],
)
async def test_the_routers_prompt_is_what_the_engine_prefills(engine: Engine, fields: dict[str, Any]) -> None:
    """Through RouteRequest, as both gateways hand it over: tokens counted and keys equal the engine's."""
    router = router_for(engine)
    decision = await router.place(RouteRequest(model=MODEL, **fields))
    await router.close()
    assert decision.rejection is None, decision.reason
    path = "/v1/chat/completions" if "messages" in fields else "/v1/completions"
    usage = post(engine, path, {**fields, "max_tokens": 1})["usage"]
    assert decision.prompt_tokens == usage["prompt_tokens"]
    if "messages" in fields:
        first = post(engine, "/tokenize", fields)["tokens"]
    else:
        first = post(engine, "/v1/completions/render", fields)[0]["prompt_token_ids"]
    assert list(decision.keys) == chain_block_keys(root_key(MODEL), first, 16)


def test_tokenize_refuses_what_vllm_refuses(engine: Engine) -> None:
    resp = httpx.post(f"{engine.url}/tokenize", json={"model": MODEL, "prompt": [1, 2, 3]}, timeout=30)
    assert resp.status_code == 400 and "'prompt' must be a string" in resp.json()["error"]["message"]
    resp = httpx.post(
        f"{engine.url}/v1/completions", json={"model": MODEL, "prompt": [1, "x"], "max_tokens": 1}, timeout=30
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"


def test_a_streamed_batch_answers_every_prompt_and_sums_the_usage(engine: Engine) -> None:
    prompt = [[11, 22, 33] * 8, [5, 6, 7]]
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        lines = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks: list[dict[str, Any]] = [json.loads(line) for line in lines[:-1]]
    text = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        text[choice["index"]] += choice["text"]
    assert all(len(t.split()) == 3 for t in text.values()), text
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["prompt_tokens"] == 24 + 3 and usage["completion_tokens"] == 6
