"""The Router over both real stores: what a gateway sees across a request's lifecycle."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from cognitora import explain
from cognitora.collector import Collector
from cognitora.config import CognitoraConfig, config_from_dict, load_config
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.decision import Decision
from cognitora.request import RouteRequest
from cognitora_sim.harness.process import free_port
from cognitora_sim.launch import start_fleet
from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer, PromptKeyer
from kvstate.redis_store import RedisStore
from kvstate.store import EndpointSnapshot, Store, StoreUnavailable

A, B = "127.0.0.1:8001", "127.0.0.1:8002"
MODEL = "smollm2"
SYSTEM = "You are a careful assistant for the Cognitora project. " * 40


def make_config(smollm2_dir: Path, **top: Any) -> CognitoraConfig:
    return config_from_dict(
        {
            # generous: the shared 2-core test machine must not turn a slow answer into a degraded decision.
            # No recompute charge: these tests steer with in-flight work and the TTFT it predicts (the charge
            # would keep a prefix on its loaded endpoint; tests/core/test_placement.py covers it).
            # No tie band either: a few ms of queue must decide, not the prefix hash.
            "placement": {"store_timeout_s": 5.0, "recompute_weight": 0.0, "tie_band_s": 0.0, "tie_band_ratio": 0.0},
            **top,
            "models": [
                {
                    "name": MODEL,
                    "block_size": 16,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": f"http://{A}"}, {"url": f"http://{B}"}],
                }
            ],
        }
    )


def chat(question: str = "What is a KV cache?", **extra: Any) -> RouteRequest:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return RouteRequest(model=MODEL, messages=messages, **extra)


@pytest.fixture
def config(smollm2_dir: Path) -> CognitoraConfig:
    return make_config(smollm2_dir)


async def test_dispatched_prompt_makes_the_same_prompt_prefer_that_endpoint(
    config: CognitoraConfig, store: Store
) -> None:
    router = Router(config, store)
    # Both endpoints idle and empty: force the first request onto B.
    first = await router.place(chat(candidates=[B]))
    assert first.endpoint == B and first.exact_keys and len(first.keys) > 20
    attempt = router.dispatch(first)
    attempt.first_token()
    await attempt.settled()

    again = await router.place(chat())
    assert again.endpoint == B, again.explain()
    assert again.predicted_cached_tokens == len(first.keys) * 16
    assert again.runner_up is not None and again.runner_up.endpoint == A
    assert again.degraded is False


async def test_undispatched_decision_leaves_no_trace(config: CognitoraConfig, store: Store) -> None:
    router = Router(config, store)
    await router.place(chat(candidates=[B]))  # placed but never dispatched: place() has no side effects
    again = await router.place(chat())
    assert all(c.cached_tokens == 0 and c.queued_prefill_tokens == 0 for c in again.candidates)


async def test_finished_releases_in_flight_work(config: CognitoraConfig, store: Store) -> None:
    router = Router(config, store)
    decision = await router.place(chat(max_tokens=50, candidates=[A]))
    attempt = router.dispatch(decision)
    await attempt.settled()
    assert (await store.inflight([A]))[A].requests == 1

    # While A works on its prefill, a different prompt goes to idle B.
    busy = await router.place(chat("Something unrelated entirely?"))
    queued = {c.endpoint: c.queued_prefill_tokens for c in busy.candidates}
    assert queued[A] == decision.prompt_tokens and queued[B] == 0
    # A holds the shared system prompt (speculatively), but its queue costs more than that saves.
    assert busy.endpoint == B, busy.explain()
    assert {c.endpoint: c.cached_tokens for c in busy.candidates}[A] > 0

    attempt.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=decision.prompt_tokens, cached_tokens=0))
    await attempt.settled()
    assert (await store.inflight([A]))[A].requests == 0
    after = await router.place(chat("Something unrelated entirely?"))
    assert {c.endpoint: c.queued_prefill_tokens for c in after.candidates} == {A: 0, B: 0}
    assert router.stats.finished_ok == 1 and router.stats.hit_reports == 1
    assert router.stats.achieved_cached_tokens == 0


async def test_mark_unhealthy_takes_effect_at_once_until_a_newer_healthy_scrape(
    config: CognitoraConfig, store: Store
) -> None:
    router = Router(config, store)
    keys = (await router.place(chat())).keys
    await store.add_blocks(MODEL, A, list(keys))
    assert (await router.place(chat())).endpoint == A

    await router.mark_unhealthy(A, "connection refused")
    dead = await router.place(chat())
    assert dead.endpoint == B
    assert {c.endpoint: c.excluded for c in dead.candidates}[A] == "marked unhealthy: connection refused"

    # Another gateway replica on the same store stops picking A too.
    replica = Router(config, store)
    assert (await replica.place(chat())).endpoint == B

    await store.put_snapshot(EndpointSnapshot(A, healthy=True, last_seen=time.time() + 0.001))
    assert (await router.place(chat())).endpoint == A
    assert (await replica.place(chat())).endpoint == A


async def test_a_scrape_that_caught_the_last_turn_waiting_does_not_move_the_next_turn(
    smollm2_dir: Path, store: Store
) -> None:
    """A sequential agent on B: the collector's scrape lands while turn 1 waits for its first step (``waiting=1``).
    The router has seen turn 1 start and finish since, so B's queue is empty and turn 2 stays with its cache; a
    queue the scrape saw after that (someone else's) still counts."""
    config = make_config(smollm2_dir)
    # A waiting request is priced at 4,096 prompt tokens (0.2 s here), well over what B's cache saves (~27 ms).
    placement = config.placement.model_copy(update={"waiting_request_tokens": 4096})
    router = Router(config.model_copy(update={"placement": placement}), store)
    turn1 = await router.place(chat(candidates=[B]))
    attempt = router.dispatch(turn1)
    caught = time.time()
    busy = {"mean_service_s": 2.0, "prefill_tokens_per_s": 20_000.0}
    await store.put_snapshot(EndpointSnapshot(B, last_seen=caught, waiting=1, **busy))
    await store.put_snapshot(EndpointSnapshot(A, last_seen=caught, **busy))
    while time.time() <= caught:  # the first token comes after the scrape, on any clock resolution
        await asyncio.sleep(0.001)
    attempt.first_token()
    attempt.finish(Outcome(OutcomeKind.COMPLETED))
    await attempt.settled()

    turn2 = await router.place(chat())
    assert turn2.endpoint == B, turn2.explain()
    assert turn2.predicted_cached_tokens > 0

    # A later scrape shows a queue on B that none of ours explains: it is real, and the next turn goes to A.
    await store.put_snapshot(EndpointSnapshot(B, last_seen=time.time() + 0.001, waiting=1, **busy))
    turn3 = await router.place(chat())
    assert turn3.endpoint == A, turn3.explain()


async def test_mark_unhealthy_is_a_mark_and_leaves_the_snapshot_and_its_age_alone(
    config: CognitoraConfig, store: Store
) -> None:
    router = Router(config, store)
    old = EndpointSnapshot(A, last_seen=time.time() - 3600, running=50, waiting=20)
    await store.put_snapshot(old)
    await router.mark_unhealthy(A, "connection refused")
    await router.mark_unhealthy(B, "reset")
    assert await store.snapshots() == {A: old}  # no snapshot refreshed, none made up for B
    marks = await store.health_marks([A, B])
    assert {e: m.reason for e, m in marks.items()} == {A: "connection refused", B: "reset"}


async def test_another_gateways_mark_still_counts_when_the_store_goes_away(smollm2_dir: Path) -> None:
    store = MemoryStore()
    config = make_config(smollm2_dir)
    router = Router(config, store)
    await Router(config, store).mark_unhealthy(A, "connection refused")  # another replica saw A fail
    assert (await router.place(chat())).endpoint == B

    async def unreachable(*args: object) -> None:
        raise StoreUnavailable("Redis at redis://10.9.9.9:6379/0 did not answer")

    store.fleet_view = unreachable  # type: ignore[method-assign]
    degraded = await router.place(chat())
    assert degraded.degraded and degraded.endpoint == B
    assert {c.endpoint: c.excluded for c in degraded.candidates}[A] == "marked unhealthy: connection refused"


async def test_redis_unreachable_still_places_degraded(smollm2_dir: Path) -> None:
    config = make_config(smollm2_dir, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    router = Router.from_config(config)
    try:
        decision = await router.place(chat(candidates=[A]))
        assert decision.endpoint == A and decision.degraded
        assert "degraded" in decision.explain()
        attempt = router.dispatch(decision)
        await attempt.settled()  # logs, counts, does not raise

        # Its own in-flight count still steers the next request away from the endpoint it just loaded.
        other = await router.place(chat("A different question"))
        assert other.degraded and other.endpoint == B, other.explain()

        await router.mark_unhealthy(B, "HTTP 503")
        assert (await router.place(chat("Third"))).endpoint == A
        attempt.finish(Outcome(OutcomeKind.FAILED, detail="boom"))
        await attempt.settled()
        assert router.stats.degraded == 3 and router.stats.store_errors >= 4
    finally:
        await router.close()


async def test_unknown_model_and_bad_prompt_are_rejections(config: CognitoraConfig) -> None:
    router = Router(config, MemoryStore())
    unknown = await router.place(RouteRequest(model="gpt-9", prompt="hi"))
    assert unknown.rejection is not None and unknown.rejection.status == 404
    assert unknown.rejection.message == "unknown model 'gpt-9'; configured: smollm2"
    empty = await router.place(RouteRequest(model=MODEL))
    assert empty.rejection is not None and empty.rejection.status == 400
    assert "neither 'messages' nor 'prompt'" in empty.rejection.message
    bad = await router.place(RouteRequest(model=MODEL, messages=[{"role": "user", "content": 42}]))
    assert bad.rejection is not None and bad.rejection.status == 400
    decision, attempt = await router.admit(RouteRequest(model="gpt-9", prompt="hi"))
    assert attempt is None and decision.rejection is not None  # a rejection is never dispatched
    assert [d.rejection.status for d in router.recent_decisions() if d.rejection] == [404, 400, 400, 404]


async def test_keys_are_token_exact_with_the_models_tokenizer(config: CognitoraConfig, smollm2_dir: Path) -> None:
    router = Router(config, MemoryStore())
    decision = await router.place(chat())
    keyer = PromptKeyer(MODEL, 16, ChatTokenizer(smollm2_dir / "tokenizer.json"))
    expected = keyer.keys_for_chat(chat().messages or [])
    assert list(decision.keys) == expected.keys
    assert decision.prompt_tokens == expected.prompt_tokens


async def test_from_config_without_redis_is_in_process_and_urls_resolve(config: CognitoraConfig) -> None:
    router = Router.from_config(config)
    assert isinstance(router.store, MemoryStore)
    assert router.endpoint_url(B) == f"http://{B}"
    assert router.endpoint_url("10.9.9.9:1") is None
    await router.close()


def test_decision_is_a_value(config: CognitoraConfig) -> None:
    # Adapters keep the Decision between phases (LiteLLM callbacks, ext-proc stream): it must be immutable.
    decision = Decision("r", MODEL, A, f"http://{A}", 10)
    with pytest.raises(AttributeError):
        decision.endpoint = B  # type: ignore[misc]


def test_explain_reads_the_live_store_and_prints_the_table(
    smollm2_dir: Path, redis_server_url: str, key_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = tmp_path / "cognitora.yaml"
    config_path.write_text(
        f"redis_url: {redis_server_url}\nkey_prefix: {key_prefix}\n"
        f"models:\n  - name: {MODEL}\n    tokenizer: {smollm2_dir / 'tokenizer.json'}\n"
        f"    endpoints: [{{url: 'http://{A}'}}, {{url: 'http://{B}'}}]\n"
    )
    messages = chat().messages
    (tmp_path / "chat.json").write_text(json.dumps({"model": MODEL, "messages": messages}))
    config = load_config(config_path)
    keys = PromptKeyer(MODEL, 16, ChatTokenizer(smollm2_dir / "tokenizer.json")).keys_for_chat(messages or []).keys

    async def seed() -> None:
        store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
        await store.add_blocks(MODEL, B, keys)
        await store.close()

    async def cleanup() -> None:
        store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
        await store.delete_everything()
        await store.close()

    asyncio.run(seed())
    try:
        args = ["--config", str(config_path), "--model", MODEL, "--prompt-file", str(tmp_path / "chat.json")]
        assert explain.main([*args, "--messages-json"]) == 0
    finally:
        asyncio.run(cleanup())
    out = capsys.readouterr().out
    assert f"store: Redis {config.redis_url}" in out
    assert f"picked {B} for model {MODEL}" in out
    assert f"runner-up {A}" in out
    assert f"{len(keys) * 16}/" in out  # B's whole held prefix counts as cached


def test_explain_says_when_the_state_is_stale_and_names_a_bad_tokenizer(
    smollm2_dir: Path, redis_server_url: str, key_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = tmp_path / "cognitora.yaml"
    config_path.write_text(
        f"redis_url: {redis_server_url}\nkey_prefix: {key_prefix}\nplacement: {{state_max_age_s: 0.5}}\n"
        f"models:\n  - name: {MODEL}\n    endpoints: [{{url: 'http://{A}'}}]\n"
    )
    (tmp_path / "p.txt").write_text("Tell me about prefix caches. " * 20)
    args = ["--config", str(config_path), "--model", MODEL, "--prompt-file", str(tmp_path / "p.txt")]

    async def a_collector_that_died() -> None:
        store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
        try:
            await store.put_heartbeat("collector gone", ttl_s=60)

            async def old() -> bool:
                return (await store.heartbeats())["collector gone"].age_s > 1.0

            await eventually(old, 10, "the heartbeat to be older than state_max_age_s")
        finally:
            await store.close()

    async def cleanup() -> None:
        store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix)
        await store.delete_everything()
        await store.close()

    asyncio.run(a_collector_that_died())
    try:
        assert explain.main(args) == 0  # placed all the same
    finally:
        asyncio.run(cleanup())
    out = capsys.readouterr().out
    assert "stale: the fleet state is " in out and " s old (the newest collector heartbeat)" in out
    assert "stale state: the newest collector heartbeat (collector gone)" in out  # the reason's note

    bad = tmp_path / "tokenizer.json"
    bad.write_text("not a tokenizer")
    config_path.write_text(
        f"models:\n  - name: {MODEL}\n    tokenizer: {bad}\n    endpoints: [{{url: 'http://{A}'}}]\n"
    )
    assert explain.main(args) == 2
    err = capsys.readouterr().err
    assert f"models[0].tokenizer (model '{MODEL}'): {bad} is not a tokenizer.json" in err and "Traceback" not in err


def test_explain_without_redis_says_the_store_is_empty(
    smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = tmp_path / "cognitora.yaml"
    config_path.write_text(f"models:\n  - name: {MODEL}\n    endpoints: [{{url: 'http://{A}'}}]\n")
    (tmp_path / "p.txt").write_text("Tell me about prefix caches. " * 20)
    args = ["--config", str(config_path), "--prompt-file", str(tmp_path / "p.txt")]
    assert explain.main([*args, "--model", MODEL]) == 0
    out = capsys.readouterr().out
    assert "in-process and empty" in out and "text-approximate keys" in out and f"picked {A}" in out

    assert explain.main([*args, "--model", "nope"]) == 1
    assert "unknown model 'nope'; configured: smollm2" in capsys.readouterr().out

    (tmp_path / "bad.yaml").write_text("models: [{name: m, endpoints: [{url: x}]}]\n")
    assert explain.main(["--config", str(tmp_path / "bad.yaml"), "--model", "m", "--prompt-file", "p"]) == 2
    assert "models[0].endpoints[0].url: expected an http(s) URL" in capsys.readouterr().err


class SlowStore(MemoryStore):
    """A store whose prefix lookups hang (a Redis stuck behind a slow command)."""

    async def match_prefix(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(30)
        return await super().match_prefix(*args, **kwargs)


async def test_a_slow_store_gives_a_degraded_decision_in_time(smollm2_dir: Path) -> None:
    config = make_config(smollm2_dir, placement={"store_timeout_s": 0.2})
    router = Router(config, SlowStore())
    started = time.monotonic()
    decision = await router.place(chat())
    assert decision.degraded and decision.endpoint in {A, B}
    assert time.monotonic() - started < 5  # bounded by store_timeout_s, not by the store


async def test_routing_history_outlives_speculation_only_where_no_events_come(smollm2_dir: Path) -> None:
    # A publishes KV events (its speculative entries are confirmed within moments, so they expire fast); B does not
    # (routing history is its only prefix index, so it lasts routing_history_ttl_s).
    config = config_from_dict(
        {
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [
                        {"url": f"http://{A}", "kv_events": "tcp://127.0.0.1:5557"},
                        {"url": f"http://{B}"},
                    ],
                }
            ],
            "placement": {"speculative_ttl_s": 10, "routing_history_ttl_s": 300},
        }
    )
    clock = [1_700_000_000.0]
    store = MemoryStore(clock=lambda: clock[0])
    router = Router(config, store, clock=lambda: clock[0])
    for endpoint in (A, B):
        decision = await router.place(chat(candidates=[endpoint]))
        attempt = router.dispatch(decision)
        attempt.finish(Outcome(OutcomeKind.COMPLETED))
        await attempt.settled()
    keys = decision.keys
    clock[0] += 60
    held = await store.match_prefix(MODEL, list(keys), [A, B])
    assert set(held) == {B} and held[B].blocks == len(keys)


@pytest.mark.e2e
async def test_closed_loop_with_the_simulated_fleet_predicts_the_achieved_hit(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    """Router + embedded collector + two simulated vLLM engines: placement follows the engines' real caches, and
    the predicted cached tokens equal what the engine reports in ``usage.prompt_tokens_details.cached_tokens``."""
    tokenizer = smollm2_dir / "tokenizer.json"
    fleet = start_fleet(2, model=MODEL, time_scale=20, tokenizer=tokenizer, log_dir=tmp_path)
    endpoints = [
        {"url": url, "id": eid, "kv_events": pub, "kv_events_replay": replay}
        for url, eid, pub, replay in zip(
            fleet.urls, fleet.endpoint_ids, fleet.events_addresses, fleet.replay_addresses, strict=True
        )
    ]
    config = config_from_dict(
        {
            "models": [{"name": MODEL, "tokenizer": str(tokenizer), "endpoints": endpoints}],
            "scrape": {"interval_s": 0.2, "timeout_s": 0.2},
            "placement": {"store_timeout_s": 5.0},
        }
    )
    store = MemoryStore()
    router = Router(config, store)
    first, second = fleet.endpoint_ids

    async def serve(req: RouteRequest) -> tuple[Decision, int]:
        decision = await router.place(req)
        assert decision.url is not None, decision.explain()
        attempt = router.dispatch(decision)
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"model": MODEL, "messages": list(req.messages or []), "max_tokens": 4}
            response = await client.post(f"{decision.url}/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        attempt.finish(Outcome(OutcomeKind.COMPLETED, cached_tokens=cached))
        await attempt.settled()
        return decision, cached

    try:
        async with Collector(config, store):

            async def both_healthy() -> bool:
                snaps = await store.snapshots(fleet.endpoint_ids)
                return all(e in snaps and snaps[e].healthy for e in fleet.endpoint_ids)

            await eventually(both_healthy, 30, "healthy snapshots of both engines")

            # Cold: the engine that serves it really caches the prompt (confirmed by its KV events).
            one, _ = await serve(chat(candidates=[second]))
            assert one.endpoint == second

            async def confirmed() -> bool:
                held = await store.match_prefix(MODEL, list(one.keys), [first, second])
                return second in held and held[second].blocks == len(one.keys) and first not in held

            await eventually(confirmed, 15, "the prompt's blocks confirmed by the engine's events")

            # Warm: a follow-up sharing the system prompt goes to that engine, and the hit is what we predicted.
            two, achieved = await serve(chat("And what about eviction?"))
            assert two.endpoint == second, two.explain()
            assert two.predicted_cached_tokens > 0.9 * two.prompt_tokens  # the shared system prompt is most of it
            assert achieved == two.predicted_cached_tokens, two.explain()
            assert router.stats.achieved_cached_tokens == achieved
    finally:
        fleet.stop()
        await router.close()


async def eventually(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_snapshot_another_process_writes_counts_at_the_next_decision(
    config: CognitoraConfig, store: Store, request: pytest.FixtureRequest
) -> None:
    # The collector writes snapshots through its own store (its own Redis client); the router must not keep
    # deciding on the snapshots it read before.
    scraper = store
    if isinstance(store, RedisStore):
        scraper = RedisStore.from_url(request.getfixturevalue("redis_server_url"), key_prefix=store.keys.prefix)
    router = Router(config, store)
    try:
        keys = (await router.place(chat())).keys
        await store.add_blocks(MODEL, A, list(keys))
        now = time.time()
        await scraper.put_snapshot(EndpointSnapshot(A, last_seen=now))
        await scraper.put_snapshot(EndpointSnapshot(B, last_seen=now))
        assert (await router.place(chat())).endpoint == A
        assert (await router.place(chat())).endpoint == A

        await scraper.put_snapshot(EndpointSnapshot(A, healthy=False, last_seen=now + 1))
        failing = await router.place(chat())
        assert failing.endpoint == B, failing.explain()
        assert "unhealthy" in {c.endpoint: c.excluded for c in failing.candidates}[A]

        await scraper.put_snapshot(EndpointSnapshot(A, healthy=True, last_seen=now + 2))
        assert (await router.place(chat())).endpoint == A
    finally:
        if scraper is not store:
            await scraper.close()


# -- stale state: the collector's heartbeat ---------------------------------------------------------------------


async def test_a_dead_collectors_heartbeat_makes_decisions_say_the_state_is_stale(
    smollm2_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(smollm2_dir, placement={"state_max_age_s": 10})
    clock = [1_700_000_000.0]
    store = MemoryStore(clock=lambda: clock[0])
    router = Router(config, store, clock=lambda: clock[0])
    await store.put_heartbeat("collector host-a pid 1", ttl_s=86400)
    clock[0] += 5
    fresh = await router.place(chat())
    assert not fresh.stale_state and fresh.state_age_s == 5 and "stale" not in fresh.reason
    assert router.stats.stale_state == 0

    clock[0] += 30  # the collector died 35 s ago
    with caplog.at_level("WARNING", logger="cognitora.router"):
        first = await router.place(chat())
        second = await router.place(chat())
    assert first.stale_state and first.state_age_s == 35 and first.endpoint in {A, B}  # still placed
    assert second.stale_state
    assert "newest collector heartbeat (collector host-a pid 1) is 35 s old" in first.reason
    assert "state_max_age_s (10 s)" in first.reason
    assert "stale: the fleet state is 35 s old" in first.explain()
    assert router.stats.stale_state == 2
    warnings = [r.getMessage() for r in caplog.records if "stale state" in r.getMessage()]
    assert len(warnings) == 1 and "is `cognitora collector` running" in warnings[0]  # once a minute, not per request

    caplog.clear()
    await store.put_heartbeat("collector host-a pid 2", ttl_s=86400)  # a collector is back
    with caplog.at_level("WARNING", logger="cognitora.router"):
        back = await router.place(chat())
    assert not back.stale_state and back.state_age_s == 0
    assert any("fleet state fresh again" in r.getMessage() for r in caplog.records)
    assert router.stats.stale_state == 2


async def test_no_collector_heartbeat_at_all_is_stale_once_the_router_has_waited_for_one(smollm2_dir: Path) -> None:
    config = make_config(smollm2_dir, placement={"state_max_age_s": 10})
    clock = [1_700_000_000.0]
    router = Router(config, MemoryStore(clock=lambda: clock[0]), clock=lambda: clock[0])
    assert not (await router.place(chat())).stale_state  # just started: a collector may be starting beside it
    clock[0] += 11
    decision = await router.place(chat())
    assert decision.stale_state and decision.state_age_s is None
    assert "no collector heartbeat in the store 11 s after this router started" in decision.reason
    assert "stale: no collector heartbeat in the store" in decision.explain()


async def test_the_collector_beats_until_it_stops_then_the_router_sees_its_state_go_stale(
    smollm2_dir: Path, store: Store
) -> None:
    config = make_config(smollm2_dir, placement={"state_max_age_s": 0.5, "store_timeout_s": 5.0})
    router = Router(config, store)
    collector = Collector(config, store)  # (its scrapes fail: nothing listens at A or B; it beats all the same)
    await collector.start()
    try:
        beats = await store.heartbeats()
        assert list(beats) == [collector.name] and collector.name.startswith("collector ")
        first = beats[collector.name].at

        async def beat_again() -> bool:
            return (await store.heartbeats())[collector.name].at > first

        await eventually(beat_again, 10, "a second heartbeat (every quarter of state_max_age_s)")
        assert not (await router.place(chat())).stale_state
    finally:
        await collector.stop()

    async def stale() -> bool:
        return (await router.place(chat())).stale_state

    await eventually(stale, 10, "decisions to say the state is stale once the collector stopped")
    assert router.stats.stale_state >= 1
