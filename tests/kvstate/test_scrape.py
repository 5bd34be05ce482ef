"""The scraper against real HTTP servers speaking vLLM's and SGLang's metric names."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from cognitora_sim.harness.process import free_port
from cognitora_sim.launch import start_fleet
from kvstate.engines import EngineLoad
from kvstate.memory_store import MemoryStore
from kvstate.rates import RateEstimator
from kvstate.redis_store import RedisStore
from kvstate.scrape import Scraper, ScrapeTarget, base_url
from tests.support.engine_loads import short_prompts_finished


@dataclass
class Counters:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prompt: float = 0.0
    hits: float = 0.0
    generation: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0
    watts: float = 0.0
    millijoules: float = 0.0
    finished: float = 0.0
    service_sum: float = 0.0
    service_count: float = 0.0


def vllm_page(c: Counters) -> str:
    labels = '{model_name="m",engine="0"}'
    return f"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{labels} {c.running}
vllm:num_requests_waiting{labels} {c.waiting}
vllm:kv_cache_usage_perc{labels} {c.kv_usage}
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{labels} {c.prompt}
vllm:generation_tokens_total{labels} {c.generation}
vllm:prefix_cache_hits_total{labels} {c.hits}
vllm:prefix_cache_queries_total{labels} {c.prompt}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{model_name="m",engine="0",le="+Inf"}} {c.ttft_count}
vllm:time_to_first_token_seconds_sum{labels} {c.ttft_sum}
vllm:time_to_first_token_seconds_count{labels} {c.ttft_count}
vllm:inter_token_latency_seconds_sum{labels} {c.itl_sum}
vllm:inter_token_latency_seconds_count{labels} {c.itl_count}
vllm:request_success_total{{model_name="m",finished_reason="length"}} {c.finished}
vllm:request_inference_time_seconds_sum{labels} {c.service_sum}
vllm:request_inference_time_seconds_count{labels} {c.service_count}
vllm:cache_config_info{{block_size="16",num_gpu_blocks="2048"}} 1
DCGM_FI_DEV_POWER_USAGE{{gpu="0"}} {c.watts}
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total{{gpu="0"}} {c.millijoules}
"""


def sglang_page(c: Counters) -> str:
    return f"""sglang:num_running_reqs{{model_name="m"}} {c.running}
sglang:num_queue_reqs{{model_name="m"}} {c.waiting}
sglang:token_usage{{model_name="m"}} {c.kv_usage}
sglang:prompt_tokens_total{{model_name="m"}} {c.prompt}
sglang:cached_tokens_total{{model_name="m"}} {c.hits}
sglang:generation_tokens_total{{model_name="m"}} {c.generation}
sglang:time_to_first_token_seconds_sum{{model_name="m"}} {c.ttft_sum}
sglang:time_to_first_token_seconds_count{{model_name="m"}} {c.ttft_count}
sglang:cache_config_info{{model_name="m",page_size="1",num_pages="50000"}} 1
"""


class FakeEngine:
    """A real HTTP server on a free port with /health and /metrics the test controls; can stop and restart."""

    def __init__(self, page: Callable[[Counters], str]) -> None:
        self.port = free_port()
        self.page = page
        self.counters = Counters()
        self.health_status = 200
        self.garbage = False
        self.hung = asyncio.Event()
        """While set, /health accepts requests and answers none until cleared (a hung engine)."""
        self._answer = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _health(self, request: web.Request) -> web.Response:
        if self.hung.is_set():
            await self._answer.wait()
        return web.json_response({"status": "ok"}, status=self.health_status)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.garbage:
            return web.Response(text="<html><body>upstream sent garbage</body></html>", content_type="text/html")
        return web.Response(text=self.page(self.counters), content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    def unhang(self) -> None:
        self.hung.clear()
        self._answer.set()
        self._answer = asyncio.Event()

    async def stop(self) -> None:
        self.unhang()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def eventually(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Await ``condition`` until true; return the seconds it took; fail naming ``what`` after ``timeout_s``."""
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
async def vllm_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(vllm_page)
    await engine.start()
    yield engine
    await engine.stop()


@pytest.fixture
async def sglang_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(sglang_page)
    await engine.start()
    yield engine
    await engine.stop()


async def test_vllm_snapshot_lands_in_store(vllm_engine: FakeEngine) -> None:
    vllm_engine.counters = Counters(running=3, waiting=2, kv_usage=0.5, watts=250.0, millijoules=1_234_567)
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e1", vllm_engine.url, "vllm")], interval_s=1.0)
    before = time.time()
    await scraper.scrape_all()
    await scraper.stop()
    snap = (await store.snapshots())["e1"]
    assert snap.healthy and snap.last_seen >= before
    assert (snap.running, snap.waiting, snap.kv_usage, snap.block_size) == (3, 2, 0.5, 16)
    assert snap.power_watts == 250.0
    assert snap.energy_joules == pytest.approx(1234.567)
    assert snap.prefill_tokens_per_s == 0.0  # nothing learned from a single scrape


async def test_sglang_snapshot_lands_in_redis(
    sglang_engine: FakeEngine, redis_server_url: str, key_prefix: str
) -> None:
    sglang_engine.counters = Counters(running=5, waiting=7, kv_usage=0.25)
    store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
    scraper = Scraper(store, [ScrapeTarget("s1", sglang_engine.url + "/v1", "sglang")])
    try:
        await scraper.scrape_all()
        snap = (await store.snapshots(["s1"]))["s1"]
    finally:
        await scraper.stop()
        await store.close()
    assert snap.healthy
    assert (snap.running, snap.waiting, snap.kv_usage, snap.block_size) == (5, 7, 0.25, 1)


async def test_prefill_and_decode_rates_learned_from_moving_counters(vllm_engine: FakeEngine) -> None:
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e1", vllm_engine.url, "vllm")])
    c = vllm_engine.counters
    await scraper.scrape_all()
    for _ in range(5):
        # Each round: 4000 prompt tokens, 1000 of them cache hits, 4 first tokens taking 0.5 s in total
        # -> 3000 uncached tokens over 0.5 s of prefill = 6000 tokens/s; 200 tokens at 20 ms each -> 50 tokens/s.
        c.prompt += 4000
        c.hits += 1000
        c.ttft_sum += 0.5
        c.ttft_count += 4
        c.generation += 200
        c.itl_sum += 4.0
        c.itl_count += 200
        await scraper.scrape_all()
    await scraper.stop()
    snap = (await store.snapshots())["e1"]
    assert snap.prefill_tokens_per_s == pytest.approx(6000.0)
    assert snap.decode_tokens_per_s == pytest.approx(50.0)
    assert snap.itl_s == pytest.approx(0.020)


def test_itl_is_the_smoothed_inverse_of_the_decode_speed() -> None:
    """One slow window (a step that carried a long prefill chunk) moves it part of the way, not all of it: an ITL
    objective is about a stream's whole life, and a raw window refused 45% of B2B SaaS's 15 rps stage."""
    est = RateEstimator(min_decode_tokens=64)
    assert est.decode_tokens_per_s == 0.0  # no ITL yet
    est.observe(EngineLoad(itl_seconds_sum=0.0, itl_count=0.0, generation_tokens_total=0.0), 0.0)
    est.observe(EngineLoad(itl_seconds_sum=2.0, itl_count=100.0, generation_tokens_total=100.0), 1.0)
    assert 1 / est.decode_tokens_per_s == pytest.approx(0.020)
    est.observe(EngineLoad(itl_seconds_sum=2.4, itl_count=110.0, generation_tokens_total=110.0), 2.0)
    assert 1 / est.decode_tokens_per_s == pytest.approx(0.020)  # 10 tokens: the window stays open
    est.observe(EngineLoad(itl_seconds_sum=14.0, itl_count=200.0, generation_tokens_total=200.0), 3.0)
    assert 0.020 < 1 / est.decode_tokens_per_s < 0.040  # the window's own mean was 0.13 s


async def test_sglang_prefill_rate_excludes_cached_tokens(sglang_engine: FakeEngine) -> None:
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("s1", sglang_engine.url, "sglang")])
    await scraper.scrape_all()
    c = sglang_engine.counters
    c.prompt, c.hits, c.ttft_sum, c.ttft_count = 10_000, 8_000, 0.25, 10
    await scraper.scrape_all()
    await scraper.stop()
    assert (await store.snapshots())["s1"].prefill_tokens_per_s == pytest.approx(8000.0)


async def test_one_failed_scrape_is_a_blip_two_mark_unhealthy_one_good_heals(vllm_engine: FakeEngine) -> None:
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e1", vllm_engine.url, "vllm")])

    async def healthy() -> bool:
        return (await store.snapshots())["e1"].healthy

    await scraper.scrape_all()
    vllm_engine.health_status = 503
    await scraper.scrape_all()
    assert await healthy()
    await scraper.scrape_all()
    assert not await healthy()
    vllm_engine.health_status = 200
    await scraper.scrape_all()
    assert await healthy()
    await scraper.stop()
    assert scraper.stats.failures == 2


async def test_a_hung_engine_fails_its_rounds_by_timeout(vllm_engine: FakeEngine) -> None:
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e1", vllm_engine.url, "vllm")], interval_s=0.3, timeout_s=0.2)
    await scraper.scrape_all()
    vllm_engine.hung.set()  # accepts the connection, never answers
    started = time.monotonic()
    await scraper.scrape_all()
    await scraper.scrape_all()
    took = time.monotonic() - started
    assert not (await store.snapshots())["e1"].healthy
    assert took < 2.0  # two rounds bounded by the 0.2 s timeout, not by the engine
    vllm_engine.unhang()
    await scraper.scrape_all()
    await scraper.stop()
    assert (await store.snapshots())["e1"].healthy


async def test_stopped_server_unhealthy_within_three_intervals_and_healthy_again_on_restart(
    vllm_engine: FakeEngine,
) -> None:
    interval = 0.3
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e1", vllm_engine.url, "vllm")], interval_s=interval)

    async def healthy() -> bool:
        snaps = await store.snapshots()
        return "e1" in snaps and snaps["e1"].healthy

    async def unhealthy() -> bool:
        return not await healthy()

    await scraper.start()
    try:
        await eventually(healthy, 5, "first healthy snapshot")
        await vllm_engine.stop()
        # Within three intervals; the small slack is for a loaded CI machine's event loop, not for the rule.
        took = await eventually(unhealthy, 3 * interval + 0.5, "unhealthy after the server stopped")
        assert took <= 3 * interval + 0.5
        await vllm_engine.start()
        await eventually(healthy, 2 * interval + 0.5, "healthy again after restart")
    finally:
        await scraper.stop()


async def test_garbage_body_is_counted_and_last_good_load_kept(vllm_engine: FakeEngine) -> None:
    vllm_engine.counters.running = 4
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e1", vllm_engine.url, "vllm")])
    await scraper.scrape_all()
    vllm_engine.garbage = True
    await scraper.scrape_all()
    await scraper.scrape_all()
    snap = (await store.snapshots())["e1"]
    assert scraper.stats.garbage == 2
    assert snap.healthy and snap.running == 4
    vllm_engine.garbage = False
    vllm_engine.counters.running = 1
    await scraper.scrape_all()
    await scraper.stop()
    assert (await store.snapshots())["e1"].running == 1


async def test_wrong_engine_kind_is_reported_not_misread(sglang_engine: FakeEngine) -> None:
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("s1", sglang_engine.url, "vllm")])
    sglang_engine.counters.running = 9
    await scraper.scrape_all()
    await scraper.stop()
    assert scraper.stats.unrecognized == 1
    assert (await store.snapshots())["s1"].running == 0


async def test_store_down_is_logged_once_and_scraping_goes_on(
    vllm_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    dead_redis = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", key_prefix="cogtest-dead")
    scraper = Scraper(dead_redis, [ScrapeTarget("e1", vllm_engine.url, "vllm")])
    caplog.set_level(logging.WARNING, logger="kvstate.scrape")
    for running in (1, 2, 3):
        vllm_engine.counters.running = running
        await scraper.scrape_all()
    await scraper.stop()
    await dead_redis.close()
    assert scraper.stats.store_failures == 3
    assert [r.getMessage() for r in caplog.records].count("store unavailable; still scraping") == 1
    snap = scraper.snapshot("e1")
    assert snap is not None and snap.running == 3


async def test_power_from_a_separate_dcgm_exporter(vllm_engine: FakeEngine, sglang_engine: FakeEngine) -> None:
    vllm_engine.counters = Counters(watts=300.0, millijoules=5_000_000)  # this server plays the DCGM exporter
    store = MemoryStore()
    target = ScrapeTarget("s1", sglang_engine.url, "sglang", power_url=vllm_engine.url + "/metrics")
    scraper = Scraper(store, [target])
    await scraper.scrape_all()
    await scraper.stop()
    snap = (await store.snapshots())["s1"]
    assert (snap.power_watts, snap.energy_joules) == (300.0, 5000.0)


def test_base_url_strips_trailing_v1() -> None:
    assert base_url("http://h:8000/v1/") == "http://h:8000"
    assert base_url("http://h:8000") == "http://h:8000"


def test_duplicate_endpoint_ids_and_unknown_engines_are_refused() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="listed twice"):
        Scraper(store, [ScrapeTarget("a", "http://x", "vllm"), ScrapeTarget("a", "http://y", "vllm")])
    with pytest.raises(KeyError, match="known kinds"):
        Scraper(store, [ScrapeTarget("a", "http://x", "vlm")])


# -- the estimator on its own (pure: the clock is an argument) -----------------------------------------------


def load(prompt: float, hits: float = 0.0, ttft: float = 0.0, count: float = 0.0) -> EngineLoad:
    return EngineLoad(prompt_tokens_total=prompt, prefix_cache_hits_total=hits, ttft_seconds_sum=ttft, ttft_count=count)


def test_estimator_trickle_accumulates_until_enough_tokens() -> None:
    est = RateEstimator(min_prefill_tokens=256)
    est.observe(load(0), now=0.0)
    est.observe(load(100, ttft=0.1, count=1), now=1.0)
    assert est.prefill_tokens_per_s == 0.0  # 100 tokens: window stays open
    est.observe(load(300, ttft=0.2, count=2), now=2.0)
    assert est.prefill_tokens_per_s == pytest.approx(1500.0)  # 300 tokens over 0.2 s


def test_estimator_throughput_wins_when_queueing_inflates_ttft() -> None:
    # Saturated engine: 20,000 tokens/s of throughput, but each TTFT is mostly queueing (per-request 2,000/s).
    est = RateEstimator(throughput_window_s=10.0)
    est.observe(load(0), now=0.0)
    for second in range(1, 11):
        est.observe(load(20_000 * second, ttft=10.0 * second, count=second), now=float(second))
    assert est.per_request_prefill == pytest.approx(2000.0)
    assert est.prefill_tokens_per_s == pytest.approx(20_000.0)


def test_estimator_restart_never_takes_a_delta_across_a_counter_reset() -> None:
    est = RateEstimator()
    est.observe(load(1_000_000, ttft=100, count=10), now=0.0)
    est.observe(load(1_001_000, ttft=100.5, count=11), now=1.0)
    learned = est.prefill_tokens_per_s
    assert learned == pytest.approx(2000.0)
    est.observe(load(500, ttft=0.1, count=1), now=2.0)  # restarted engine: counters went down
    assert est.prefill_tokens_per_s == learned
    est.observe(load(1500, ttft=0.6, count=2), now=3.0)
    assert est.prefill_tokens_per_s == pytest.approx(learned + 0.3 * (2000.0 - learned))


def test_estimator_uses_only_the_engine_clock_when_prefill_time_is_exposed() -> None:
    # vLLM exposes request_prefill_time_seconds: the wall-clock throughput (which a time-scaled simulator
    # inflates) must not override it.
    est = RateEstimator(throughput_window_s=1.0)
    for second in range(0, 12):
        est.observe(EngineLoad(prompt_tokens_total=50_000.0 * second, prefill_seconds_sum=10.0 * second), float(second))
    assert est.throughput_prefill == 0.0
    assert est.prefill_tokens_per_s == pytest.approx(5000.0)


def vllm_load(first_tokened: list[int], finished: list[tuple[int, float]], running: int | None = None) -> EngineLoad:
    """vLLM's counters after requests of the given prompt sizes got their first token (prompt tokens, TTFT) and
    the given (prompt size, prefill seconds) finished (the prefill-time histogram vLLM observes at finish)."""
    return EngineLoad(
        running=None if running is None else float(running),
        prompt_tokens_total=float(sum(first_tokened)),
        prefix_cache_hits_total=0.0,
        ttft_seconds_sum=sum(n / 1200 for n in first_tokened),
        ttft_count=float(len(first_tokened)),
        prefill_seconds_sum=sum(s for _, s in finished),
        finish_count=float(len(finished)),
    )


def test_estimator_pairs_vllm_prefill_time_observed_at_finish_with_the_same_requests_tokens() -> None:
    # An engine at 1,200 tokens/s. A scrape falls between request A's first token and its finish, the next one
    # after B's first token and A's finish: that window holds two prompts' tokens and one prefill time. Dividing
    # the sums learned 2,400 tokens/s, and the router then queued 3 s on an engine it thought answered in 1.4 s.
    a, b, c = 840, 860, 900
    est = RateEstimator()
    est.observe(vllm_load([], []), now=0.0)
    est.observe(vllm_load([a], []), now=1.0)
    est.observe(vllm_load([a, b], [(a, a / 1200)]), now=2.0)
    assert est.prefill_tokens_per_s == 0.0  # B is decoding: its tokens are counted, its prefill time is not
    est.observe(vllm_load([a, b], [(a, a / 1200), (b, b / 1200)]), now=3.0)
    assert est.prefill_tokens_per_s == pytest.approx(1200.0)  # both finished: the window pairs them
    est.observe(vllm_load([a, b, c], [(a, a / 1200), (b, b / 1200), (c, c / 1200)]), now=4.0)
    assert est.prefill_tokens_per_s == pytest.approx(1200.0)


def test_estimator_pairs_sglang_tokens_counted_at_finish_with_ttft_counted_at_first_token() -> None:
    # SGLang counts prompt tokens when a request finishes, TTFT at its first token: a window with two first tokens
    # and one finished prompt read half the engine's rate (840 tokens over 1.4 s of TTFT).
    def sglang(first: int, finished_prompts: list[int]) -> EngineLoad:
        return EngineLoad(
            prompt_tokens_total=float(sum(finished_prompts)),
            prefix_cache_hits_total=0.0,
            ttft_seconds_sum=0.7 * first,
            ttft_count=float(first),
            finish_count=float(len(finished_prompts)),
        )

    est = RateEstimator()
    est.observe(sglang(0, []), now=0.0)
    est.observe(sglang(1, []), now=1.0)
    est.observe(sglang(2, [840]), now=2.0)
    assert est.prefill_tokens_per_s == 0.0
    est.observe(sglang(2, [840, 840]), now=3.0)
    assert est.prefill_tokens_per_s == pytest.approx(1200.0)


def test_estimator_drops_at_once_to_what_finished_requests_could_at_most_have_done() -> None:
    # Learned at 1,200 tokens/s; then the engine slows 50x while 3 requests keep decoding, so no window pairs up.
    # The first finish bounds the rate: its prompt tokens (cached ones included) over its prefill time.
    def load(first: int, finished: list[tuple[int, float]]) -> EngineLoad:
        return EngineLoad(
            running=3.0,
            prompt_tokens_total=840.0 * first,
            prefix_cache_hits_total=0.0,
            ttft_seconds_sum=0.7 * first,
            ttft_count=float(first),
            prefill_seconds_sum=sum(s for _, s in finished),
            finish_count=float(len(finished)),
            finished_prompt_tokens_sum=float(sum(n for n, _ in finished)),
        )

    est = RateEstimator()
    est.observe(load(0, []), now=0.0)
    est.observe(load(1, [(840, 0.7)]), now=1.0)
    assert est.prefill_tokens_per_s == pytest.approx(1200.0)
    est.observe(load(5, [(840, 0.7)]), now=2.0)  # 4 more first tokens, none finished: 3 decoding
    est.observe(load(5, [(840, 0.7), (840, 840 / 24)]), now=3.0)
    assert est.prefill_tokens_per_s == pytest.approx(24.0)


def test_estimator_a_rate_dropped_by_a_slowdown_climbs_back_when_the_engine_is_quick_again() -> None:
    est = RateEstimator()
    est.observe(load(0), now=0.0)
    est.per_request_prefill = 24.0  # what a slowdown taught (a finished request's ceiling drops it at once)
    for i in range(1, 13):  # quick again: windows of 1,200 tokens/s
        est.observe(load(840 * i, ttft=0.7 * i, count=i), now=float(i))
    assert est.prefill_tokens_per_s > 1100


def test_estimator_on_a_busy_engine_widens_the_window_until_the_requests_pair_up() -> None:
    # Always 2 requests decoding: a 12k-token prompt first-tokened while a 1k-token one finished, scrape after
    # scrape. A window of one scrape pairs 12k tokens with 1k tokens' prefill time (12x); it closes only once at
    # most a quarter of its requests can be unpaired, and the rate learned then is within that share.
    est = RateEstimator()
    first: list[int] = [1000, 12000]
    finished: list[tuple[int, float]] = []
    est.observe(vllm_load(first, finished, running=2), now=0.0)
    for step in range(1, 40):
        n = 1000 if step % 2 else 12000
        finished.append((first[len(finished)], first[len(finished)] / 1200))
        first.append(n)
        est.observe(vllm_load(first, finished, running=2), now=float(step))
        if est.prefill_tokens_per_s:
            break
    assert est.prefill_tokens_per_s == pytest.approx(1200.0, rel=0.25)
    assert len(finished) >= 16  # (2 + 2) / 16 = 0.25


def test_estimator_mean_service_time_from_the_inference_histogram() -> None:
    est = RateEstimator(min_service_requests=4)
    est.observe(EngineLoad(service_seconds_sum=0.0, service_count=0.0), now=0.0)
    est.observe(EngineLoad(service_seconds_sum=60.0, service_count=3.0), now=1.0)
    assert est.mean_service_s == 0.0  # 3 requests: window stays open
    est.observe(EngineLoad(service_seconds_sum=100.0, service_count=5.0), now=2.0)
    assert est.mean_service_s == pytest.approx(20.0)


def test_estimator_mean_service_time_from_tokens_per_request_and_decode_speed() -> None:
    # No inference histogram: 4 finished requests generated 2,000 tokens, one sequence decodes 50 tokens/s.
    est = RateEstimator(min_decode_tokens=1, min_service_requests=4)
    est.observe(
        EngineLoad(itl_seconds_sum=0.0, itl_count=0.0, generation_tokens_total=0.0, requests_finished_total=0.0), 0.0
    )
    est.observe(
        EngineLoad(itl_seconds_sum=40.0, itl_count=2000.0, generation_tokens_total=2000.0, requests_finished_total=4.0),
        1.0,
    )
    assert est.decode_tokens_per_s == pytest.approx(50.0)
    assert est.mean_service_s == pytest.approx(10.0)  # 500 tokens each at 50 tokens/s


def test_estimator_learns_the_engines_clock_from_its_latencies_and_running_count() -> None:
    # 40 sequences decode for 10 wall seconds on an engine whose clock runs at 0.25 of the wall's: each adds 2.5
    # engine seconds of inter-token latency, 100 s in all. TRT-LLM's request-counting histogram teaches nothing.
    est = RateEstimator()
    est.observe(EngineLoad(running=40, itl_seconds_sum=0.0, itl_count=0.0, generation_tokens_total=0.0), 0.0)
    est.observe(EngineLoad(running=40, itl_seconds_sum=50.0, itl_count=2000.0, generation_tokens_total=2000.0), 1.0)
    assert est.clock_rate == 0.0  # a 1 s window is too short to read a gauge's mean from its two ends
    est.observe(EngineLoad(running=40, itl_seconds_sum=100.0, itl_count=4000.0, generation_tokens_total=4000.0), 10.0)
    assert est.clock_rate == pytest.approx(0.25)
    requests = RateEstimator()
    requests.observe(EngineLoad(running=40, itl_seconds_sum=0.0, itl_count=0.0, generation_tokens_total=0.0), 0.0)
    requests.observe(EngineLoad(running=40, itl_seconds_sum=9.0, itl_count=80.0, generation_tokens_total=4000.0), 9.0)
    assert requests.clock_rate == 0.0


@pytest.mark.e2e
async def test_the_simulators_clock_rate_is_what_it_declares_from_the_first_scrape(tmp_path: Path) -> None:
    """A simulated engine at time scale 4 (its clock 4x the wall's) says so on its /metrics: the first scrape,
    with nothing running, has the exact rate, which placement and flow control use to read the gateway's times on
    the engine's clock. Learned from the ITL histogram it needed a steady window of decoding requests
    (``test_estimator_learns_the_engines_clock_from_its_latencies_and_running_count``): long prompts with short
    answers left it unknown, and flow control timed first tokens on the wall clock."""
    with start_fleet(1, time_scale=4.0, log_dir=tmp_path) as fleet:
        endpoint, url = fleet.endpoint_ids[0], fleet.urls[0]
        store = MemoryStore()
        scraper = Scraper(store, [ScrapeTarget(endpoint, url, "vllm")])
        snap = await scraper.scrape(endpoint)
        await scraper.stop()
    assert snap is not None and snap.clock_rate == 4.0 and snap.clock_declared


async def test_learned_service_time_and_finished_count_reach_the_snapshot(vllm_engine: FakeEngine) -> None:
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e", vllm_engine.url, "vllm")], rate=RateEstimator(min_service_requests=2))
    await scraper.scrape_all()
    vllm_engine.counters = Counters(finished=4, service_sum=48.0, service_count=4)
    await scraper.scrape_all()
    await scraper.stop()
    snap = (await store.snapshots(["e"]))["e"]
    assert snap.requests_finished_total == 4.0
    assert snap.mean_service_s == pytest.approx(12.0)


async def test_energy_per_token_is_learned_by_the_scraper_and_reaches_the_snapshot(vllm_engine: FakeEngine) -> None:
    # Idle at 1 W (so the idle draw over the real time between scrapes is negligible), then 20,000 tokens computed
    # for 1 kJ: 15,000 prompt tokens served, of which 5,000 were prefix-cache hits (no prefill), and 10,000 generated.
    store = MemoryStore()
    scraper = Scraper(store, [ScrapeTarget("e", vllm_engine.url, "vllm")])
    vllm_engine.counters = Counters(watts=1.0, millijoules=5_000_000, prompt=750.0, generation=250.0)
    await scraper.scrape_all()
    assert (await store.snapshots(["e"]))["e"].joules_per_token is None  # one scrape: no window yet
    vllm_engine.counters = Counters(
        running=1, watts=300.0, millijoules=6_000_000, prompt=15_750.0, hits=5_000.0, generation=10_250.0
    )
    await scraper.scrape_all()
    await scraper.stop()
    snap = (await store.snapshots(["e"]))["e"]
    assert snap.joules_per_token == pytest.approx(0.05, rel=0.01)
    assert (snap.prompt_tokens_total, snap.generation_tokens_total) == (15_750.0, 10_250.0)


@pytest.mark.e2e
async def test_mixed_hardware_rates_learned_from_the_simulated_fleet(tmp_path: Path) -> None:
    """Mixed hardware falls out of the metrics: an H100 profile learns a far higher prefill rate than a Mac."""
    with start_fleet(2, profile="h100,mac", time_scale=20, log_dir=tmp_path) as fleet:
        store = MemoryStore()
        targets = [ScrapeTarget(e, u, "vllm") for e, u in zip(fleet.endpoint_ids, fleet.urls, strict=True)]
        scraper = Scraper(store, targets, interval_s=0.2)
        await scraper.scrape_all()
        async with httpx.AsyncClient(timeout=60) as client:
            for i in range(3):
                prompt = " ".join(f"w{i}x{j}" for j in range(800))  # distinct prompts: no cache hits
                for url in fleet.urls:
                    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 80}
                    (await client.post(f"{url}/v1/completions", json=body)).raise_for_status()
                await scraper.scrape_all()
        await scraper.stop()
    h100, mac = (await store.snapshots())[fleet.endpoint_ids[0]], (await store.snapshots())[fleet.endpoint_ids[1]]
    assert h100.prefill_tokens_per_s > 10 * mac.prefill_tokens_per_s > 0
    assert h100.decode_tokens_per_s > mac.decode_tokens_per_s > 0


def test_estimator_a_rate_learned_on_short_prompts_gives_way_to_one_learned_on_long_prompts() -> None:
    # A step has a floor (the weights are read once per step): a 50-token prompt takes a 15 ms step on an engine
    # that prefills 10,000 tokens/s, so short prompts alone teach ~3,300 tokens/s, and say that they are short.
    def engine(prompts: list[int]) -> EngineLoad:
        seconds = [max(0.015, n / 10_000) for n in prompts]
        return EngineLoad(
            prompt_tokens_total=float(sum(prompts)),
            prefix_cache_hits_total=0.0,
            ttft_seconds_sum=sum(seconds),
            ttft_count=float(len(prompts)),
            prefill_seconds_sum=sum(seconds),
            finish_count=float(len(prompts)),
            finished_prompt_tokens_sum=float(sum(prompts)),
        )

    est = RateEstimator()
    served: list[int] = []
    est.observe(engine(served), now=0.0)
    for t in range(1, 4):
        served += [50] * 6
        est.observe(engine(served), now=float(t))
    assert est.prefill_tokens_per_s == pytest.approx(3333, rel=0.01)
    assert est.prefill_rate_from_short_prompts
    served.append(30_000)  # one long prompt: its window measures the engine's rate
    est.observe(engine(served), now=4.0)
    assert est.prefill_tokens_per_s == pytest.approx(10_000)
    assert not est.prefill_rate_from_short_prompts
    for t in range(5, 8):  # short prompts again: neither their windows nor their finishes pull it down
        served += [50] * 6
        est.observe(engine(served), now=float(t))
    assert est.prefill_tokens_per_s == pytest.approx(10_000)
    assert est.per_request_prefill == pytest.approx(3333, rel=0.01)
    # What a short prompt waits for there is the step, not the rate: 15 ms.
    assert est.short_prompt_prefill_s == pytest.approx(0.015, rel=0.01)
    # The engine slows 50x while serving short prompts only: they show it at their first finishes (a request's own
    # prefill is priced at no less than this), while no long prompt came to bring the long-prompt rate down.
    base = engine(served)
    est.observe(
        EngineLoad(
            prompt_tokens_total=base.prompt_tokens_total + 300,
            prefix_cache_hits_total=0.0,
            ttft_seconds_sum=(base.ttft_seconds_sum or 0) + 6 * 0.75,
            ttft_count=(base.ttft_count or 0) + 6,
            prefill_seconds_sum=(base.prefill_seconds_sum or 0) + 6 * 0.75,
            finish_count=(base.finish_count or 0) + 6,
            finished_prompt_tokens_sum=(base.finished_prompt_tokens_sum or 0) + 300,
        ),
        now=8.0,
    )
    assert est.short_prompt_prefill_s > 10 * 0.015
    assert est.prefill_tokens_per_s == pytest.approx(10_000)


def test_estimator_a_floor_learned_under_load_comes_down_when_the_engine_is_quick_again() -> None:
    # Under load a short prompt's prefill shares its batch with decodes: 1.75 s each (the simulated mac in the
    # cloud e2e tests). Idle again, the same prompts prefill in 16 ms: the learned rate explains that, so the
    # window teaches no floor, but the floor can be no higher than what the requests took. Before, it stayed at
    # 1.75 s for good and the idle engine was predicted at 1.96 s for an 18-token prompt.
    est = RateEstimator()
    load = short_prompts_finished(EngineLoad(), 0, 0.0)  # every counter at 0
    est.observe(load, now=0.0)
    est.per_request_prefill = 600.0  # what the load step taught (18 uncached tokens: 30 ms at that rate)
    for t in range(1, 4):  # loaded: 1.75 s each, far above what the rate explains: a floor
        load = short_prompts_finished(load, 6, 1.75)
        est.observe(load, now=float(t))
    assert est.short_prompt_prefill_s > 1.0
    load = short_prompts_finished(load, 3, 0.016)  # idle: the next window of the same prompts took 16 ms each
    est.observe(load, now=4.0)
    assert est.short_prompt_prefill_s == pytest.approx(0.016)
