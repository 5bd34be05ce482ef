"""``litellm_plugin.install()`` then ``litellm.Router(routing_strategy="cognitora")``, against a real simulated fleet.

Sync, async, streamed and not; embedded mode (in-process store + collector) and Redis mode (shared store, the
collector running beside the gateway). What a user of the Router sees: answers, where they were served, the
achieved prefix-cache hit, the errors for refusals and unknown models, and a dead engine costing no request.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import litellm
import pytest

import litellm_plugin
from cognitora.collector import Collector
from cognitora_sim.harness.process import free_port
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.open import open_store
from kvstate.store import InFlight

callbacks = litellm_plugin.install().callbacks  # what the Router reports attempts' ends to

SYSTEM = "You are the support assistant of the Acme Rocket Company. " * 60  # ~700 tokens shared by every request


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    with start_fleet(
        2, time_scale=20, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path_factory.mktemp("sim")
    ) as f:
        yield f


def _model_list(fleet: SimFleet, dead_port: int | None = None) -> list[dict[str, Any]]:
    out = [
        {
            "model_name": "chat",
            "litellm_params": {"model": "openai/smollm2", "api_base": f"{url}/v1", "api_key": "none"},
            "model_info": {"id": f"engine-{i}", "cognitora_kv_events": ev, "cognitora_kv_events_replay": rp},
        }
        for i, (url, ev, rp) in enumerate(zip(fleet.urls, fleet.events_addresses, fleet.replay_addresses, strict=True))
    ]
    if dead_port is not None:
        out.append(
            {
                "model_name": "chat",
                "litellm_params": {
                    "model": "openai/smollm2",
                    "api_base": f"http://127.0.0.1:{dead_port}/v1",
                    "api_key": "none",
                },
                "model_info": {"id": "dead", "cognitora_engine": "vllm"},  # an engine of the fleet, down
            }
        )
    return out


def _args(smollm2_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "chat", "tokenizer": str(smollm2_dir / "tokenizer.json")}],
        "scrape": {"interval_s": 0.2},
        **extra,
    }


def _messages(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def _served_by(response: Any) -> str:
    return str(response._hidden_params.get("api_base", ""))


def _cached(response: Any) -> int:
    details = response.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def _core_stats(router: litellm.Router) -> Any:
    host = litellm_plugin.strategy_for(router).host

    async def stats(core: Any) -> Any:
        return core.stats

    return host.call_sync(stats)


def test_sync_router_routes_through_cognitora_and_reuses_the_cache(fleet: SimFleet, smollm2_dir: Path) -> None:
    # Built outside any event loop: the core runs on Cognitora's own thread; sync and async calls share it.
    hosted = {  # a hosted provider (no api_base): not an engine, LiteLLM's own pick applies
        "model_name": "hosted",
        "litellm_params": {"model": "openai/gpt-hosted", "api_key": "none", "mock_response": "from the cloud"},
    }
    router = litellm.Router(
        model_list=[*_model_list(fleet), hosted],
        routing_strategy="cognitora",
        routing_strategy_args=_args(smollm2_dir),
    )
    try:
        assert router.routing_strategy == "cognitora"
        cloud = router.completion(model="hosted", messages=_messages("hi"))
        assert cloud.choices[0].message.content == "from the cloud"
        first = router.completion(model="chat", messages=_messages("How fast is the X1?"), max_tokens=4)
        assert first.choices[0].message.content
        later = [router.completion(model="chat", messages=_messages(f"Question {i}?"), max_tokens=4) for i in range(4)]
        # Later requests share the ~700-token system prompt with an engine that already holds it. (The first
        # may go to the idle engine: the previous request's release is reported just after its response.)
        assert sum(_cached(r) >= 600 for r in later) >= 3, [_cached(r) for r in later]

        async def streamed() -> tuple[str, int]:
            stream = await router.acompletion(model="chat", messages=_messages("Stream it."), max_tokens=8, stream=True)
            text = ""
            async for chunk in stream:
                text += chunk.choices[0].delta.content or ""
            again = await router.acompletion(model="chat", messages=_messages("And async?"), max_tokens=4)
            async with asyncio.timeout(10):  # the stream's end is reported by a logging task on this loop
                while callbacks.open_attempts():
                    await asyncio.sleep(0.02)
            return text, _cached(again)

        text, cached = asyncio.run(streamed())
        assert text and cached >= 600
        stats = _core_stats(router)
        assert stats.dispatched == 7
        _wait(lambda: _core_stats(router).finished_ok == 7, f"every attempt reported finished: {_core_stats(router)}")
        # The core heard the achieved hits: at least the >= 3 later ones plus the last async one.
        assert _core_stats(router).achieved_cached_tokens >= 4 * 600
        assert callbacks.open_attempts() == []
    finally:
        router.update_settings(routing_strategy="simple-shuffle")  # uninstalls: stops the core's thread
    assert "async_get_available_deployment" not in vars(router)


def test_a_group_mixing_engines_and_a_cloud_deployment_is_placed_on_the_engines_only(
    fleet: SimFleet, smollm2_dir: Path
) -> None:
    cloud = {  # same group, an api_base, no cognitora_ key: not an engine (a later burst target), never scraped
        "model_name": "chat",
        "litellm_params": {
            "model": "azure/gpt-4o-mini",
            "api_base": "https://cognitora-test.openai.azure.com",
            "api_key": "none",
            "api_version": "2024-06-01",
            "mock_response": "from the cloud",
        },
        "model_info": {"id": "cloud"},
    }
    router = litellm.Router(
        model_list=[*_model_list(fleet), cloud], routing_strategy="cognitora", routing_strategy_args=_args(smollm2_dir)
    )
    try:
        model = litellm_plugin.strategy_for(router).fleet.config.model("chat")
        assert [e.id for e in model.endpoints] == fleet.endpoint_ids  # what the collector scrapes
        answers = [
            router.completion(model="chat", messages=_messages("Go.", system=f"Topic {i}. " * 40), max_tokens=2)
            for i in range(8)
        ]
        assert [a.choices[0].message.content for a in answers if a.choices[0].message.content == "from the cloud"] == []
        assert {_served_by(a) for a in answers} <= {f"{url}/v1" for url in fleet.urls}
    finally:
        router.update_settings(routing_strategy="simple-shuffle")


async def test_async_router_in_redis_mode_with_a_dead_engine_and_refusals(
    fleet: SimFleet, smollm2_dir: Path, redis_server_url: str, key_prefix: str
) -> None:
    args = _args(
        smollm2_dir,
        redis_url=redis_server_url,
        key_prefix=key_prefix,
        placement={
            "priorities": {
                "default": {"ttft_slo_s": 5.0},
                "batch": {"ttft_slo_s": 1e-9, "sheddable": True},  # never met: always shed
            }
        },
    )
    dead_port = free_port()
    model_list = _model_list(fleet, dead_port=dead_port)
    # Redis mode: the gateway only reads the store; the collector runs beside it (here, in this process).
    from litellm_plugin.fleet import build_fleet

    collector_store = open_store(redis_server_url, key_prefix)
    collector = Collector(build_fleet(model_list, args).config, collector_store)
    await collector.start()
    router = litellm.Router(
        model_list=model_list, routing_strategy="cognitora", routing_strategy_args=args, num_retries=2
    )
    try:
        served: list[str] = []
        for i in range(6):
            response = await router.acompletion(model="chat", messages=_messages(f"Q{i}"), max_tokens=4)
            served.append(_served_by(response))
        # The dead engine was tried at most once: its connection failure marked it unhealthy, LiteLLM's retry
        # re-entered the strategy, and every request was answered by a live engine.
        assert all(str(dead_port) not in s for s in served)
        stats = _core_stats_async(router)
        assert (await stats).marked_unhealthy <= 1

        with pytest.raises(litellm.RateLimitError) as refused:
            await router.acompletion(
                model="chat",
                messages=_messages("bulk job"),
                max_tokens=4,
                metadata={"user_api_key_metadata": {"cognitora_priority": "batch"}},
            )
        assert refused.value.status_code == 429 and (refused.value.headers or {}).get("retry-after")

        with pytest.raises(litellm.BadRequestError):
            await router.acompletion(model="no-such-model", messages=_messages("hi"), max_tokens=4)
        assert callbacks.open_attempts() == []
    finally:
        router.update_settings(routing_strategy="simple-shuffle")
        await collector.stop()
        await collector_store.close()


async def _core_stats_async(router: litellm.Router) -> Any:
    async def stats(core: Any) -> Any:
        return core.stats

    return await litellm_plugin.strategy_for(router).host.call(stats)


def _wait(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    from cognitora_sim.harness.process import wait_until

    wait_until(condition, timeout_s, what)


async def test_sdk_stream_without_a_first_token_hook_stops_queueing_at_its_deadline(
    fleet: SimFleet, smollm2_dir: Path
) -> None:
    """LiteLLM's SDK streams report no first token: the core stops counting the prefill after its deadline rather
    than for the stream's whole life; the stream's end (read by the caller) releases the rest."""
    args = _args(smollm2_dir, placement={"prefill_report_min_s": 0.4, "prefill_report_factor": 1.0})
    router = litellm.Router(model_list=_model_list(fleet), routing_strategy="cognitora", routing_strategy_args=args)
    host = litellm_plugin.strategy_for(router).host

    async def inflight(core: Any) -> Any:
        return await core.store.inflight(fleet.endpoint_ids)

    try:
        stream = await router.acompletion(
            model="chat", messages=_messages("Tell me a long story."), max_tokens=400, stream=True
        )
        first = await stream.__anext__()  # the first chunk is here; the SDK tells no hook about it
        assert first is not None
        queued = await host.call(inflight)
        assert sum(w.requests for w in queued.values()) == 1
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            work = await host.call(inflight)
            if sum(w.prefill_tokens for w in work.values()) == 0:
                break
            assert asyncio.get_running_loop().time() < deadline, f"prefill still queued mid-stream: {work}"
            await asyncio.sleep(0.05)
        assert sum(w.requests for w in work.values()) == 1  # the stream itself still counts
        async for _ in stream:
            pass
        async with asyncio.timeout(10):  # the stream's end is reported by a logging task on this loop
            while callbacks.open_attempts() or set((await host.call(inflight)).values()) != {InFlight()}:
                await asyncio.sleep(0.05)
        assert set((await host.call(inflight)).values()) == {InFlight()}
    finally:
        router.update_settings(routing_strategy="simple-shuffle")


async def test_a_client_naming_an_engines_deployment_id_is_still_placed_and_shed(
    fleet: SimFleet, smollm2_dir: Path
) -> None:
    """``"model": "engine-1"`` used to go straight to that engine: unplaced, uncounted, never shed. Now it is placed
    within its model group, unless an admin lets the key pin engines."""
    args = _args(
        smollm2_dir,
        placement={"priorities": {"default": {"ttft_slo_s": 5.0}, "batch": {"ttft_slo_s": 1e-9, "sheddable": True}}},
    )
    router = litellm.Router(model_list=_model_list(fleet), routing_strategy="cognitora", routing_strategy_args=args)
    host = litellm_plugin.strategy_for(router).host

    async def decisions(core: Any) -> Any:
        return core.recent_decisions()

    try:
        batch = {"user_api_key_metadata": {"cognitora_priority": "batch"}}
        with pytest.raises(litellm.RateLimitError):
            await router.acompletion(model="engine-1", messages=_messages("bulk"), max_tokens=2, metadata=batch)

        served = await router.acompletion(model="engine-1", messages=_messages("named"), max_tokens=2)
        (shed, placed) = (await host.call(decisions))[-2:]
        assert shed.rejection is not None and shed.rejection.status == 429
        assert placed.model == "chat" and placed.endpoint is not None
        assert "may not pin" in placed.reason
        assert fleet.urls[fleet.endpoint_ids.index(placed.endpoint)] in _served_by(served)

        pins = {"user_api_key_metadata": {"cognitora_allow_pinning": True}}
        for _ in range(3):
            pinned = await router.acompletion(model="engine-1", messages=_messages("pin"), max_tokens=2, metadata=pins)
            assert fleet.urls[1] in _served_by(pinned)
        assert all(d.endpoint == fleet.endpoint_ids[1] for d in (await host.call(decisions))[-3:])
    finally:
        router.update_settings(routing_strategy="simple-shuffle")


async def test_an_absurd_max_tokens_is_a_400_naming_the_field_and_reaches_no_engine(
    fleet: SimFleet, smollm2_dir: Path
) -> None:
    router = litellm.Router(
        model_list=_model_list(fleet), routing_strategy="cognitora", routing_strategy_args=_args(smollm2_dir)
    )
    host = litellm_plugin.strategy_for(router).host

    async def dispatched(core: Any) -> int:
        return int(core.stats.dispatched)

    try:
        served = await router.acompletion(model="chat", messages=_messages("fine"), max_tokens=2)
        assert _served_by(served)
        before = await host.call(dispatched)
        for absurd in (1e20, 10**20):
            with pytest.raises(litellm.BadRequestError) as err:
                await router.acompletion(model="chat", messages=_messages("absurd"), max_tokens=absurd)
            assert "cognitora: 'max_tokens'" in str(err.value)
        assert "must be a whole number of tokens" in str(err.value) or "more than any model" in str(err.value)
        assert await host.call(dispatched) == before  # refused before placement counted anything
    finally:
        router.update_settings(routing_strategy="simple-shuffle")
