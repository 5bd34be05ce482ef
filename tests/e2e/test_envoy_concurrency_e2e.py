"""End to end through Envoy at more concurrent requests than Envoy's default circuit breakers allow.

Every request holds an ext_proc stream to ``cognitora extproc`` for its whole life (the service reads the response
headers and the first body chunk), and Envoy counts those streams against the ``cognitora_extproc`` cluster's
``max_requests``, 1,024 by default. With the default, the 1,025th concurrent request got a 503 "the placement
service is unavailable", and so did every one after it until some finished: the B2B SaaS benchmark at 60 rps
failed 270 of 510 requests that way (Errors in
``git show 34d9396:bench/results/protocol_b2b-saas_prefill_stall_seed20251130.md``).
``examples/envoy.yaml`` now sizes the breakers; this test holds 1,100 streams open at once through it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.launch import start_fleet

pytestmark = pytest.mark.e2e

CONCURRENT = 1_100  # past Envoy's default max_requests of 1,024 per cluster
WAVE = 50
DEADLINE_S = 120.0


async def hold_streams(url: str, model: str, n: int) -> tuple[Counter[int], str]:
    """Open ``n`` streaming completions and hold them all open; return their status codes once all have answered
    (or failed), and the first refusal's body."""
    answered: Counter[int] = Counter()
    refusals: list[str] = []
    all_answered = asyncio.Event()
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {
            "model": model,
            "prompt": f"request {i}: " + "tell me a long story about routers " * 8,
            "max_tokens": 4000,  # far longer than the test: every stream is still open when the last one answers
            "stream": True,
        }
        try:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                answered[r.status_code] += 1
                if r.status_code != 200:
                    refusals.append((await r.aread()).decode(errors="replace")[:300])
                if sum(answered.values()) >= n:
                    all_answered.set()
                await all_answered.wait()  # hold the stream (and its ext_proc stream) open until everyone answered
        except httpx.HTTPError as e:
            answered[-1] += 1
            if sum(answered.values()) >= n:
                all_answered.set()
            raise AssertionError(f"request {i}: {e!r}") from e

    async def ramp(client: httpx.AsyncClient, tasks: list[asyncio.Task[None]]) -> None:
        # In waves, each once the last has answered: the streams pile up as a busy gateway's do, and no wave is
        # a burst of placements queueing past the filter's 2 s message timeout on a 2-core machine.
        for start in range(0, n, WAVE):
            tasks.extend(asyncio.create_task(one(client, i)) for i in range(start, min(n, start + WAVE)))
            while sum(answered.values()) < min(n, start + WAVE):
                await asyncio.sleep(0.02)
        await all_answered.wait()

    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(DEADLINE_S)) as client:
        tasks: list[asyncio.Task[None]] = []
        try:
            await asyncio.wait_for(ramp(client, tasks), DEADLINE_S)
        finally:
            all_answered.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return answered, refusals[0] if refusals else ""


def breaker_overflows(admin_url: str) -> dict[str, int]:
    """The ext_proc and engine clusters' circuit-breaker overflow counters that are not 0, from Envoy's admin
    ``/stats``: on the engines' (HTTP/1.1, a connection per request) ``upstream_cx_overflow`` counts requests that
    waited inside Envoy for a connection, placed but unseen by the engine."""
    text = httpx.get(
        f"{admin_url}/stats", params={"filter": r"cluster\.(cognitora_extproc|engines)\..*overflow"}, timeout=10
    ).text
    counts = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().isdigit() and int(value) > 0:
            counts[name] = int(value)
    return counts


def test_the_ext_proc_breakers_refuse_no_stream_past_envoys_default_of_1024(tmp_path: Path, smollm2_dir: Path) -> None:
    with start_fleet(4, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet:
        config = {"models": [fleet.model_config(smollm2_dir / "tokenizer.json")]}
        config_path = tmp_path / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        with start_gateway(config_path, fleet.endpoint_ids, tmp_path) as stack:
            started = time.monotonic()
            statuses, refusal = asyncio.run(hold_streams(stack.url, fleet.model, CONCURRENT))
            overflows = breaker_overflows(stack.admin_url)
            seen = f"{dict(statuses)} after {time.monotonic() - started:.0f} s; first refusal: {refusal}"
            # The breakers never refused a stream: with Envoy's defaults, 76 overflowed here (exactly 1,024 served).
            assert overflows == {}, f"{overflows}; {seen}"
            # Every stream got an answer: served, or failed closed. On a starved CI machine some streams do fail
            # closed past the ext_proc message_timeout (2 s), a separate limit (9, then 79 of 1,100 in two CI
            # runs while the rest of the suite ran; none on a quiet machine): that is not counted against the fix.
            assert sum(statuses.values()) == CONCURRENT and set(statuses) <= {200, 503}, seen
            assert statuses[200] > 0, f"{seen}; extproc log tail:\n{stack.extproc.log_tail(20)}"
