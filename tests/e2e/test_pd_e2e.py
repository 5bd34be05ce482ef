"""Prefill/decode disaggregation end to end: a simulated fleet of 2 prefill engines (h100), 2 decode engines (mac,
each behind ``cognitora pd-sidecar``) and 2 aggregated ones (mac), Redis, ``cognitora collector``, and both
gateways: Envoy (``examples/envoy.yaml`` + ``cognitora extproc``) on the 2 + 2 fleet, the LiteLLM proxy
(``examples/litellm_config.yaml``'s shape) on the mixed 2 + 2 + 2 fleet. The KV link has 10 Gb/s and 50 ms of
set-up per transfer (both in the sim and in cognitora.yaml), so the predicted cost decides clearly both ways:

- a long cold prompt is split: 1,900 tokens prefill in ~0.06 s on an h100 against ~1.6 s on a mac, and the
  transfer costs ~0.25 s;
- a short prompt, or a long one whose prefix a decode engine already holds, is placed whole: the transfer's
  set-up alone costs more than the mac's prefill of what is left.

What a client sees: a split answer is the answer an aggregated engine gives; its first token comes after the
modeled KV transfer; a repeated prefix comes back with ``cached_tokens``; a prefill engine dying between the two
steps, a decode engine refusing the transfer and a transfer timing out each cost one answer nothing (local
prefill), and every in-flight count returns to zero.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cognitora_sim.harness.disagg_launch import start_sidecars
from cognitora_sim.harness.envoy_launch import render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.redis_store import RedisStore
from kvstate.store import InFlight
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PD_EXAMPLE = ROOT / "examples" / "cognitora-pd.yaml"
LITELLM_EXAMPLE = ROOT / "examples" / "litellm_config.yaml"
TIME_SCALE = 5.0
LINK_GBPS = 10.0
LINK_LATENCY_S = 0.05
KV_BYTES_PER_TOKEN = 131072
PREFILL, DECODE, BOTH = (0, 1), (2, 3), (4, 5)
PROFILES = "h100,h100,mac,mac,mac,mac"
ROLES = "prefill,prefill,decode,decode,both,both"
RATE = {"h100": 30000.0, "mac": 1200.0}
"""Prefill priors (tokens/s), what the profiles measure, until the collector learns them."""


@dataclass
class World:
    fleet: SimFleet
    sidecars: list[str]
    """The decode engines' sidecars, in ``DECODE`` order."""
    redis_url: str
    key_prefix: str
    work: Path
    tokenizer: Path
    chat_template: Path

    def endpoint_url(self, i: int) -> str:
        return self.sidecars[DECODE.index(i)] if i in DECODE else self.fleet.urls[i]

    def example_config(self) -> dict[str, Any]:
        """examples/cognitora-pd.yaml with this fleet's ports, Redis, and this test's link and priors."""
        doc: dict[str, Any] = yaml.safe_load(PD_EXAMPLE.read_text())
        ours = self.config((*PREFILL, *DECODE))
        model = doc["models"][0]
        assert [e["role"] for e in model["endpoints"]] == ["prefill", "prefill", "decode", "decode"]
        for endpoint, mine in zip(model["endpoints"], ours["models"][0]["endpoints"], strict=True):
            endpoint.update(mine)
        model.update(tokenizer=str(self.tokenizer), chat_template=str(self.chat_template))
        doc["disaggregation"].update(ours["disaggregation"])
        return {**ours, "models": [model], "disaggregation": doc["disaggregation"]}

    def config(self, engines: tuple[int, ...]) -> dict[str, Any]:
        profiles = PROFILES.split(",")
        roles = ROLES.split(",")
        endpoints = [
            {
                "url": self.endpoint_url(i),
                "role": roles[i],
                "kv_events": self.fleet.events_addresses[i],
                "kv_events_replay": self.fleet.replay_addresses[i],
                "prefill_tokens_per_s": RATE[profiles[i]],
            }
            for i in engines
        ]
        return {
            "redis_url": self.redis_url,
            "key_prefix": self.key_prefix,
            "models": [
                {
                    "name": self.fleet.model,
                    "block_size": 16,
                    "tokenizer": str(self.tokenizer),
                    "chat_template": str(self.chat_template),
                    "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
                    "endpoints": endpoints,
                }
            ],
            "disaggregation": {"link_gbps": LINK_GBPS, "link_latency_s": LINK_LATENCY_S},
            "scrape": {"interval_s": 0.5, "timeout_s": 0.4},
            # 2 shared cores: Redis may answer late; power tie-breaking is not what this test is about.
            "placement": {"store_timeout_s": 2.0, "power_ttft_slack_s": 0.0, "power_ttft_slack_ratio": 0.0},
        }

    def split_count(self) -> int:
        return sum(httpx.get(f"{url}/sidecar/stats", timeout=5).json()["split"] for url in self.sidecars)

    def fallback_count(self) -> int:
        stats = [httpx.get(f"{url}/sidecar/stats", timeout=5).json() for url in self.sidecars]
        return sum(sum(s["fallbacks"].values()) for s in stats)

    def endpoint_ids(self) -> list[str]:
        return [self.endpoint_url(i).removeprefix("http://") for i in range(6)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, smollm2_dir: Path) -> Iterator[World]:
    work = tmp_path_factory.mktemp("pd-e2e")
    extra = ["--roles", ROLES, "--link-gbps", str(LINK_GBPS), "--link-latency-ms", str(LINK_LATENCY_S * 1000)]
    extra += ["--kv-transfer-timeout-s", "1"]
    with start_fleet(
        6,
        profile=PROFILES,
        time_scale=TIME_SCALE,
        tokenizer=smollm2_dir / "tokenizer.json",
        extra_args=extra,
        log_dir=work,
    ) as fleet:
        sidecar, urls = start_sidecars([fleet.urls[i] for i in DECODE], work, transfer_timeout_s=5.0)
        w = World(
            fleet,
            urls,
            redis_server_url,
            f"cogtest-pd-{random.randrange(1 << 30):x}",
            work,
            smollm2_dir / "tokenizer.json",
            smollm2_dir / "chat_template.jinja",
        )
        path = work / "cognitora-mixed.yaml"
        path.write_text(yaml.safe_dump(w.config((*PREFILL, *DECODE, *BOTH))))
        cli = [sys.executable, "-m", "cognitora.cli"]
        collector = ManagedProcess([*cli, "collector", "--config", str(path)], work / "collector.log", cwd=ROOT)
        try:
            yield w
        finally:
            collector.stop()
            sidecar.stop()


@pytest.fixture(scope="module")
def envoy_url(world: World) -> Iterator[str]:
    """Envoy on the 2 prefill + 2 decode fleet, configured by examples/cognitora-pd.yaml."""
    path = world.work / "cognitora-pd.yaml"
    path.write_text(yaml.safe_dump(world.example_config()))
    port, listen, admin = free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(path), "--listen", f"127.0.0.1:{port}"]
    extproc = ManagedProcess(argv, world.work / "extproc.log", cwd=ROOT)
    envoy = None
    try:
        wait_listening(port, extproc)
        engines = [world.endpoint_url(i).removeprefix("http://") for i in (*PREFILL, *DECODE)]
        text = render_config(
            listen_port=listen, admin_port=admin, extproc_port=port, engines=engines, expose_upstream_host=True
        )
        envoy = start_envoy(text, world.work / "envoy", admin)
        yield f"http://127.0.0.1:{listen}"
    finally:
        if envoy is not None:
            envoy.stop()
        extproc.stop()


def long_prompt(tag: str) -> str:
    """~1,900 tokens, distinct from the first words on."""
    rng = random.Random(tag)
    return f"Reference {tag}. " + " ".join(f"item{rng.randrange(100_000)}" for _ in range(300))


def body(system: str, question: str, stream: bool, max_tokens: int = 12) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": "smollm2",
        "max_tokens": max_tokens,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    if stream:
        b |= {"stream": True, "stream_options": {"include_usage": True}}
    return b


@dataclass
class Reply:
    status: int
    text: str
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    headers: httpx.Headers


async def ask(client: httpx.AsyncClient, url: str, b: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    started = time.monotonic()
    if not b.get("stream"):
        r = await client.post(url, json=b, headers=headers)
        if r.status_code != 200:
            return Reply(r.status_code, r.text, 0.0, 0, 0, r.headers)
        data = r.json()
        usage = data["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        content = data["choices"][0]["message"]["content"]
        return Reply(200, content, time.monotonic() - started, usage["prompt_tokens"], cached, r.headers)
    text, ttft, usage = "", 0.0, {}
    async with client.stream("POST", url, json=b, headers=headers) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and not ttft:
                    ttft = time.monotonic() - started
                text += piece
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return Reply(r.status_code, text, ttft, usage.get("prompt_tokens", 0), cached, r.headers)


async def whole_answer(world: World, b: dict[str, Any]) -> str:
    """What an aggregated engine answers (the simulated reply depends on the prompt alone, like greedy decoding)."""
    plain = {k: v for k, v in b.items() if k not in ("stream", "stream_options")}
    async with httpx.AsyncClient(timeout=60) as client:
        r = await ask(client, f"{world.fleet.urls[BOTH[0]]}/v1/chat/completions", plain)
    assert r.status == 200, r.text
    return r.text


def transfer_floor_s(prompt_tokens: int) -> float:
    """Wall seconds the sim spends moving a cold prompt's KV (its full blocks but the last token's) at this link."""
    moved = (prompt_tokens - 1) // 16 * 16
    return (LINK_LATENCY_S + moved * KV_BYTES_PER_TOKEN * 8 / (LINK_GBPS * 1e9)) / TIME_SCALE


async def wait_no_inflight(world: World) -> None:
    store = RedisStore.from_url(world.redis_url, key_prefix=world.key_prefix)
    ids = world.endpoint_ids()
    try:
        deadline = time.monotonic() + 15
        while (work := await store.inflight(ids)) != {e: InFlight() for e in ids}:
            assert time.monotonic() < deadline, f"in-flight work left after every answer came: {work}"
            await asyncio.sleep(0.05)
    finally:
        await store.close()


def test_envoy_splits_long_prompts_and_survives_pair_faults(world: World, envoy_url: str) -> None:
    asyncio.run(_envoy_checks(world, envoy_url))


async def _envoy_checks(world: World, envoy_url: str) -> None:
    url = f"{envoy_url}/v1/chat/completions"
    system = long_prompt(f"envoy-{secrets.token_hex(4)}")
    async with httpx.AsyncClient(timeout=60) as client:
        # 1. A cold long prompt: split, the answer an aggregated engine gives, the first token after the transfer.
        first = body(system, "What is item one?", stream=True)
        r = await ask(client, url, first)
        assert r.status == 200, r.text
        assert r.headers.get("x-cognitora-pd") == "split", dict(r.headers)
        assert r.headers.get("x-cognitora-upstream-host") in world.endpoint_ids()[2:4]
        assert r.text == await whole_answer(world, first)
        assert r.prompt_tokens > 1500
        assert r.ttft_s >= transfer_floor_s(r.prompt_tokens), (r.ttft_s, transfer_floor_s(r.prompt_tokens))
        # 2. The same prefix again: the decode engine holds it now (the transfer stored it there), so it is placed
        # whole there, and the hit is reported to the client.
        again = await ask(client, url, body(system, "And item two?", stream=False))
        assert again.status == 200, again.text
        assert again.headers.get("x-cognitora-pd") == "local", dict(again.headers)
        assert again.headers.get("x-cognitora-upstream-host") == r.headers.get("x-cognitora-upstream-host")
        assert again.cached_tokens >= again.prompt_tokens - 64, (again.cached_tokens, again.prompt_tokens)
        # A short prompt is placed whole too: the transfer's set-up costs more than prefilling it.
        short = await ask(client, url, body("Be brief.", "hi", stream=False, max_tokens=4))
        assert short.status == 200 and short.headers.get("x-cognitora-pd") == "local", dict(short.headers)

        # 3. Faults between the two steps: each client gets one answer (local prefill), never an error.
        before = world.fallback_count()
        for i in PREFILL:
            world.fleet.fault(i, "crash_after_prefill")
        crash = body(long_prompt(f"crash-{secrets.token_hex(4)}"), "q", stream=True)
        r = await ask(client, url, crash)
        assert r.status == 200 and r.headers.get("x-cognitora-pd") == "fallback", (r.status, dict(r.headers))
        assert r.text == await whole_answer(world, crash)
        for i in PREFILL:
            world.fleet.fault(i, "recover")
        for i in DECODE:
            world.fleet.fault(i, "reject_kv")
        refused = body(long_prompt(f"reject-{secrets.token_hex(4)}"), "q", stream=False)
        r = await ask(client, url, refused)
        assert r.status == 200 and r.headers.get("x-cognitora-pd") == "fallback", (r.status, r.text)
        assert "refused" in r.headers.get("x-cognitora-pd-fallback", "")
        assert r.text == await whole_answer(world, refused)
        for i in DECODE:
            world.fleet.fault(i, "recover")
        assert world.fallback_count() >= before + 2
        # 4. A client naming a prefill engine itself is not obeyed: the gateway drops its header.
        forged = body("short", "hi", stream=False, max_tokens=2)
        r = await ask(client, url, forged, headers={"x-cognitora-prefill-endpoint": "127.0.0.1:1"})
        assert r.status == 200, r.text
        assert "unreachable" not in r.headers.get("x-cognitora-pd-fallback", "")
    await wait_no_inflight(world)


# -- LiteLLM on the mixed fleet ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def litellm_url(world: World) -> Iterator[tuple[str, str]]:
    config = yaml.safe_load(LITELLM_EXAMPLE.read_text())
    cog = world.config((*PREFILL, *DECODE, *BOTH))
    template = next(d for d in config["model_list"] if d["model_info"].get("cognitora_engine"))
    deployments = []
    for n, endpoint in enumerate(cog["models"][0]["endpoints"]):
        dep = json.loads(json.dumps(template))
        dep["litellm_params"]["api_base"] = endpoint["url"] + "/v1"
        dep["model_info"] = {
            "id": f"engine-{n}",
            "cognitora_engine": "vllm",
            "cognitora_role": endpoint["role"],
            "cognitora_kv_events": endpoint["kv_events"],
            "cognitora_kv_events_replay": endpoint["kv_events_replay"],
            "cognitora_prefill_tokens_per_s": endpoint["prefill_tokens_per_s"],
        }
        deployments.append(dep)
    config["model_list"] = deployments
    args = config["router_settings"]["routing_strategy_args"]
    args["models"][0].update(tokenizer=str(world.tokenizer), kv_bytes_per_token=KV_BYTES_PER_TOKEN)
    args.update(
        redis_url=world.redis_url,
        key_prefix=world.key_prefix,
        scrape=cog["scrape"],
        placement=cog["placement"],
        disaggregation=cog["disaggregation"],
    )
    path = world.work / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with LiteLLMProxy(path, world.work, key_prefix="sk-pd-", ready_s=120) as proxy:
        yield proxy.url, proxy.key


def test_litellm_places_whole_or_split_by_cost_on_a_mixed_fleet(world: World, litellm_url: tuple[str, str]) -> None:
    asyncio.run(_litellm_checks(world, *litellm_url))


async def _litellm_checks(world: World, base: str, key: str) -> None:
    url, auth = f"{base}/v1/chat/completions", {"Authorization": f"Bearer {key}"}
    salt = secrets.token_hex(4)

    def lm(b: dict[str, Any]) -> dict[str, Any]:
        return {**b, "model": "chat"}

    async with httpx.AsyncClient(timeout=120) as client:
        # 1. Short prompts are placed whole (on an aggregated engine or a decode engine prefilling locally).
        splits = world.split_count()
        shorts = [body(f"Be brief, {salt} {i}.", "hi", stream=i % 2 == 0, max_tokens=4) for i in range(4)]
        replies = await asyncio.gather(*(ask(client, url, lm(b), auth) for b in shorts))
        assert [x.status for x in replies] == [200] * len(shorts), [x.text for x in replies]
        assert world.split_count() == splits
        # 2. Long cold prompts, several at once, streamed and not: each is split, answered as a whole engine would.
        longs = [body(long_prompt(f"lite-long-{salt}-{i}"), "q", stream=i % 2 == 0) for i in range(4)]
        replies = await asyncio.gather(*(ask(client, url, lm(b), auth) for b in longs))
        assert [x.status for x in replies] == [200] * len(longs), [x.text for x in replies if x.status != 200]
        assert world.split_count() == splits + len(longs)
        decode_urls = {u + "/v1" for u in world.sidecars}
        assert {x.headers.get("x-litellm-model-api-base") for x in replies} <= decode_urls
        for b, x in zip(longs, replies, strict=True):
            assert x.text == await whole_answer(world, b)
            assert x.ttft_s >= transfer_floor_s(x.prompt_tokens)
        # 3. Their prefixes again: whole on the decode engine that holds each now, with the hit reported.
        again = [body(b["messages"][0]["content"], "again?", stream=False) for b in longs]
        replies = await asyncio.gather(*(ask(client, url, lm(b), auth) for b in again))
        assert [x.status for x in replies] == [200] * len(again)
        assert world.split_count() == splits + len(longs)
        assert all(x.cached_tokens >= x.prompt_tokens - 64 for x in replies), [x.cached_tokens for x in replies]
        # 3. A transfer that times out (pulls from the prefill engines stall): one answer still, by local prefill.
        fallbacks = world.fallback_count()
        for i in PREFILL:
            world.fleet.fault(i, "stall_kv")
        try:
            stalled = [body(long_prompt(f"lite-stall-{salt}-{i}"), "q", stream=False) for i in range(2)]
            replies = await asyncio.gather(*(ask(client, url, lm(b), auth) for b in stalled))
            assert [x.status for x in replies] == [200] * len(stalled), [x.text for x in replies]
            for b, x in zip(stalled, replies, strict=True):
                assert x.text == await whole_answer(world, b)
        finally:
            for i in PREFILL:
                world.fleet.fault(i, "recover")
        assert world.fallback_count() == fallbacks + len(stalled)
    await wait_no_inflight(world)
