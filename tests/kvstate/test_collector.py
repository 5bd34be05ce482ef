"""``cognitora collector`` as users run it: a real process, real Redis, real ZMQ events, real HTTP metrics."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from cognitora.collector import Collector, CollectorThread, scrape_targets
from cognitora.config import config_from_dict
from cognitora.jsonlog import JsonFormatter, mask_secrets
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import start_fleet
from kvstate.keys import chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer, PromptKeyer
from kvstate.redis_store import RedisStore
from kvstate.store import Store
from tests.conftest import ROOT
from tests.kvstate.test_scrape import Counters, FakeEngine, vllm_page

MODEL = "m"
BLOCK = 16
TOKENS = list(range(100, 100 + 2 * BLOCK))  # two full blocks


async def eventually(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await condition():
                return
        except Exception:  # the store or the process is not there yet: keep waiting until the deadline
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


async def exited(proc: ManagedProcess, timeout_s: float) -> int:
    """The process's exit code, awaited without blocking the event loop (the test's own HTTP engine lives on it)."""
    await eventually(lambda: _true(not proc.alive()), timeout_s, f"{proc.argv[2:5]} to exit")
    code = proc.proc.returncode
    assert code is not None
    return code


async def _true(value: bool) -> bool:
    return value


class EventPublisher:
    """The engine side of vLLM's KV-event stream: 3-frame ``[topic, seq, msgpack]`` messages on a PUB socket.

    An XPUB (a PUB on the wire) so the test can wait for the collector's subscription instead of losing the first
    messages to ZMQ's slow-joiner window."""

    def __init__(self) -> None:
        self.port = free_port()
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.seq = 0

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def wait_subscribed(self, timeout_s: float) -> None:
        if not await self.sock.poll(int(timeout_s * 1000)):
            raise AssertionError(f"no subscriber connected to {self.address} within {timeout_s}s")
        await self.sock.recv()

    async def publish(self, events: list[dict[str, Any]]) -> None:
        payload = msgpack.packb([time.time(), events, None])
        await self.sock.send_multipart([b"", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BLOCK,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def our_keys() -> list[int]:
    return chain_block_keys(root_key(MODEL), TOKENS, BLOCK)


async def held_blocks(store: Store, endpoint: str) -> int:
    match = await store.match_prefix(MODEL, our_keys())
    return match[endpoint].blocks if endpoint in match else 0


def config_data(redis_url: str | None, key_prefix: str, http_url: str, kv_events: str | None) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"url": http_url, "id": "ep1", "engine": "vllm"}
    if kv_events is not None:
        endpoint["kv_events"] = kv_events
    data: dict[str, Any] = {
        "key_prefix": key_prefix,
        "models": [{"name": MODEL, "block_size": BLOCK, "endpoints": [endpoint]}],
        "scrape": {"interval_s": 0.2, "timeout_s": 0.2},
    }
    if redis_url is not None:
        data["redis_url"] = redis_url
    return data


def start_collector(tmp_path: Path, data: dict[str, Any], *extra: str) -> ManagedProcess:
    config = tmp_path / "cognitora.yaml"
    config.write_text(json.dumps(data))  # JSON is YAML
    argv = [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(config), *extra]
    return ManagedProcess(argv, tmp_path / "collector.log", cwd=ROOT)


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line must be one JSON object
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= set(record), record
    return records


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine(vllm_page)
    fake.counters = Counters(running=3, waiting=1, kv_usage=0.4, watts=200.0, millijoules=9_000_000)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def publisher() -> Iterator[EventPublisher]:
    pub = EventPublisher()
    yield pub
    pub.close()


@pytest.mark.e2e
async def test_collector_process_feeds_redis_and_stops_on_sigterm(
    tmp_path: Path,
    redis_server_url: str,
    key_prefix: str,
    engine: FakeEngine,
    publisher: EventPublisher,
) -> None:
    data = config_data(redis_server_url, key_prefix, engine.url, publisher.address)
    store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
    probes = f"http://127.0.0.1:{free_port()}"
    proc = start_collector(tmp_path, data, "--stats-interval-s", "0.3", "--metrics-listen", probes[7:])
    try:
        await publisher.wait_subscribed(timeout_s=30)
        await publisher.publish([stored([11, 12], None, TOKENS)])
        await eventually(lambda: _equals(held_blocks(store, "ep1"), 2), 10, "both blocks in Redis")
        await publisher.publish([removed([12])])
        await eventually(lambda: _equals(held_blocks(store, "ep1"), 1), 10, "the evicted block gone from Redis")

        async def snapshot_landed() -> bool:
            snap = (await store.snapshots(["ep1"])).get("ep1")
            return snap is not None and snap.healthy and snap.running == 3

        await eventually(snapshot_landed, 10, "the endpoint's snapshot in Redis")
        # Ready: the store answers, the KV-event stream is subscribed, a scrape found the engine healthy.
        async with httpx.AsyncClient(base_url=probes, timeout=5) as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready", "checks": {"store": "ok", "kv_events": "ok", "scrapes": "ok"}}
        snap = (await store.snapshots(["ep1"]))["ep1"]
        assert (snap.waiting, snap.kv_usage, snap.power_watts, snap.energy_joules) == (1, 0.4, 200.0, 9000.0)

        await eventually(lambda: _stats_logged(tmp_path / "collector.log"), 10, "a stats line with events applied")
        proc.signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        returncode = await exited(proc, timeout_s=5)
        took = time.monotonic() - stopped_at
    finally:
        proc.stop()
        await store.close()
    assert returncode == 0, proc.log_tail()
    assert took < 5
    records = json_lines(tmp_path / "collector.log")
    messages = [r["msg"] for r in records]
    assert "collector started" in messages and "collector stopped" in messages
    stats = [r for r in records if r["msg"] == "collector stats"][-1]
    assert stats["events_applied"] >= 2 and stats["blocks_stored"] == 2 and stats["blocks_removed"] == 1
    assert stats["blocks_tracked"] == 1  # what the engine still caches, not what it ever cached
    assert stats["scrape_rounds"] > 0 and stats["healthy_endpoints"] == 1


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def _stats_logged(path: Path) -> bool:
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("msg") == "collector stats" and record.get("events_applied", 0) >= 2:
            return True
    return False


@pytest.mark.e2e
async def test_redis_down_at_start_password_never_logged_and_sigint_exits_zero(
    tmp_path: Path, key_prefix: str, engine: FakeEngine
) -> None:
    secret = "s3cr3t-pw"
    dead_redis = f"redis://:{secret}@127.0.0.1:{free_port()}/0"
    probes = f"http://127.0.0.1:{free_port()}"
    data = config_data(dead_redis, key_prefix, engine.url, None)
    proc = start_collector(tmp_path, data, "--stats-interval-s", "0.3", "--metrics-listen", probes[7:])
    log_path = tmp_path / "collector.log"
    try:

        async def scraping_through_the_outage() -> bool:
            stats = [json.loads(line) for line in log_path.read_text().splitlines() if '"collector stats"' in line]
            return any(r["scrape_store_failures"] >= 3 for r in stats)

        await eventually(scraping_through_the_outage, 30, "several failed snapshot writes in a stats line")
        assert proc.alive(), proc.log_tail()
        # Alive, not ready: /readyz says the store is the reason, and never shows the password.
        async with httpx.AsyncClient(base_url=probes, timeout=5) as client:
            assert (await client.get("/healthz")).status_code == 200
            ready = await client.get("/readyz")
        assert ready.status_code == 503, ready.text
        checks = ready.json()["checks"]
        assert checks["store"].startswith("the store did not answer") and checks["scrapes"] == "ok", checks
        assert secret not in ready.text
        proc.signal(signal.SIGINT)
        returncode = await exited(proc, timeout_s=5)
    finally:
        proc.stop()
    assert returncode == 0, proc.log_tail()
    text = log_path.read_text()
    assert secret not in text
    records = json_lines(log_path)
    outages = [r for r in records if r["msg"] == "store unavailable; still scraping"]
    assert len(outages) == 1  # logged once per outage, however many snapshot writes failed
    assert any("****" in json.dumps(r) for r in records)


def test_config_without_redis_is_refused_with_a_clear_message(tmp_path: Path, key_prefix: str) -> None:
    data = config_data(None, key_prefix, "http://127.0.0.1:9", None)
    config = tmp_path / "cognitora.yaml"
    config.write_text(json.dumps(data))
    argv = [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(config)]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    record = json.loads(result.stderr.strip().splitlines()[-1])
    assert record["level"] == "ERROR" and "needs redis_url" in record["msg"]


def test_bad_config_file_is_refused_with_the_key_path(tmp_path: Path) -> None:
    config = tmp_path / "cognitora.yaml"
    config.write_text("models:\n  - name: m\n    endpoints:\n      - url: not-a-url\n")
    argv = [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(config)]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    record = json.loads(result.stderr.strip().splitlines()[-1])
    assert "models[0].endpoints[0].url" in record["msg"]


async def test_embedded_collector_with_a_memory_store(engine: FakeEngine, publisher: EventPublisher) -> None:
    store = MemoryStore()
    config = config_from_dict(config_data(None, "unused", engine.url, publisher.address))
    async with Collector(config, store) as collector:
        await publisher.wait_subscribed(timeout_s=10)
        await publisher.publish([stored([21, 22], None, TOKENS)])
        await eventually(lambda: _equals(held_blocks(store, "ep1"), 2), 10, "blocks in the memory store")

        async def healthy() -> bool:
            snap = (await store.snapshots()).get("ep1")
            return snap is not None and snap.healthy

        await eventually(healthy, 10, "a healthy snapshot")
        assert collector.stats()["events_applied"] == 1


def test_only_endpoints_whose_kv_events_feed_the_store_have_their_blocks_counted() -> None:
    def counted(pulls: dict[str, bool]) -> dict[str, bool]:
        endpoints = [
            {"url": "http://10.0.0.1:8000", "engine": "vllm", "kv_events": "tcp://10.0.0.1:5557"},
            {"url": "http://10.0.0.2:8000", "engine": "vllm"},  # its streams are discovered
            {"url": "http://10.0.0.3:8000", "engine": "trtllm"},  # its events are pulled
            {"url": "http://10.0.0.4:8000", "engine": "llamacpp"},  # no events: a count of 0 would read as empty
        ]
        config = config_from_dict(
            {"models": [{"name": MODEL, "block_size": BLOCK, "endpoints": endpoints}], "engine_pulls": pulls}
        )
        return {t.endpoint_id: t.counts_blocks for t in scrape_targets(config)}

    assert counted({}) == {"10.0.0.1:8000": True, "10.0.0.2:8000": True, "10.0.0.3:8000": True, "10.0.0.4:8000": False}
    off = counted({"vllm_kv_event_sources": False, "trtllm_kv_events": False})
    assert off == {"10.0.0.1:8000": True, "10.0.0.2:8000": False, "10.0.0.3:8000": False, "10.0.0.4:8000": False}


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_snapshots_carry_the_count_of_blocks_the_kv_events_left(
    engine: FakeEngine, publisher: EventPublisher, backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    # What the tie-break's load bound reads (placement.tie_cache_bound): BlockStored, BlockRemoved and
    # AllBlocksCleared move the count, and the next scrape's snapshot carries it.
    redis_url = request.getfixturevalue("redis_server_url") if backend == "redis" else None
    store: Store = MemoryStore() if redis_url is None else RedisStore.from_url(redis_url, key_prefix=key_prefix)
    config = config_from_dict(config_data(redis_url, key_prefix, engine.url, publisher.address))

    async def counted(blocks: int) -> bool:
        snap = (await store.snapshots()).get("ep1")
        return snap is not None and snap.cached_blocks == blocks

    try:
        async with Collector(config, store):
            await publisher.wait_subscribed(timeout_s=10)
            await eventually(lambda: counted(0), 10, "a snapshot counting no blocks")
            await publisher.publish([stored([21, 22], None, TOKENS)])
            await eventually(lambda: counted(2), 10, "a snapshot counting the 2 stored blocks")
            await publisher.publish([removed([22])])
            await eventually(lambda: counted(1), 10, "a snapshot counting 1 block after BlockRemoved")
            await publisher.publish([{"type": "AllBlocksCleared"}])
            await eventually(lambda: counted(0), 10, "a snapshot counting no blocks after AllBlocksCleared")
    finally:
        if isinstance(store, RedisStore):
            await store.delete_everything()
        await store.close()


@pytest.mark.e2e
async def test_collector_with_the_simulated_fleet(
    tmp_path: Path, redis_server_url: str, key_prefix: str, smollm2_dir: Path
) -> None:
    tokenizer = smollm2_dir / "tokenizer.json"
    fleet = start_fleet(2, model="smollm2", time_scale=20, tokenizer=tokenizer, log_dir=tmp_path)
    endpoints = [
        {"url": url, "id": eid, "engine": "vllm", "kv_events": pub, "kv_events_replay": replay}
        for url, eid, pub, replay in zip(
            fleet.urls, fleet.endpoint_ids, fleet.events_addresses, fleet.replay_addresses, strict=True
        )
    ]
    data = {
        "redis_url": redis_server_url,
        "key_prefix": key_prefix,
        "models": [{"name": "smollm2", "block_size": BLOCK, "tokenizer": str(tokenizer), "endpoints": endpoints}],
        "scrape": {"interval_s": 0.2, "timeout_s": 0.2},
    }
    store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
    proc = start_collector(tmp_path, data, "--stats-interval-s", "0.5")
    first, second = fleet.endpoint_ids
    try:

        async def both_healthy() -> bool:
            snaps = await store.snapshots(fleet.endpoint_ids)
            return all(e in snaps and snaps[e].healthy for e in fleet.endpoint_ids)

        await eventually(both_healthy, 30, "healthy snapshots of both simulated engines")

        messages = [
            {"role": "system", "content": "You are a careful assistant. " * 40},
            {"role": "user", "content": "Name three prime numbers."},
        ]
        keys = PromptKeyer("smollm2", BLOCK, ChatTokenizer(tokenizer)).keys_for_chat(messages).keys
        assert len(keys) >= 10
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{fleet.urls[0]}/v1/chat/completions",
                json={"model": "smollm2", "messages": messages, "max_tokens": 4},
            )
        assert response.status_code == 200, response.text

        async def prompt_cached_on_first_only() -> bool:
            match = await store.match_prefix("smollm2", keys)
            return first in match and match[first].blocks == len(keys) and second not in match

        await eventually(prompt_cached_on_first_only, 15, "the prompt's blocks on the engine that served it")

        async def tokens_counted() -> bool:
            snap = (await store.snapshots([first]))[first]
            return (snap.prompt_tokens_total or 0) >= len(keys) * BLOCK and snap.energy_joules > 0

        await eventually(tokens_counted, 10, "the served prompt in the scraped counters")

        fleet.fault(1, "crash")

        async def second_unhealthy() -> bool:
            return not (await store.snapshots([second]))[second].healthy

        await eventually(second_unhealthy, 5, "the crashed engine marked unhealthy")
        proc.signal(signal.SIGTERM)
        returncode = await exited(proc, timeout_s=5)
    finally:
        proc.stop()
        fleet.stop()
        await store.close()
    assert returncode == 0, proc.log_tail()
    json_lines(tmp_path / "collector.log")


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("redis://:hunter2@10.0.0.1:6379/0", "redis://:****@10.0.0.1:6379/0"),
        ("connecting to rediss://app:p%40ss@host/1 now", "connecting to rediss://app:****@host/1 now"),
        ("redis://10.0.0.1:6379/0", "redis://10.0.0.1:6379/0"),
        ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics"),
    ],
)
def test_passwords_in_urls_are_masked(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked


def test_log_fields_with_secrets_and_non_finite_numbers_stay_valid_json() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("cognitora.test_jsonlog")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        logger.warning("store at %s", "redis://:pw@h:1/0", extra={"url": "redis://u:pw@h/0", "rate": float("nan")})
    finally:
        logger.removeHandler(handler)
    record = json.loads(stream.getvalue())
    assert record["msg"] == "store at redis://:****@h:1/0"
    assert record["url"] == "redis://u:****@h/0" and record["rate"] == "nan"
    assert record["level"] == "WARNING" and record["logger"] == "cognitora.test_jsonlog"


@pytest.mark.e2e
async def test_collector_thread_keeps_the_store_fresh_while_the_gateway_loop_is_busy(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    # A gateway's loop busy with its own requests must not starve the embedded collector: here the loop is blocked
    # outright (synchronous waits), and scrapes and KV events must still reach the store.
    tokenizer = smollm2_dir / "tokenizer.json"
    fleet = start_fleet(1, model="smollm2", time_scale=20, tokenizer=tokenizer, log_dir=tmp_path)
    endpoint = {
        "url": fleet.urls[0],
        "id": "ep1",
        "engine": "vllm",
        "kv_events": fleet.events_addresses[0],
        "kv_events_replay": fleet.replay_addresses[0],
    }
    config = config_from_dict(
        {
            "models": [{"name": "smollm2", "block_size": BLOCK, "tokenizer": str(tokenizer), "endpoints": [endpoint]}],
            "scrape": {"interval_s": 0.2, "timeout_s": 0.2},
        }
    )
    store = MemoryStore()
    thread = CollectorThread(config, store)
    await thread.start()
    try:
        rounds = thread.stats()["scrape_rounds"]
        wait_until(lambda: thread.stats()["scrape_rounds"] >= rounds + 3, 10, "scrape rounds while the loop is busy")
        wait_until(lambda: thread.stats()["healthy_endpoints"] == 1, 10, "the engine healthy while the loop is busy")

        messages = [
            {"role": "system", "content": "You are a careful assistant. " * 40},
            {"role": "user", "content": "Name three prime numbers."},
        ]
        keys = PromptKeyer("smollm2", BLOCK, ChatTokenizer(tokenizer)).keys_for_chat(messages).keys
        response = httpx.post(
            f"{fleet.urls[0]}/v1/chat/completions",
            json={"model": "smollm2", "messages": messages, "max_tokens": 4},
            timeout=30,
        )
        assert response.status_code == 200, response.text

        def prompt_cached() -> bool:
            # the store's coroutines never suspend: run one to completion without the (blocked) loop
            coro = store.match_prefix("smollm2", keys)
            try:
                coro.send(None)
            except StopIteration as done:
                match = done.value
                return "ep1" in match and match["ep1"].blocks == len(keys)
            raise AssertionError("MemoryStore.match_prefix suspended")

        wait_until(prompt_cached, 15, "the prompt's KV events in the store while the loop is busy")
    finally:
        await thread.stop()
        fleet.stop()


async def test_a_collector_thread_stops_before_its_stop_returns_even_when_its_owner_is_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An owner cancelled while stopping its collector (a test's loop torn down, a drain cut short) left the
    collector's thread running: its stop went on there, or not, and logged "collector stopped" after the owner was
    gone (CI printed "--- Logging error ---": the test's captured stream was closed by then). The stop finishes,
    and the thread is joined, before the owner's stop returns or raises."""
    config = config_from_dict(config_data(None, "cogtest", "http://127.0.0.1:1", None))
    thread = CollectorThread(config, MemoryStore())
    await thread.start()
    caplog.set_level(logging.INFO, logger="cognitora.collector")
    stopping = asyncio.create_task(thread.stop())
    await asyncio.sleep(0)  # the stop has begun: it waits on the collector's own loop
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not thread.alive
    assert "collector stopped" in [r.getMessage() for r in caplog.records]


async def test_two_stops_of_a_collector_thread_at_once_both_return_once_it_ended() -> None:
    thread = CollectorThread(config_from_dict(config_data(None, "cogtest", "http://127.0.0.1:1", None)), MemoryStore())
    await thread.start()
    await asyncio.wait_for(asyncio.gather(thread.stop(), thread.stop()), 15)
    assert not thread.alive
    thread.stop_blocking()  # and once more, after: nothing to do


async def test_collector_thread_refuses_a_redis_store(redis_server_url: str, key_prefix: str) -> None:
    config = config_from_dict(config_data(redis_server_url, key_prefix, "http://127.0.0.1:1", None))
    store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
    try:
        with pytest.raises(TypeError, match="cognitora collector"):
            CollectorThread(config, store)
    finally:
        await store.close()
