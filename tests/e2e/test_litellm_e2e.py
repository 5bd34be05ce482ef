"""The real ``litellm`` proxy CLI started with examples/litellm_config.yaml, routing through Cognitora to a simulated
fleet of 4 vLLM engines, in embedded mode and in Redis mode (``cognitora collector`` running beside it).

What a user of the proxy sees: requests sharing a system prompt keep landing on the engine that holds it and come
back with high ``cached_tokens``; an engine made slow gets fewer new requests; an engine killed mid-run costs no
request that could go elsewhere; an unknown model gets LiteLLM's normal error.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cognitora_sim.harness.process import ManagedProcess, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.redis_store import RedisStore
from kvstate.store import InFlight
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "litellm_config.yaml"

N_ENGINES = 4
N_PROMPTS = 8
SLOW_ROUNDS = 7
"""Rounds of 32 requests within which an engine slowed 50x must lose at least half its share of new requests."""
TOPICS = ["rockets", "tax law", "gardening", "databases", "chess", "cooking", "astronomy", "sailing"]


def system_prompt(i: int, salt: str = "") -> str:
    """A long (~5,000-token) system prompt, distinct from the first words on (and per ``salt``)."""
    rng = random.Random(f"{i}-{salt}")
    words = [f"{TOPICS[i]}-{rng.randrange(10_000)}" for _ in range(900)]
    return f"You are the {TOPICS[i]} assistant #{i}{salt}. Reference material follows. " + " ".join(words)


@dataclass
class Answer:
    status: int
    prompt: int
    engine: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    body: Any = None


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    with start_fleet(
        N_ENGINES,
        time_scale=5,
        tokenizer=smollm2_dir / "tokenizer.json",
        log_dir=tmp_path_factory.mktemp("sim"),
    ) as f:
        yield f


BATCH_KEY = "sk-e2e-batch-jobs"
"""A key whose (admin-set) metadata puts its requests in the sheddable ``batch`` class."""

# No database here: a static key -> identity map stands in for LiteLLM's virtual keys (general_settings.custom_auth).
AUTH_MODULE = f"""
import os
from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key == "{BATCH_KEY}":
        return UserAPIKeyAuth(api_key=key, team_id="batch-jobs", metadata={{"cognitora_priority": "batch"}})
    raise HTTPException(status_code=401, detail="unknown key")
"""


def write_config(
    tmp: Path,
    fleet: SimFleet,
    smollm2_dir: Path,
    redis_url: str | None,
    key_prefix: str,
    batch_key: bool = False,
) -> Path:
    """A copy of the example with the fleet's real ports, the shared tokenizer and (Redis mode) the store.

    ``batch_key``: also a key in a ``batch`` priority class whose SLO no engine can meet, so it is always shed.
    """
    config = yaml.safe_load(EXAMPLE.read_text())
    deployments = config["model_list"]
    assert len(deployments) == N_ENGINES, "the example describes a 4-engine fleet"
    for dep, url, events, replay in zip(
        deployments, fleet.urls, fleet.events_addresses, fleet.replay_addresses, strict=True
    ):
        dep["litellm_params"]["api_base"] = f"{url}/v1"
        dep["model_info"]["cognitora_kv_events"] = events
        dep["model_info"]["cognitora_kv_events_replay"] = replay
    args = config["router_settings"]["routing_strategy_args"]
    args["models"][0]["tokenizer"] = str(smollm2_dir / "tokenizer.json")
    # A scrape answered late on this shared machine must not read as a dead engine: the full second to answer.
    args["scrape"] = {"interval_s": 1.0, "timeout_s": 1.0}
    if redis_url is not None:
        args["redis_url"] = redis_url
        args["key_prefix"] = key_prefix
        # This machine's 2 cores (and its Redis) are shared by every test running at once: a read can take longer
        # than the production default of 0.25 s, and a decision made without the store ("degraded") ignores the
        # cache. This test is about the cached path, so it gives the store more time.
        args["placement"] = {"store_timeout_s": 2.0}
        # Short, so the test that stops the collector sees the proxy say the state is stale within seconds.
        args["placement"]["state_max_age_s"] = 3.0
    if batch_key:
        (tmp / "e2e_auth.py").write_text(AUTH_MODULE)
        config["general_settings"]["custom_auth"] = "e2e_auth.user_api_key_auth"
        args.setdefault("placement", {})["priorities"] = {
            "default": {"ttft_slo_s": 2.0},
            "batch": {"ttft_slo_s": 1e-9, "sheddable": True},
        }
    path = tmp / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def chat(client: httpx.AsyncClient, proxy: LiteLLMProxy, prompt: int, question: str, stream: bool) -> Answer:
    body: dict[str, Any] = {
        "model": "chat",
        "messages": [
            {"role": "system", "content": system_prompt(prompt, proxy.salt)},
            {"role": "user", "content": question},
        ],
        "max_tokens": 16,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {proxy.key}"}
    if not stream:
        resp = await client.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers)
        answer = Answer(resp.status_code, prompt, resp.headers.get("x-litellm-model-api-base", ""))
        if resp.status_code == 200:
            usage = resp.json()["usage"]
            answer.prompt_tokens = usage["prompt_tokens"]
            answer.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        else:
            answer.body = resp.text
        return answer
    async with client.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, headers=headers) as resp:
        answer = Answer(resp.status_code, prompt, resp.headers.get("x-litellm-model-api-base", ""))
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            usage = json.loads(line[6:]).get("usage")
            if usage:
                answer.prompt_tokens = usage["prompt_tokens"]
                answer.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        if resp.status_code != 200:
            answer.body = "stream failed"
    return answer


async def run_traffic(proxy: LiteLLMProxy, jobs: list[tuple[int, str, bool]], concurrency: int = 8) -> list[Answer]:
    queue: asyncio.Queue[tuple[int, str, bool]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    answers: list[Answer] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            prompt, question, stream = queue.get_nowait()
            answers.append(await chat(client, proxy, prompt, question, stream))

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return answers


def question(round_: int, q: int, prompt: int) -> str:
    """A question with a pasted paragraph (~200 tokens): each request brings its own prefill work too."""
    rng = random.Random(f"{round_}-{q}-{prompt}")
    paragraph = " ".join(f"note{rng.randrange(100_000)}" for _ in range(60))
    return f"Round {round_}, question {q} about {TOPICS[prompt]}: what do these notes mean? {paragraph}"


def jobs(round_: int, per_prompt: int, stream_share: float = 0.3, seed: int = 0) -> list[tuple[int, str, bool]]:
    rng = random.Random(seed + round_)
    out = [
        (p, question(round_, q, p), rng.random() < stream_share) for p in range(N_PROMPTS) for q in range(per_prompt)
    ]
    rng.shuffle(out)
    return out


def affinity(earlier: list[Answer], answers: list[Answer]) -> float:
    """Share of ``answers`` that landed on an engine already holding their system prompt (one that served it before,
    in completion order). 1.0 = every request went where its prompt was cached; with 4 engines, chance is ~0.25."""
    holders: dict[int, set[str]] = defaultdict(set)
    for a in earlier:
        holders[a.prompt].add(a.engine)
    sticky = 0
    for a in answers:
        sticky += a.engine in holders[a.prompt]
        holders[a.prompt].add(a.engine)
    return sticky / max(1, len(answers))


def hit_ratio(answers: list[Answer]) -> float:
    return statistics.fmean(a.cached_tokens / a.prompt_tokens for a in answers if a.prompt_tokens)


async def check_gateway(proxy: LiteLLMProxy, fleet: SimFleet, chaos: bool) -> dict[str, Any]:
    """Warm up, then assert stickiness and hits; with ``chaos``, also a slow engine and a crashed one."""
    warm = await run_traffic(proxy, [(p, "warm-up question?", False) for p in range(N_PROMPTS)])
    assert all(a.status == 200 for a in warm), [a.body for a in warm if a.status != 200]
    steady = await run_traffic(proxy, jobs(1, per_prompt=5))
    assert all(a.status == 200 for a in steady), [a.body for a in steady if a.status != 200]
    assert {a.engine for a in steady} <= {f"{u}/v1" for u in fleet.urls}
    figures: dict[str, Any] = {
        "affinity": affinity(warm, steady),
        "hit_ratio": hit_ratio(steady),
        "engines_per_prompt": statistics.fmean(
            len({a.engine for a in warm + steady if a.prompt == p}) for p in range(N_PROMPTS)
        ),
    }
    # Requests sharing a prompt keep landing on the engine that holds it; the fleet has ample headroom here.
    assert figures["affinity"] >= 0.85, figures
    assert figures["hit_ratio"] >= 0.75, figures
    figures["engines_used"] = len({a.engine for a in steady})  # how the core spread prompts (power rule may pack)

    if chaos:
        counts = Counter(a.engine for a in steady)
        slow = fleet.urls.index(counts.most_common(1)[0][0].removesuffix("/v1"))
        fleet.fault(slow, "slow", factor=50.0)
        try:
            # Its slowness shows only as the core learns it (the engine's prefill-time metrics, its in-flight
            # work): give it a bounded number of rounds, and require the share to fall within them.
            before = counts[f"{fleet.urls[slow]}/v1"] / len(steady)
            shares: list[float] = []
            for round_ in range(2, 2 + SLOW_ROUNDS):
                slowed = await run_traffic(proxy, jobs(round_, per_prompt=4), concurrency=12)
                assert all(a.status == 200 for a in slowed)
                shares.append(sum(a.engine == f"{fleet.urls[slow]}/v1" for a in slowed) / len(slowed))
                if shares[-1] < before * 0.5:
                    break
            figures.update(slow_share_before=before, slow_share_rounds=shares)
            assert shares[-1] < before * 0.5, json.dumps(figures)
        finally:
            fleet.fault(slow, "recover")

        victim = (slow + 1) % N_ENGINES
        crash_jobs = jobs(9, per_prompt=6, stream_share=0.0)
        traffic = asyncio.ensure_future(run_traffic(proxy, crash_jobs, concurrency=12))
        await asyncio.sleep(0.3)  # mid-run: requests are in flight on every engine
        await asyncio.to_thread(fleet.fault, victim, "crash")
        crashed = await traffic
        failed = [a.body for a in crashed if a.status != 200]
        # Non-streamed requests in flight on the dead engine and new ones alike were answered elsewhere.
        assert not failed, failed
        assert len(crashed) == len(crash_jobs)
        figures["served_after_crash"] = len(crashed)
        fleet.fault(victim, "recover")

    async with httpx.AsyncClient(timeout=30) as client:
        resp = await client.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {proxy.key}"},
        )
    assert resp.status_code in (400, 404), resp.text
    assert "error" in resp.json()

    async with httpx.AsyncClient(timeout=30) as client:  # a float budget (JSON 1e+20) is refused, naming the field
        absurd = await client.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e20},
            headers={"Authorization": f"Bearer {proxy.key}"},
        )
    assert absurd.status_code == 400, absurd.text
    assert "'max_tokens' must be a whole number of tokens" in absurd.json()["error"]["message"]

    async with httpx.AsyncClient(timeout=30) as client:  # the body's shape, by the core's rule Envoy's service uses
        malformed = await client.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]},
            headers={"Authorization": f"Bearer {proxy.key}"},
        )
    assert malformed.status_code == 400, malformed.text
    assert "'chat_template_kwargs' must be an object" in malformed.json()["error"]["message"]

    if chaos:  # (the embedded run's config has the batch key)
        async with httpx.AsyncClient(timeout=30) as client:
            shed = await client.post(
                f"{proxy.url}/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "nightly report"}]},
                headers={"Authorization": f"Bearer {BATCH_KEY}"},
            )
        # A refusal by the core is LiteLLM's 429, with the Retry-After the core chose, and no retries.
        assert shed.status_code == 429, shed.text
        assert int(shed.headers["retry-after"]) >= 1
        assert "cognitora" in shed.json()["error"]["message"]
        figures["shed_status"] = shed.status_code
    return figures


@asynccontextmanager
async def long_stream_after_its_first_token(
    proxy: LiteLLMProxy, fleet: SimFleet, salt: str
) -> AsyncIterator[tuple[str, AsyncIterator[str]]]:
    """A 4,000-token stream through the proxy, opened and read up to its first token: yields the endpoint serving
    it and the rest of its lines. Leaving the block closes the connection, read to the end or not."""
    body = {
        "model": "chat",
        "messages": [{"role": "system", "content": system_prompt(0, salt)}, {"role": "user", "content": "go"}],
        "max_tokens": 4000,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {proxy.key}"}
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status_code == 200
        engine = resp.headers["x-litellm-model-api-base"].removesuffix("/v1")
        lines = resp.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                break  # the first token is out; the stream goes on for seconds
        yield fleet.endpoint_ids[fleet.urls.index(engine)], lines


async def check_stream_prefill_released_at_first_token(
    proxy: LiteLLMProxy, fleet: SimFleet, redis_url: str, key_prefix: str
) -> None:
    """Every gateway sharing the store sees a long stream's prompt stop queueing at its first token, not its end:
    otherwise each long stream counts as queued prefill for its whole life, and placement sees every engine
    swamped by work that is long done."""
    store = RedisStore.from_url(redis_url, key_prefix=key_prefix)
    try:
        async with long_stream_after_its_first_token(proxy, fleet, "first-token") as (endpoint, lines):
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                work = (await store.inflight([endpoint]))[endpoint]
                if work.requests >= 1 and work.prefill_tokens == 0:
                    break
                assert asyncio.get_running_loop().time() < deadline, f"prefill still queued mid-stream: {work}"
                await asyncio.sleep(0.05)
            async for _ in lines:  # read to the end, as a client does
                pass
    finally:
        await store.close()


async def check_abandoned_stream_is_released(
    proxy: LiteLLMProxy, fleet: SimFleet, redis_url: str, key_prefix: str
) -> None:
    """A client that walks away from a long stream: the proxy closes the stream, and the core's count of that
    request (in the store every gateway reads) returns to zero at once, not after the in-flight lease."""
    store = RedisStore.from_url(redis_url, key_prefix=key_prefix)
    try:
        async with long_stream_after_its_first_token(proxy, fleet, "abandon") as (endpoint, _):
            assert (await store.inflight([endpoint]))[endpoint].requests == 1
            # The connection is closed here, thousands of tokens before the stream's end.
        deadline = asyncio.get_running_loop().time() + 15
        while (work := await store.inflight(fleet.endpoint_ids)) != {e: InFlight() for e in fleet.endpoint_ids}:
            assert asyncio.get_running_loop().time() < deadline, f"the abandoned stream is still counted: {work}"
            await asyncio.sleep(0.05)
    finally:
        await store.close()


def test_proxy_embedded_mode(fleet: SimFleet, smollm2_dir: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, fleet, smollm2_dir, redis_url=None, key_prefix="", batch_key=True)
    proxy = LiteLLMProxy(config, tmp_path, salt="embedded")
    try:
        figures = asyncio.run(check_gateway(proxy, fleet, chaos=True))
        print("embedded", figures)
        # The proxy's garbage collections run from the loop (cognitora.ops.gc_pacing): without it, about one run in
        # 20 of this test crashed the proxy inside ContextVar.set (python/cpython#148891).
        assert "garbage collection paced by the event loop" in proxy.log()
    except BaseException:
        print(proxy.process.log_tail(80))
        raise
    finally:
        proxy.stop()


def placing_workers(proxy: LiteLLMProxy) -> int:
    """How many of the proxy's worker processes have started a core (each does at its first request)."""
    return proxy.process.log_path.read_text(errors="replace").count("cognitora core started (redis mode)")


def reach_every_worker(proxy: LiteLLMProxy, workers: int) -> None:
    """Sends bursts of concurrent requests, each burst on fresh connections, until every worker has placed one.
    The kernel hands a new connection to whichever worker accepts first, and nothing makes that fair: in one CI run
    all of a test's traffic went to one worker. The affinity checked afterwards then spans both processes."""
    burst = 0

    def all_placing() -> bool:
        nonlocal burst
        if placing_workers(proxy) >= workers:
            return True
        answers = asyncio.run(run_traffic(proxy, [(0, f"reach every worker {burst}-{i}", False) for i in range(8)]))
        burst += 1
        assert all(a.status == 200 for a in answers), [a.body for a in answers if a.status != 200]
        return placing_workers(proxy) >= workers

    wait_until(all_placing, 120, f"each of the proxy's {workers} workers to place a request")


def test_proxy_redis_mode_with_collector_beside_it(
    fleet: SimFleet, smollm2_dir: Path, tmp_path: Path, redis_server_url: str, key_prefix: str
) -> None:
    """The proxy scaled out as docs/litellm.md says: two worker processes (``--num_workers 2``), one Redis store,
    ``cognitora collector`` beside them. Requests reach either worker, and still land where their prompt is cached:
    what one worker placed, the other sees."""
    config = write_config(tmp_path, fleet, smollm2_dir, redis_url=redis_server_url, key_prefix=key_prefix)
    cognitora_yaml = tmp_path / "cognitora.yaml"
    export = ManagedProcess(
        [sys.executable, "-m", "litellm_plugin.export", str(config), "-o", str(cognitora_yaml)],
        tmp_path / "export.log",
        env={"PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert export.proc.wait(timeout=60) == 0, export.log_tail()
    collector = ManagedProcess(
        [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(cognitora_yaml)],
        tmp_path / "collector.log",
        env={"PYTHONPATH": str(ROOT)},
    )
    try:
        wait_until(lambda: "collector started" in collector.log_tail(200), 30, "the collector to start")
        proxy = LiteLLMProxy(config, tmp_path, salt="redis", workers=2)
        try:
            reach_every_worker(proxy, 2)
            # Both workers now place traffic: the affinity checked here holds across processes.
            figures = asyncio.run(check_gateway(proxy, fleet, chaos=False))
            print("redis", figures)
            asyncio.run(check_stream_prefill_released_at_first_token(proxy, fleet, redis_server_url, key_prefix))
            asyncio.run(check_abandoned_stream_is_released(proxy, fleet, redis_server_url, key_prefix))
            # The collector dies: requests are still served, and the proxy's log says the state is going stale.
            assert "stale state" not in proxy.process.log_tail(5000)
            collector.stop()
            assert collector.proc.returncode == 0, collector.log_tail()
            served: list[Answer] = []

            def says_stale() -> bool:
                served.extend(asyncio.run(run_traffic(proxy, [(0, f"after the collector {len(served)}", False)])))
                return "stale state: the newest collector heartbeat" in proxy.process.log_tail(200)

            wait_until(says_stale, 30, "the proxy to log that the fleet state is stale")
            assert all(a.status == 200 for a in served), [a.body for a in served if a.status != 200]
        except BaseException:
            print(proxy.process.log_tail(80))
            raise
        finally:
            proxy.stop()
    finally:
        collector.stop()
    assert collector.proc.returncode == 0, collector.log_tail()


def test_proxy_with_several_workers_refuses_embedded_mode(tmp_path: Path) -> None:
    """``litellm --num_workers 2`` on the example without redis_url: each worker would keep its own store and
    collector, so the proxy refuses to start and says what to do. It is started from another directory than its
    config, with a tokenizer path relative to the config: the refusal (not "file not found") shows that path was
    read against the config's folder."""
    config = yaml.safe_load(EXAMPLE.read_text())
    args = config["router_settings"]["routing_strategy_args"]
    assert "redis_url" not in args, "the example runs embedded"
    args["models"][0]["tokenizer"] = "tok/tokenizer.json"
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")  # never loaded: the refusal comes first
    path = tmp_path / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proxy = LiteLLMProxy(path, tmp_path, workers=2, cwd=ROOT, ready_s=None).process
    try:
        # uvicorn's parent process exits (with status 0) only once its worker health check gives up on the failed
        # workers, a minute later: the log is what tells why, and what is waited for.
        wait_until(
            lambda: "Application startup failed" in proxy.log_path.read_text(errors="replace") or not proxy.alive(),
            180,
            "the proxy to refuse to start",
        )
        wait_until(lambda: "the proxy runs 2 worker" in proxy.log_path.read_text(errors="replace"), 30, "the reason")
        log = proxy.log_path.read_text(errors="replace")
        assert "ERROR:    Application startup failed. Exiting." in log, proxy.log_tail()
        assert "but the proxy runs 2 worker processes" in log, proxy.log_tail()
        assert "Set redis_url in routing_strategy_args" in log and "cognitora collector" in log
        assert "file not found" not in log
    finally:
        proxy.stop()
