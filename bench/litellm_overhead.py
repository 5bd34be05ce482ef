"""Decision time Cognitora adds inside LiteLLM: the routing-strategy call, timed in-process, against simple-shuffle.

    .venv/bin/python bench/litellm_overhead.py [--iterations 200] [--rounds 3] [--out bench/results/litellm_overhead]

One process, one event loop, two ``litellm.Router`` objects over the same four deployments:

- ``simple-shuffle``: LiteLLM's default strategy (the baseline: LiteLLM's own healthy-deployment filtering + a
  random pick);
- ``cognitora``: the plugin (the same filtering, then tokenize the chat, look up the prompt's block keys in the
  store, read in-flight counts and scraped snapshots, place, and count the dispatch), in embedded mode (in-process
  store and collector) and in Redis mode (the shared store; ``cognitora collector`` runs as a separate process).

Both Routers are built inside the running loop, as the proxy builds its own, so Cognitora's core runs on that loop.
What is timed is ``Router.async_get_available_deployment`` (what ``acompletion`` awaits before it calls the
engine); each Cognitora pick is then reported finished (not timed), as the proxy's callbacks would.

Prompts: 8 distinct system prompts of ~2k, ~8k and ~32k tokens (SmolLM2's tokenizer and chat template), each with
a fresh question per request; the store holds every system prompt's blocks on one engine (as after warm-up), so
each lookup walks the whole chain. The engines are a simulated fleet (so the collector's scrapes succeed); no
completion is sent. Calls interleave in shuffled order so machine noise hits all alike: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cognitora_sim.tokenizer import SMOLLM2_DIR

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SIZES = {"2k": 2_000, "8k": 8_000, "32k": 32_000}
N_SYSTEM_PROMPTS = 8
TOKENIZER = SMOLLM2_DIR / "tokenizer.json"


def system_prompt(i: int, tokens: int, tokenizer: Any) -> str:
    """About ``tokens`` tokens of distinct text (measured with the model's tokenizer)."""
    rng = random.Random(i * 1_000_003 + tokens)
    words: list[str] = []
    text = ""
    while True:
        words.extend(f"w{rng.randrange(1_000_000)}" for _ in range(200))
        text = f"System prompt {i}. " + " ".join(words)
        if len(tokenizer.encode(text).ids) >= tokens:
            return text


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def measure_mode(
    mode: str, fleet: Any, prompts: dict[str, list[str]], iterations: int, redis_url: str | None, tmp: Path
) -> dict[str, Any]:
    import litellm

    import litellm_plugin
    from cognitora.request import RouteRequest
    from litellm_plugin.export import to_yaml
    from litellm_plugin.translate import failure_outcome

    callbacks = litellm_plugin.install().callbacks

    model_list = [
        {
            "model_name": "chat",
            "litellm_params": {"model": "openai/smollm2", "api_base": f"{url}/v1", "api_key": "none"},
            "model_info": {"id": f"engine-{i}", "cognitora_engine": "vllm"},  # openai/ alone is not an engine
        }
        for i, url in enumerate(fleet.urls)
    ]
    args: dict[str, Any] = {"models": [{"name": "chat", "tokenizer": str(TOKENIZER)}]}
    collector = None
    if redis_url is not None:
        args.update(redis_url=redis_url, key_prefix=f"bench-litellm-{os.getpid()}")
    baseline = litellm.Router(model_list=model_list, routing_strategy="simple-shuffle")
    router = litellm.Router(model_list=model_list, routing_strategy="cognitora", routing_strategy_args=args)
    strategy = litellm_plugin.strategy_for(router)
    host = strategy.host
    if redis_url is not None:
        cfg = tmp / f"cognitora-{mode}.yaml"
        cfg.write_text(to_yaml(strategy.fleet.config))
        collector = subprocess.Popen(
            [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    # The store holds each system prompt's blocks on one engine, as after warm-up traffic.
    from kvstate.prompt import ChatTokenizer, PromptKeyer

    keyer = PromptKeyer("chat", 16, ChatTokenizer(TOKENIZER))
    endpoints = [f"127.0.0.1:{url.rsplit(':', 1)[1]}" for url in fleet.urls]
    for size, texts in prompts.items():
        for i, text in enumerate(texts):
            keys = keyer.keys_for_chat([{"role": "system", "content": text}]).keys

            async def add(core: Any, keys: list[int] = keys, ep: str = endpoints[i % 4]) -> None:
                await core.store.add_blocks("chat", ep, keys)

            await host.call(add)
        del size
    await asyncio.sleep(2.0)  # a few scrapes: every endpoint has a snapshot

    rng = random.Random(7)
    results: dict[str, Any] = {}
    for size, texts in prompts.items():
        times: dict[str, list[float]] = {
            "simple-shuffle": [],
            "cognitora": [],
            "core-place": [],
            "core-no-checkpoint": [],
            "core-no-memo": [],
        }
        # warm-up: first tokenization of each long system prompt, connection set-up
        for text in texts:
            msgs = [{"role": "system", "content": text}, {"role": "user", "content": "warm-up"}]
            await _pick(router, msgs, callbacks, host, failure_outcome)
        for n in range(iterations):
            text = texts[n % len(texts)]
            messages = [{"role": "system", "content": text}, {"role": "user", "content": f"Question {rng.random()}?"}]
            order = list(times)
            rng.shuffle(order)
            for name in order:
                if name == "cognitora":
                    times[name].append(await _pick(router, messages, callbacks, host, failure_outcome))
                elif name.startswith("core-"):
                    # The decision core alone (no LiteLLM, no adapter): what the adapter wraps. "no-checkpoint": the
                    # same with prefix-match checkpoints off (the store walks the whole prompt each time);
                    # "no-memo": the block-key memo bypassed too (the code before either), interleaved in one run.
                    req = RouteRequest(model="chat", messages=messages, candidates=tuple(endpoints))
                    start = time.perf_counter()
                    await host.call(lambda core, req=req, name=name: _place(core, req, name))
                    times[name].append(time.perf_counter() - start)
                else:
                    start = time.perf_counter()
                    await baseline.async_get_available_deployment(
                        model="chat", messages=messages, request_kwargs={"metadata": {}}
                    )
                    times[name].append(time.perf_counter() - start)
        row: dict[str, Any] = {}
        for name, values in times.items():
            ms = [v * 1000 for v in values]
            row[name] = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "mean_ms": statistics.fmean(ms)}
        row["added_p50_ms"] = row["cognitora"]["p50_ms"] - row["simple-shuffle"]["p50_ms"]
        row["added_p99_ms"] = row["cognitora"]["p99_ms"] - row["simple-shuffle"]["p99_ms"]
        row["adapter_p50_ms"] = row["added_p50_ms"] - row["core-place"]["p50_ms"]
        results[size] = row

    async def stats(core: Any) -> Any:
        return core.stats

    core_stats = await host.call(stats)
    results["core"] = {"placed": core_stats.placed, "degraded": core_stats.degraded, "rejected": core_stats.rejected}
    router.update_settings(routing_strategy="simple-shuffle")  # stops the embedded core
    await asyncio.sleep(0.2)
    if collector is not None:
        collector.terminate()
        collector.wait(timeout=10)
    if redis_url is not None:
        import redis.asyncio as aioredis

        client = aioredis.from_url(redis_url)
        async for key in client.scan_iter(match=f"{args['key_prefix']}*"):
            await client.delete(key)
        await client.aclose()
    return results


async def _place(core: Any, req: Any, variant: str) -> Any:
    keyer = core.prompt_keyer("chat")
    entries, ttl = keyer.key_memo.max_bytes, core.fleet.checkpoints.ttl_s
    if variant == "core-no-memo":
        keyer.key_memo.max_bytes = 0
    if variant != "core-place":
        core.fleet.checkpoints.ttl_s = 0.0
    try:
        return await core.place(req)
    finally:
        keyer.key_memo.max_bytes, core.fleet.checkpoints.ttl_s = entries, ttl


async def _pick(router: Any, messages: list[dict[str, str]], callbacks: Any, host: Any, failure_outcome: Any) -> float:
    """One timed Cognitora pick, then its end reported (untimed), as the proxy's callbacks would."""
    request_kwargs: dict[str, Any] = {"metadata": {}}
    start = time.perf_counter()
    await router.async_get_available_deployment(model="chat", messages=messages, request_kwargs=request_kwargs)
    elapsed = time.perf_counter() - start
    attempt = host.attempt(request_kwargs["metadata"]["cognitora_request_id"])
    attempt.finish(failure_outcome("benchmark: not sent"))
    await host.call(lambda _: attempt.settled())
    return elapsed


def render(report: dict[str, Any]) -> str:
    lines = [
        "# Decision time Cognitora adds inside LiteLLM",
        "",
        f"Command: `{report['command']}`  ",
        f"LiteLLM {report['litellm']}, Python {report['python']}, {report['machine']}; "
        f"{report['iterations']} picks per strategy and prompt size, in shuffled order; ms of wall time. "
        f"Load average (1 min) at start / end: {report['load_start']:.1f} / {report['load_end']:.1f}.",
        "",
        "Timed: `Router.async_get_available_deployment` (what `acompletion` awaits before calling the engine), "
        "in-process, both Routers built inside the running loop as the proxy does. simple-shuffle = LiteLLM's "
        "default strategy over the same deployments; added = cognitora - simple-shuffle. core place = "
        "`cognitora.router.Router.place` called directly on the same prompts (tokenize, block keys, store reads, "
        "placement): the part of `added` that is the decision core's, not the adapter's. no checkpoint = the same "
        "with prefix-match checkpoints off (limits.match_checkpoint_ttl_s: 0; the store walks the whole prompt); "
        "no key memo = with the block-key memo (kvstate/key_memo.py) bypassed too, i.e. before either; all "
        "interleaved in the same run. The dispatch's store write is not in the timed path: it runs while LiteLLM "
        "calls the engine.",
        "",
        "| mode | prompt | simple-shuffle p50 | p99 | cognitora p50 | p99 | added p50 | added p99 "
        "| core place p50 | p99 | no checkpoint p50 | p99 | no key memo p50 | p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, rows in report["modes"].items():
        for size in SIZES:
            r = rows[size]
            lines.append(
                f"| {mode} | {size} | {r['simple-shuffle']['p50_ms']:.2f} | {r['simple-shuffle']['p99_ms']:.2f} | "
                f"{r['cognitora']['p50_ms']:.2f} | {r['cognitora']['p99_ms']:.2f} | {r['added_p50_ms']:.2f} | "
                f"{r['added_p99_ms']:.2f} | {r['core-place']['p50_ms']:.2f} | {r['core-place']['p99_ms']:.2f} | "
                f"{r['core-no-checkpoint']['p50_ms']:.2f} | {r['core-no-checkpoint']['p99_ms']:.2f} | "
                f"{r['core-no-memo']['p50_ms']:.2f} | {r['core-no-memo']['p99_ms']:.2f} |"
            )
    target = report["modes"].get("redis", {}).get("8k")
    if target is not None:
        verdict = "met" if target["cognitora"]["p99_ms"] <= 3.0 else "NOT met"
        lines += [
            "",
            f"Target p99 <= 3 ms for 8k prompts with Redis: {verdict} "
            f"(cognitora p99 {target['cognitora']['p99_ms']:.2f} ms, added p99 {target['added_p99_ms']:.2f} ms).",
        ]
    rounds = report.get("rounds", [])
    if len(rounds) > 1:
        lines += ["", f"Each cell is the median over {len(rounds)} rounds. 8k with Redis, round by round:", ""]
        for i, modes in enumerate(rounds, 1):
            r = modes["redis"]["8k"]
            lines.append(
                f"- round {i}: cognitora p50 {r['cognitora']['p50_ms']:.2f} / p99 {r['cognitora']['p99_ms']:.2f} ms; "
                f"core place p50 {r['core-place']['p50_ms']:.2f} / p99 {r['core-place']['p99_ms']:.2f} ms"
            )
    lines += [
        "",
        "Core counters per mode (a degraded decision means the store was not read in time):",
        "",
    ]
    for mode, rows in report["modes"].items():
        lines.append(f"- {mode}: {rows['core']}")
    lines += ["", report["note"], ""]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from importlib.metadata import version

    from tokenizers import Tokenizer

    from bench.harness.redis_server import redis_url
    from cognitora_sim.launch import start_fleet

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    prompts = {
        size: [system_prompt(i, tokens, tokenizer) for i in range(N_SYSTEM_PROMPTS)] for size, tokens in SIZES.items()
    }
    report: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "litellm": version("litellm"),
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} CPUs shared with other work",
        "iterations": args.iterations,
        "modes": {},
        "load_start": os.getloadavg()[0],
        "note": (
            f"The {os.cpu_count()} cores also run the simulated fleet, the collector and Redis, and whatever else ran "
            "(the load average above): p99 is sensitive to that; the shuffled interleaving keeps the comparison "
            "fair within a run."
        ),
    }
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, start_fleet(4, time_scale=10, log_dir=Path(tmp)) as fleet:
        for _ in range(args.rounds):
            modes = {"embedded": await measure_mode("embedded", fleet, prompts, args.iterations, None, Path(tmp))}
            with redis_url() as url:
                modes["redis"] = await measure_mode("redis", fleet, prompts, args.iterations, url, Path(tmp))
            rounds.append(modes)
    report["rounds"] = rounds
    report["modes"] = median_of_rounds(rounds)
    report["load_end"] = os.getloadavg()[0]
    return report


def median_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Every number of the rounds' reports replaced by its median over the rounds (one round: itself)."""

    def merge(values: list[Any]) -> Any:
        if isinstance(values[0], dict):
            return {k: merge([v[k] for v in values]) for k in values[0]}
        if isinstance(values[0], int | float):
            return statistics.median(values)
        return values[0]

    return merge(rounds)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat the whole measurement; the table shows each cell's median"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "litellm_overhead")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
