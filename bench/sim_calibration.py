"""Calibration of the simulated engine: its step model next to published numbers, measured through a live fleet.

    .venv/bin/python bench/sim_calibration.py [--quick]

1. For each profile, what the step model predicts (prefill throughput, ITL against batch size, TTFT against prompt
   length) next to the published measurements it was calibrated to (docs/sim.md lists the sources).
2. The same quantities measured on a live `cognitora sim fleet` over HTTP (engine-time numbers from its /metrics),
   which checks that the scheduler, chunked prefill and batching actually deliver what the model says.
3. The CPU cost of a 16-engine fleet serving 20 requests/s in aggregate (open loop, Poisson arrivals, streamed):
   the fleet process's CPU seconds (utime + stime from /proc) divided by wall seconds.

Writes bench/results/sim_calibration.json and bench/results/sim_calibration.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cognitora_sim.launch import SimFleet, start_fleet  # noqa: E402
from cognitora_sim.profiles import PROFILES, predicted_itl, predicted_ttft  # noqa: E402

RESULTS = ROOT / "bench" / "results"

# Published numbers the profiles were calibrated against (docs/sim.md has the full citations).
PUBLISHED: dict[str, list[dict[str, Any]]] = {
    "h100": [
        {
            "what": "decode tok/s, 1 request (A100-40GB measured 75 tok/s = 77% of its 1.56 TB/s roofline; the same "
            "efficiency at H100's 3.35 TB/s)",
            "value": 160.0,
            "unit": "tok/s",
            "source": "johnmusgrave.com/p/vllm-throughput-latency-sweep-on (vLLM 0.23, Llama-3.1-8B BF16), scaled",
        },
        {
            "what": "saturated output throughput, 1x H100",
            "value": 12500.0,
            "unit": "tok/s",
            "source": "morphllm.com/vllm-benchmarks (Llama 3.1 8B BF16, 1x H100 80GB, third-party benchmark)",
        },
    ],
    "h100x2": [
        {
            "what": "decode tok/s, 1 request (roofline: 32.8 GB per GPU at ~2.8 TB/s + all-reduce)",
            "value": 68.0,
            "unit": "tok/s",
            "source": "derived from H100 SXM spec (3.35 TB/s); no public measurement found",
        },
    ],
    "mac": [
        {
            "what": "decode tok/s, 1 request, short context (M3 Ultra, 819 GB/s)",
            "value": 119.4,
            "unit": "tok/s",
            "source": "raullenchai/Rapid-MLX PR #586 (mlx-community/Meta-Llama-3.1-8B-Instruct-4bit)",
        },
        {
            "what": "prefill tok/s, 33,898-token prompt (Mistral-7B 4-bit, M2 Ultra)",
            "value": 869.3,
            "unit": "tok/s",
            "source": "ml-explore/mlx-lm PR #40",
        },
    ],
}


def model_table() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, p in PROFILES.items():
        if name not in PUBLISHED:
            continue
        out[name] = {
            "description": p.description,
            "prefill_tok_s": {str(n): n / predicted_ttft(p, n) for n in (1024, 8192, 33898)},
            "ttft_ms": {str(n): 1000 * predicted_ttft(p, n) for n in (128, 1024, 4096, 16384)},
            "itl_ms_ctx1024": {
                str(b): 1000 * predicted_itl(p, b, 1024) for b in (1, 8, 32, 128, 256) if b <= p.max_num_seqs
            },
            "decode_tok_s_batch1": 1 / predicted_itl(p, 1, 1024),
            "saturated_output_tok_s": p.max_num_seqs / predicted_itl(p, p.max_num_seqs, 1024),
            "published": PUBLISHED.get(name, []),
        }
    return out


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for s in fam.samples:
            if "le" in s.labels:
                continue
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def ids(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


async def _complete(session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int) -> None:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


def measured_engine(profile: str, quick: bool, log_dir: Path) -> dict[str, Any]:
    """TTFT, prefill throughput and ITL measured on one live engine (engine time, from /metrics)."""
    rng = random.Random(7)
    result: dict[str, Any] = {"ttft_ms": {}, "prefill_tok_s": {}, "itl_ms_ctx1024": {}}
    p = PROFILES[profile]
    scale = 20.0 if profile == "mac" else 5.0
    with start_fleet(1, profile=profile, time_scale=scale, log_dir=log_dir) as fleet:
        url = fleet.urls[0]
        lengths = (128, 1024, 4096) if quick else (128, 1024, 4096, 16384)
        for n in lengths:
            before = scrape(url)
            asyncio.run(_one(url, ids(n, rng), 1))
            after = scrape(url)
            ttft = after["vllm:time_to_first_token_seconds_sum"] - before["vllm:time_to_first_token_seconds_sum"]
            result["ttft_ms"][str(n)] = 1000 * ttft
            result["prefill_tok_s"][str(n)] = n / ttft
        batches = [b for b in (1, 8, 32, 128) if b <= p.max_num_seqs]
        for b in batches:
            itl = asyncio.run(_steady_itl(url, [ids(1024, rng) for _ in range(b)]))
            result["itl_ms_ctx1024"][str(b)] = 1000 * itl
    return result


async def _ascrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "le" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def _steady_itl(url: str, prompts: list[list[int]]) -> float:
    """ITL of a pure decode batch: measured between two scrapes taken once every request has its first token
    (so no prefill step of the same batch is counted)."""
    b = len(prompts)
    connector = aiohttp.TCPConnector(limit=0)  # the default pool (100) would cap the batch
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as s:
        start = await _ascrape(s, url)
        tasks = [asyncio.create_task(_complete(s, url, pr, 400)) for pr in prompts]
        while True:
            m = await _ascrape(s, url)
            if m["vllm:time_to_first_token_seconds_count"] - start["vllm:time_to_first_token_seconds_count"] >= b:
                break
            await asyncio.sleep(0.005)
        first = m
        while True:  # at least 20 decode steps of the whole batch
            await asyncio.sleep(0.02)
            second = await _ascrape(s, url)
            n = second["vllm:inter_token_latency_seconds_count"] - first["vllm:inter_token_latency_seconds_count"]
            if n >= 20 * b:
                break
        await asyncio.gather(*tasks)
    n = second["vllm:inter_token_latency_seconds_count"] - first["vllm:inter_token_latency_seconds_count"]
    total = second["vllm:inter_token_latency_seconds_sum"] - first["vllm:inter_token_latency_seconds_sum"]
    return total / n


async def _one(url: str, prompt: list[int], max_tokens: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await _complete(s, url, prompt, max_tokens)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


async def _open_loop(fleet: SimFleet, rate: float, duration: float, seed: int) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` req/s over the fleet, round robin; ~1,000-token prompts sharing 8 system
    prefixes; 128 streamed output tokens (include_usage); returns client-side counts."""
    rng = random.Random(seed)
    prefixes = [ids(768, rng) for _ in range(8)]
    done = {"ok": 0, "failed": 0, "tokens": 0}

    async def one(session: aiohttp.ClientSession, url: str, prompt: list[int]) -> None:
        body = {
            "model": "smollm2",
            "prompt": prompt,
            "max_tokens": 128,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {") and b'"usage"' in line:
                        done["tokens"] += json.loads(line[6:])["usage"]["completion_tokens"]
            done["ok"] += 1
        except aiohttp.ClientError:
            done["failed"] += 1

    tasks = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        t_end = time.monotonic() + duration
        i = 0
        while time.monotonic() < t_end:
            prompt = prefixes[rng.randrange(8)] + ids(rng.randint(100, 400), rng)
            tasks.append(asyncio.create_task(one(session, fleet.urls[i % fleet.n], prompt)))
            i += 1
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return done


def cpu_cost(engines: int, rate: float, duration: float, chunk: int, log_dir: Path) -> dict[str, Any]:
    with start_fleet(
        engines, time_scale=1.0, extra_args=["--stream-chunk-tokens", str(chunk)], log_dir=log_dir
    ) as fleet:
        pid = fleet.process.pid
        time.sleep(1.0)
        idle0, idle_t0 = _cpu_seconds(pid), time.monotonic()
        time.sleep(3.0)
        idle_cpu = (_cpu_seconds(pid) - idle0) / (time.monotonic() - idle_t0)
        cpu0, t0 = _cpu_seconds(pid), time.monotonic()
        counts = asyncio.run(_open_loop(fleet, rate, duration, seed=11))
        wall = time.monotonic() - t0
        cpu = _cpu_seconds(pid) - cpu0
        hits = sum(scrape(u)["vllm:prefix_cache_hits_total"] for u in fleet.urls)
        queries = sum(scrape(u)["vllm:prefix_cache_queries_total"] for u in fleet.urls)
    return {
        "engines": engines,
        "rate_req_s": rate,
        "duration_s": duration,
        "stream_chunk_tokens": chunk,
        "requests_ok": counts["ok"],
        "requests_failed": counts["failed"],
        "output_tokens": counts["tokens"],
        "fleet_cpu_s": cpu,
        "wall_s": wall,
        "cpu_fraction_of_one_core": cpu / wall,
        "cpu_fraction_of_machine": cpu / wall / (os.cpu_count() or 1),
        "idle_cpu_fraction_of_one_core": idle_cpu,
        "prefix_hit_rate": hits / queries if queries else 0.0,
    }


def render_md(data: dict[str, Any]) -> str:
    lines = ["# Simulated engine calibration", "", f"Command: `{data['command']}`  ", f"Date: {data['date']}", ""]
    for name, m in data["model"].items():
        meas = data["measured"].get(name)
        lines += [
            f"## `{name}`: {m['description']}",
            "",
            "| quantity | model | measured on the live sim |",
            "|---|---|---|",
        ]
        for n, v in m["ttft_ms"].items():
            got = meas["ttft_ms"].get(n) if meas else None
            lines.append(
                f"| TTFT, {n}-token prompt, no cache hit | {v:.1f} ms | {'' if got is None else f'{got:.1f} ms'} |"
            )
        for n, v in m["prefill_tok_s"].items():
            got = meas["prefill_tok_s"].get(n) if meas else None
            lines.append(
                f"| prefill throughput, {n} tokens | {v:,.0f} tok/s | {'' if got is None else f'{got:,.0f} tok/s'} |"
            )
        for b, v in m["itl_ms_ctx1024"].items():
            got = meas["itl_ms_ctx1024"].get(b) if meas else None
            lines.append(f"| ITL, batch {b}, ~1k context | {v:.2f} ms | {'' if got is None else f'{got:.2f} ms'} |")
        lines.append(f"| decode, 1 request | {m['decode_tok_s_batch1']:.0f} tok/s | |")
        lines.append(f"| saturated output (max_num_seqs) | {m['saturated_output_tok_s']:,.0f} tok/s | |")
        lines += ["", "Published numbers it is calibrated against:", ""]
        for pub in m["published"]:
            lines.append(f"- {pub['what']}: **{pub['value']:,.1f} {pub['unit']}** ({pub['source']})")
        lines.append("")
    lines += [
        "## CPU cost of the simulator",
        "",
        "| engines | req/s | chunk tokens | requests | output tokens | fleet CPU / wall (one core) | share of the "
        "machine | idle fleet CPU | prefix hit rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in data["cpu"]:
        lines.append(
            f"| {c['engines']} | {c['rate_req_s']:.0f} | {c['stream_chunk_tokens']} | {c['requests_ok']} "
            f"(+{c['requests_failed']} failed) | {c['output_tokens']} | "
            f"{100 * c['cpu_fraction_of_one_core']:.0f}% | {100 * c['cpu_fraction_of_machine']:.0f}% | "
            f"{100 * c['idle_cpu_fraction_of_one_core']:.1f}% | {100 * c['prefix_hit_rate']:.0f}% |"
        )
    lines += ["", "The machine is shared (2 cores, other jobs running), so CPU shares are indicative.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of the 20 req/s CPU run")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="sim-calibration-"))
    duration = 10.0 if args.quick else args.duration
    data: dict[str, Any] = {
        "command": "python bench/sim_calibration.py" + (" --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": model_table(),
        # Profiles judged against published GPU/Mac figures; `cpu` is judged by real engines (bench.real_engines).
        "measured": {name: measured_engine(name, args.quick, log_dir) for name in PROFILES if name in PUBLISHED},
        "cpu": [cpu_cost(16, 20.0, duration, chunk, log_dir) for chunk in (1, 4)],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sim_calibration.json").write_text(json.dumps(data, indent=2) + "\n")
    (RESULTS / "sim_calibration.md").write_text(render_md(data))
    print(render_md(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
