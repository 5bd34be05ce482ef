"""What the collector pulls beside /metrics, over real HTTP to the simulated engines (``cognitora sim``):
llama.cpp ``GET /slots`` (busy slots, context size) and TRT-LLM ``POST /kv_cache_events`` (prefix affinity from the
engine's own events)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from cognitora.collector import Collector
from cognitora.config import config_from_dict
from cognitora.kv_event_sources import reports_kv_events
from cognitora.placement.estimate_basis import estimate_basis
from cognitora_sim.harness.process import free_port
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.keys import chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from kvstate.scrape import Scraper, ScrapeTarget

KINDS = ("llamacpp", "trtllm")
MODEL = "smollm2"
BLOCK = 16

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    with start_fleet(
        len(KINDS),
        profile="mac,h100",
        tokenizer=smollm2_dir / "tokenizer.json",
        extra_args=["--engine-kind", ",".join(KINDS), "--block-size", str(BLOCK)],
        log_dir=tmp_path_factory.mktemp("pulls-sim"),
    ) as f:
        yield f


async def until(check: Callable[[], Awaitable[bool]], what: str, deadline_s: float = 15.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def http_requests(fleet: SimFleet, i: int) -> dict[str, int]:
    engines: list[dict[str, Any]] = httpx.get(f"{fleet.admin_url}/sim/state", timeout=5).json()["engines"]
    return engines[i]["http_requests"]


# -- llama.cpp /slots -------------------------------------------------------------------------------------------
async def test_llamacpp_slots_give_busy_slots_and_the_context_the_server_holds(fleet: SimFleet) -> None:
    url, endpoint = fleet.urls[0], fleet.endpoint_ids[0]
    slots = httpx.get(f"{url}/slots", timeout=5).json()
    store = MemoryStore()
    # A round may take seconds when another test worker loads the machine (a round timed out is an unhealthy one):
    # each round gets 5 s, the wait 60 s, and the request decodes for longer than that (~8 ms a token on "mac").
    scraper = Scraper(store, [ScrapeTarget(endpoint, url, "llamacpp")], interval_s=5.0)
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"model": MODEL, "prompt": "hello there " * 20, "max_tokens": 12000, "stream": True}
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for _ in response.aiter_lines():  # the first chunk: the request holds a slot now
                break

            async def one_busy() -> bool:
                snap = await scraper.scrape(endpoint)
                return snap is not None and snap.running == 1

            await until(one_busy, "the scrape to see one busy slot", deadline_s=60.0)
    await scraper.stop()
    snap = (await store.snapshots())[endpoint]
    # llama.cpp's /metrics says nothing of its KV size; /slots does (the largest slot's n_ctx: a lower bound)
    assert snap.kv_capacity_tokens == max(s["n_ctx"] for s in slots) > 0
    assert snap.seats == len(slots)  # the server's -np: placement's seat count (cognitora.placement.seat_wait)
    assert http_requests(fleet, 0).get("/slots", 0) >= 2  # the test's own read, and the scraper's


@pytest.fixture
async def llamacpp_without_slots() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """A llama-server started with ``--no-slots``: /slots answers 501 as llama.cpp does; /metrics shows 3 busy."""
    hits: dict[str, int] = {}

    async def count(request: web.Request) -> None:
        hits[request.path] = hits.get(request.path, 0) + 1

    async def health(request: web.Request) -> web.Response:
        await count(request)
        return web.json_response({"status": "ok"})

    async def metrics(request: web.Request) -> web.Response:
        await count(request)
        return web.Response(text="llamacpp:requests_processing 3\nllamacpp:requests_deferred 1\n")

    async def slots(request: web.Request) -> web.Response:
        await count(request)
        error = {"code": 501, "message": "This server does not support slots endpoint.", "type": "not_supported_error"}
        return web.json_response({"error": error}, status=501)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/slots", slots)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


async def test_a_server_without_slots_is_asked_once_and_read_from_metrics(
    llamacpp_without_slots: tuple[str, dict[str, int]],
) -> None:
    url, hits = llamacpp_without_slots
    scraper = Scraper(MemoryStore(), [ScrapeTarget("box:1", url, "llamacpp")], interval_s=1.0)
    for _ in range(3):
        snap = await scraper.scrape("box:1")
    await scraper.stop()
    assert hits["/slots"] == 1 and hits["/metrics"] == 3
    assert snap is not None and snap.healthy and snap.running == 3 and snap.waiting == 1


# -- TRT-LLM /kv_cache_events -----------------------------------------------------------------------------------
def token_prompt(seed: int, n: int = 4 * BLOCK) -> list[int]:
    return [1000 + seed * 97 + i for i in range(n)]


async def test_the_sim_drains_trtllm_events_in_trtllm_serves_format(fleet: SimFleet) -> None:
    url = fleet.urls[1]
    prompt = token_prompt(0)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    httpx.post(f"{url}/v1/completions", json=body, timeout=30).raise_for_status()
    drained = httpx.post(f"{url}/kv_cache_events", timeout=5).json()
    types = [e["data"]["type"] for e in drained]
    assert types[0] == "created" and "stored" in types
    assert all(set(e) == {"event_id", "data", "window_size"} for e in drained)
    stored = [e["data"] for e in drained if e["data"]["type"] == "stored"]
    tokens = [t["token_id"] for d in stored for b in d["blocks"] for t in b["tokens"]]
    assert tokens[: len(prompt)] == prompt
    block = stored[0]["blocks"][0]
    assert block["type"] == "stored_block" and block["cache_level"] == 0
    assert block["tokens"][0] == {"type": "unique_token", "token_id": prompt[0], "token_extra_id": 0}
    assert httpx.post(f"{url}/kv_cache_events", timeout=5).json() == []  # drained
    # only trtllm-serve has the route: llama-server has no events at all
    assert httpx.post(f"{fleet.urls[0]}/kv_cache_events", timeout=5).status_code in (404, 405)


async def test_a_repeated_prefix_finds_its_blocks_on_the_trtllm_engine_that_cached_it(fleet: SimFleet) -> None:
    endpoints = [{"url": u, "engine": k} for u, k in zip(fleet.urls, KINDS, strict=True)]
    config = config_from_dict(
        {
            "models": [{"name": MODEL, "block_size": BLOCK, "endpoints": endpoints}],
            "engine_pulls": {"trtllm_kv_events_interval_s": 0.05},
        }
    )
    store = MemoryStore()
    trt, llama = fleet.endpoint_ids[1], fleet.endpoint_ids[0]
    prompt = token_prompt(1)
    keys = chain_block_keys(root_key(MODEL), prompt, BLOCK)
    async with Collector(config, store) as collector, httpx.AsyncClient(timeout=30) as client:
        assert set(collector.trtllm_pollers) == {trt}  # no events route is asked of llama.cpp
        for url in fleet.urls:  # the same prompt on both engines: only TRT-LLM says it cached it
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
            (await client.post(f"{url}/v1/completions", json=body)).raise_for_status()

        async def held() -> bool:
            return (await store.match_prefix(MODEL, keys)).get(trt) is not None

        await until(held, "the TRT-LLM engine's events to reach the store")
        match = await store.match_prefix(MODEL, keys)
        assert match[trt].blocks == len(keys) == 4
        assert llama not in match
        assert collector.stats()["events_applied"] >= 1
        # the second request on the same prefix was a cache hit on that engine, as the store predicted
        body = {"model": MODEL, "prompt": [*prompt, 7, 8, 9], "max_tokens": 1}
        usage = (await client.post(f"{fleet.urls[1]}/v1/completions", json=body)).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= len(keys) * BLOCK

        # a restarted trtllm-serve has an empty cache and says so ("created"): the store forgets what it held
        (await client.post(f"{fleet.urls[1]}/sim/fault", json={"kind": "restart"})).raise_for_status()

        async def forgotten() -> bool:
            return trt not in await store.match_prefix(MODEL, keys)

        await until(forgotten, "the restarted engine's blocks to leave the store")
        assert collector.trtllm_pollers[trt].stats.purges >= 1


def test_explain_calls_pulled_trtllm_events_kv_events_unless_pulling_is_off() -> None:
    endpoints = [{"url": "http://trt:8000", "engine": "trtllm"}, {"url": "http://llama:8080", "engine": "llamacpp"}]
    config = config_from_dict({"models": [{"name": MODEL, "endpoints": endpoints}]})
    trt, llama = config.models[0].endpoints
    assert "prefix KV events pulled from /kv_cache_events" in estimate_basis(trt, None, config.placement)
    assert "prefix routing history" in estimate_basis(llama, None, config.placement)
    off = config_from_dict(
        {"models": [{"name": MODEL, "endpoints": endpoints}], "engine_pulls": {"trtllm_kv_events": False}}
    )
    assert not reports_kv_events(off.models[0].endpoints[0], off.engine_pulls.trtllm_kv_events)
    assert Collector(off, MemoryStore()).trtllm_pollers == {}
