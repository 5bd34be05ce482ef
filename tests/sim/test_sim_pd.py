"""The simulated fleet's P/D half: roles, the three engine kinds' pair protocols over real HTTP, the KV blocks a
transfer stores in the decode engine (its cache and its KV events), per-role metrics, and clear refusals."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cognitora.disagg import protocols as pd
from cognitora_sim.harness.process import wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from tests.sim.test_sim_fleet import decode_payload, replay

PREFILL, DECODE, BOTH = 0, 1, 2


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with start_fleet(
        3,
        time_scale=20.0,
        extra_args=["--roles", "prefill,decode,both", "--link-gbps", "10", "--kv-transfer-timeout-s", "1"],
        log_dir=tmp_path_factory.mktemp("sim-pd"),
    ) as f:
        yield f


def chat_body(tag: str, max_tokens: int = 6) -> dict[str, Any]:
    rng = random.Random(tag)
    text = " ".join(f"w{rng.randrange(10_000)}" for _ in range(120))
    return {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["message"]["content"]
    return text


def stored_tokens(fleet: SimFleet, i: int) -> list[list[int]]:
    """The token ids of every BlockStored event engine ``i`` published, one list per event."""
    out = []
    for _, _, payload in replay(fleet.replay_addresses[i], 0):
        out += [e["token_ids"] for e in decode_payload(payload)[2] if e["type"] == "BlockStored"]
    return out


def metric(fleet: SimFleet, i: int, name: str) -> float:
    text = httpx.get(f"{fleet.urls[i]}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_vllm_pair_answers_as_a_whole_engine_and_the_transfer_lands_in_the_decode_cache(fleet: SimFleet) -> None:
    client = chat_body("vllm")
    whole = content(post(fleet.urls[BOTH], client))
    pre = post(fleet.urls[PREFILL], pd.vllm_prefill_body(client))
    assert pre.status_code == 200, pre.text
    params = pre.json()["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == fleet.endpoint_ids[PREFILL]
    assert pre.json()["usage"]["completion_tokens"] == 1
    stored_before = len(stored_tokens(fleet, DECODE))
    dec = post(fleet.urls[DECODE], pd.vllm_decode_body(client, pre.json()))
    assert content(dec) == whole
    # The prompt's full blocks came over the link: in the decode engine's KV events, with the prompt's tokens.
    prompt_ids = httpx.post(f"{fleet.urls[DECODE]}/tokenize", json=client).json()["tokens"]
    full = (len(prompt_ids) - 1) // 16
    wait_until(lambda: len(stored_tokens(fleet, DECODE)) > stored_before, 10, "the decode engine's events")
    first = stored_tokens(fleet, DECODE)[stored_before]
    assert first == prompt_ids[: full * 16]
    assert metric(fleet, DECODE, "cognitora_sim:pd_kv_transferred_blocks_total") == full
    assert metric(fleet, DECODE, 'cognitora_sim:pd_role_info{role="decode"}') == 1
    assert metric(fleet, PREFILL, 'cognitora_sim:pd_steps_total{protocol="vllm",side="prefill"}') == 1
    # The KV is handed over once: the same transfer again is refused, clearly.
    again = post(fleet.urls[DECODE], pd.vllm_decode_body(client, pre.json()))
    assert again.status_code == 503 and "no KV parked" in again.json()["error"]["message"]


def test_sglang_pair_sent_concurrently(fleet: SimFleet) -> None:
    client = chat_body("sglang")
    whole = content(post(fleet.urls[BOTH], client))
    host, port = fleet.endpoint_ids[PREFILL].split(":")
    pre_body, dec_body = pd.sglang_bodies(client, host, int(port), pd.sglang_room())

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as c:
            # decode first: it waits for the prefill's KV, as SGLang's decode server waits on the bootstrap room
            d = asyncio.ensure_future(c.post(f"{fleet.urls[DECODE]}/v1/chat/completions", json=dec_body))
            await asyncio.sleep(0.05)
            p = await c.post(f"{fleet.urls[PREFILL]}/v1/chat/completions", json=pre_body)
            return p, await d

    p, d = asyncio.run(both())
    assert p.status_code == 200, p.text
    assert content(d) == whole
    # Bootstrap fields sent to an aggregated engine: a 400 saying what to do.
    r = post(fleet.urls[BOTH], dec_body)
    assert r.status_code == 400 and "--roles" in r.json()["error"]["message"]


def test_trtllm_context_then_generation(fleet: SimFleet) -> None:
    client = chat_body("trtllm")
    whole = content(post(fleet.urls[BOTH], client))
    ctx = post(fleet.urls[PREFILL], pd.trtllm_context_body(client))
    assert ctx.status_code == 200, ctx.text
    gen = post(fleet.urls[DECODE], pd.trtllm_generation_body(client, ctx.json()))
    assert content(gen) == whole


def test_a_transfer_that_cannot_happen_is_refused_with_the_reason(fleet: SimFleet) -> None:
    client = chat_body("refused")
    bogus = {"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 1}}
    r = post(fleet.urls[DECODE], pd.vllm_decode_body(client, bogus))
    assert r.status_code == 400 and "remote_request_id" in r.json()["error"]["message"]
    fleet.fault(DECODE, "reject_kv")
    try:
        pre = post(fleet.urls[PREFILL], pd.vllm_prefill_body(client))
        r = post(fleet.urls[DECODE], pd.vllm_decode_body(client, pre.json()))
        assert r.status_code == 503 and r.json()["error"]["type"] == "KVTransferError"
    finally:
        fleet.fault(DECODE, "recover")
    assert metric(fleet, DECODE, 'cognitora_sim:pd_transfer_failures_total{reason="rejected"}') == 1
