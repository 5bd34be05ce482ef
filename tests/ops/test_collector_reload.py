"""``cognitora collector`` reloads its config without a restart (``cognitora.ops.collector_reload``): a real process,
real Redis, real ZMQ events, real HTTP engines. SIGHUP adds an endpoint, which is scraped at once, while the KV
event stream of the endpoint that did not change keeps running (its blocks stay: a new subscriber would have purged
them); a broken file and a changed store are refused and the collector keeps collecting on the old config; an edit
seen by the file watch removes an endpoint."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kvstate.redis_store import RedisStore
from tests.kvstate.test_collector import (
    EventPublisher,
    config_data,
    engine,  # noqa: F401  (the fixture)
    eventually,
    exited,
    held_blocks,
    json_lines,
    publisher,  # noqa: F401  (the fixture)
    start_collector,
    stored,
)
from tests.kvstate.test_scrape import Counters, FakeEngine, vllm_page

pytestmark = pytest.mark.e2e


@pytest.fixture
async def second_engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine(vllm_page)
    fake.counters = Counters(running=7, waiting=0, kv_usage=0.1)
    await fake.start()
    yield fake
    await fake.stop()


def messages(log: Path, text: str) -> list[dict[str, Any]]:
    return [r for r in json_lines(log) if text in r["msg"]]


async def test_sighup_and_file_edits_reload_the_endpoints_keeping_unchanged_streams_and_refusing_bad_files(
    tmp_path: Path,
    redis_server_url: str,
    key_prefix: str,
    engine: FakeEngine,  # noqa: F811
    second_engine: FakeEngine,
    publisher: EventPublisher,  # noqa: F811
) -> None:
    first = config_data(redis_server_url, key_prefix, engine.url, publisher.address)
    config = tmp_path / "cognitora.yaml"
    log = tmp_path / "collector.log"
    store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
    # SIGHUP alone first (the watch off: it would race the signal to the same edit), then the watch alone.
    proc = start_collector(tmp_path, first, "--stats-interval-s", "0.3", "--watch-config-s", "0")
    try:
        await publisher.wait_subscribed(timeout_s=30)
        await publisher.publish([stored([11, 12], None, [*range(100, 132)])])
        await eventually(lambda: _is(held_blocks(store, "ep1"), 2), 10, "ep1's blocks in Redis")

        # 1. SIGHUP with a second endpoint added: scraped at once; ep1's stream kept (its blocks stay).
        both = json.loads(json.dumps(first))
        both["models"][0]["endpoints"].append({"url": second_engine.url, "id": "ep2", "engine": "vllm"})
        config.write_text(json.dumps(both))
        proc.signal(signal.SIGHUP)

        async def ep2_scraped() -> bool:
            snap = (await store.snapshots(["ep2"])).get("ep2")
            return snap is not None and snap.healthy and snap.running == 7

        await eventually(ep2_scraped, 10, "the added endpoint's snapshot in Redis")
        reloaded = messages(log, "config reloaded (SIGHUP)")
        assert [r["changed"] for r in reloaded] == [["models"]], reloaded
        kept = messages(log, "kept running across the reload")[-1]["kept"]
        assert "kv events ep1" in kept and "scraper" not in kept, kept
        assert await held_blocks(store, "ep1") == 2
        await publisher.publish([stored([13], 12, [*range(132, 148)])])  # the kept stream still applies events
        await eventually(_stats(log, lambda s: s["events_applied"] >= 2 and s["endpoints"] == 2), 10, "stats")

        # 2. A broken file, then a changed store: refused, the old config stays, collecting goes on.
        config.write_text("models: [")
        proc.signal(signal.SIGHUP)
        await eventually(_logged(log, "config reload refused (SIGHUP)", 1), 10, "a refusal")
        moved = json.loads(json.dumps(both))
        moved["key_prefix"] = key_prefix + "-other"
        config.write_text(json.dumps(moved))
        proc.signal(signal.SIGHUP)
        await eventually(_logged(log, "config reload refused", 2), 10, "the second refusal")
        refusals = messages(log, "config reload refused")
        assert "cognitora.yaml" in refusals[0]["msg"] and "restart" in refusals[1]["msg"], refusals
        assert proc.alive()
        rounds = _last_stats(log)["scrape_rounds"]
        await eventually(_stats(log, lambda s: s["scrape_rounds"] > rounds + 2), 10, "scrapes after the refusals")

        proc.signal(signal.SIGTERM)
        assert await exited(proc, timeout_s=15) == 0, proc.log_tail()

        # 3. The file watch: ep1 removed, ep2 alone remains.
        log = tmp_path / "watched" / "collector.log"
        log.parent.mkdir()
        proc = start_collector(log.parent, both, "--stats-interval-s", "0.3", "--watch-config-s", "0.2")
        await eventually(_stats(log, lambda s: s["endpoints"] == 2), 20, "the watched collector's stats")
        config = log.parent / "cognitora.yaml"
        only_second = json.loads(json.dumps(both))
        only_second["models"][0]["endpoints"] = [both["models"][0]["endpoints"][1]]
        config.write_text(json.dumps(only_second))
        await eventually(
            _logged(log, "config reloaded (the config file changed): changed: models", 1), 10, "the watched reload"
        )
        await eventually(_stats(log, lambda s: s["endpoints"] == 1), 10, "one endpoint collected")

        proc.signal(signal.SIGTERM)
        assert await exited(proc, timeout_s=15) == 0, proc.log_tail()
    finally:
        proc.stop()
        await store.close()


async def _is(value: Any, expected: int) -> bool:
    return bool(await value == expected)


def _last_stats(log: Path) -> dict[str, Any]:
    return [r for r in json_lines(log) if r["msg"] == "collector stats"][-1]


def _stats(log: Path, condition: Any) -> Any:
    async def check() -> bool:
        return bool(condition(_last_stats(log)))

    return check


def _logged(log: Path, text: str, times: int) -> Any:
    async def check() -> bool:
        return len(messages(log, text)) >= times

    return check
