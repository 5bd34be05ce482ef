"""A real vLLM 0.32 (CPU) read by Cognitora's collector, without a gateway: its ``/metrics`` names, and its KV events
(BlockStored, BlockRemoved under eviction pressure, AllBlocksCleared after ``POST /reset_prefix_cache``) reaching
the store the gateways read. Also: the simulator serves no metric the real engine does not."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cognitora_sim.harness.process import ManagedProcess, wait_until
from cognitora_sim.harness.real_engines.launch import BLOCK_SIZE, KV_BLOCKS, MODEL, RealEngineFleet
from cognitora_sim.metrics import EngineMetrics
from tests.real_engines.stack import cached_on, cognitora_config, collector_stats, start_collector, vllm_upstreams
from tests.real_engines.traffic import engine_load, messages, system_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def chat(url: str, body: dict[str, object]) -> dict[str, object]:
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, object] = r.json()
    return out


def label_sets(text: str) -> dict[str, set[tuple[str, ...]]]:
    """Sample name -> the label names its series carry (buckets' ``le`` and ``_created`` samples left out)."""
    out: dict[str, set[tuple[str, ...]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith(("_bucket", "_created")):
                out.setdefault(sample.name, set()).add(tuple(sorted(k for k in sample.labels if k != "le")))
    return out


def test_the_scraper_reads_every_figure_vllm_032_serves(real_fleet: RealEngineFleet) -> None:
    url = real_fleet.urls[0]
    chat(url, {"messages": messages("metrics", 0), "max_tokens": 2})
    load = engine_load(url)
    missing = [name for name, value in vars(load).items() if value is None]
    # Only power (no GPU here: DCGM is not on a vLLM page) and a declared clock (the simulator's alone,
    # kvstate.engines.declared_clock) are absent; every engine figure is read under its real name.
    assert sorted(missing) == ["clock_rate", "energy_joules", "power_watts"], missing
    assert load.block_size == BLOCK_SIZE and load.kv_blocks == KV_BLOCKS, load
    assert load.requests_finished_total and load.ttft_count and load.prompt_tokens_total, load


def test_the_sim_serves_what_vllm_032_serves(real_fleet: RealEngineFleet) -> None:
    real = label_sets(httpx.get(f"{real_fleet.urls[0]}/metrics", timeout=10).text)
    sim_metrics = EngineMetrics(MODEL)
    sim_metrics.set_cache_config(BLOCK_SIZE, KV_BLOCKS, {"enable_prefix_caching": "True"})
    sim = label_sets(sim_metrics.exposition().decode())
    sim_vllm = {name: labels for name, labels in sim.items() if name.startswith("vllm:")}
    assert sorted(set(sim_vllm) - set(real)) == [], "the sim serves vLLM names vLLM 0.32 does not"
    for name, labels in sim_vllm.items():
        if name == "vllm:cache_config_info":  # an info gauge: the sim carries a subset of vLLM's many labels
            assert set(next(iter(labels))) <= set(next(iter(real[name]))), (labels, real[name])
        else:
            assert labels == real[name], (name, labels, real[name])


@dataclass
class Collected:
    config_path: Path
    collector: ManagedProcess


@pytest.fixture
def collected(real_fleet: RealEngineFleet, redis_server_url: str, tmp_path: Path) -> Iterator[Collected]:
    config_path = tmp_path / "cognitora.yaml"
    prefix = f"cogtest-real-events-{random.randrange(1 << 30):x}"
    config_path.write_text(yaml.safe_dump(cognitora_config(vllm_upstreams(real_fleet), redis_server_url, prefix)))
    collector = start_collector(config_path, tmp_path)
    try:
        yield Collected(config_path, collector)
    finally:
        collector.stop()


def test_kv_events_stored_removed_and_cleared_reach_the_store(
    real_fleet: RealEngineFleet, collected: Collected
) -> None:
    engine, other = real_fleet.engines
    config = collected.config_path
    held = messages("events-held", 0)
    next_question = messages("events-held", 1)
    chat(engine.url, {"messages": held, "max_tokens": 1})
    # BlockStored: the store says the engine holds the system prompt, the other engine nothing of it.
    wait_until(lambda: cached_on(config, MODEL, next_question, engine.endpoint_id) >= 512, 30, "BlockStored applied")
    assert cached_on(config, MODEL, next_question, other.endpoint_id) == 0

    # BlockRemoved: prompts of ~1,700 tokens, new to the engine, until more than its whole cache (128 blocks) has
    # been written since; vLLM evicts the least recently used free blocks, the held prompt's first.
    written = 0
    n = 0
    while written < KV_BLOCKS * BLOCK_SIZE + 512:
        reply = chat(
            engine.url, {"messages": [{"role": "user", "content": system_prompt(f"evict-{n}", 250)}], "max_tokens": 1}
        )
        written += int(reply["usage"]["prompt_tokens"])  # type: ignore[index]
        n += 1
    wait_until(lambda: cached_on(config, MODEL, next_question, engine.endpoint_id) == 0, 30, "BlockRemoved applied")
    wait_until(lambda: collector_stats(collected.collector).get("blocks_removed", 0) > 0, 10, "blocks_removed counted")

    # AllBlocksCleared: a prompt held again, then the engine's cache reset (dev mode): the endpoint is purged.
    cleared = messages("events-cleared", 0)
    chat(engine.url, {"messages": cleared, "max_tokens": 1})
    again = messages("events-cleared", 1)
    wait_until(lambda: cached_on(config, MODEL, again, engine.endpoint_id) >= 512, 30, "BlockStored applied")
    reset = httpx.post(f"{engine.url}/reset_prefix_cache", timeout=30)
    assert reset.status_code == 200, reset.text
    # vLLM queues AllBlocksCleared and publishes it with its next scheduling step: a request makes that step.
    chat(engine.url, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    wait_until(lambda: cached_on(config, MODEL, again, engine.endpoint_id) == 0, 30, "AllBlocksCleared applied")
    assert "engine cleared its cache (AllBlocksCleared)" in collected.collector.log_tail(400)


def test_kv_event_sources_are_discovered_from_the_engine(
    real_fleet: RealEngineFleet, redis_server_url: str, tmp_path: Path
) -> None:
    """No ``kv_events`` in the config: the collector reads each engine's ``GET /kv_event_sources`` and subscribes."""
    prefix = f"cogtest-real-disc-{random.randrange(1 << 30):x}"
    config = cognitora_config(vllm_upstreams(real_fleet, kv_events=False), redis_server_url, prefix)
    config["engine_pulls"] = {"vllm_kv_event_sources_interval_s": 0.5}
    config_path = tmp_path / "cognitora.yaml"
    config_path.write_text(yaml.safe_dump(config))
    collector = start_collector(config_path, tmp_path)
    try:
        wait_until(
            lambda: collector.log_tail(400).count("KV event sources discovered") == len(real_fleet.engines),
            30,
            "both engines' event sources discovered",
        )
        engine = real_fleet.engines[1]
        assert f'"publisher": "{engine.events_address}"' in collector.log_tail(400)
        chat(engine.url, {"messages": messages("discovered", 0), "max_tokens": 1})
        wait_until(
            lambda: cached_on(config_path, MODEL, messages("discovered", 1), engine.endpoint_id) >= 512,
            30,
            "the engine's blocks in the store, from the discovered stream",
        )
    finally:
        collector.stop()
