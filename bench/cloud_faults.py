"""``python -m bench.cloud_faults``: the cloud fault matrix, through both gateways (issue 39).

    python -m bench.cloud_faults --gateways envoy,litellm --seeds 3 --out bench/results/cloud_faults

Each gateway runs as bench/cloud_stacks.py starts it (Envoy on examples/envoy.yaml + envoy_burst.yaml with
``cognitora extproc``; the LiteLLM proxy on examples/litellm_burst.yaml), in front of one slow simulated engine and
the simulated cloud (``cognitora sim cloud``). For each fault of the cloud (none, 500, 503, 429, reset, hang, slow:
``/admin/fault``) and each seed, open-loop Poisson traffic of a team allowed to burst, in the class no local engine
serves in time (``instant``: every request is sent out while the breaker lets it), for ``--phase-s`` seconds:

- client-visible errors (a status other than 200, or a broken stream): 0 when the fleet can serve;
- cloud calls: all requests that reached the cloud; those made after the breaker opened (polled from the gateway's
  metrics page every 100 ms), and of them the half-open requests the core counted (``cognitora_cloud_breaker_probes``);
- the share answered by the cloud, and the client's time to first token (p50/p99).

Before each run the cloud is healthy and the breaker closed (a hold-off of an earlier run is waited out). The
arrivals and prompts follow the seed. Results: ``<out>.json`` and ``<out>.md`` (mean and min-max over the seeds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.burst_load import Answer, chat
from bench.cloud_stacks import INSTANT, CloudStack, envoy_stack, litellm_stack
from cognitora_sim.tokenizer import SMOLLM2_DIR

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ("none", "500", "503", "429", "reset", "hang", "slow")
SLOW_MS = 1500


@dataclass
class Run:
    gateway: str
    fault: str
    seed: int
    requests: int
    errors: int
    from_cloud: int
    cloud_calls: int
    calls_after_open: int
    """Cloud calls made after the breaker was first seen open in this run (a poll every 100 ms)."""
    half_open_probes: int
    breaker_opened: int
    ttft_p50_s: float
    ttft_p99_s: float
    error_samples: list[str]


class Watch:
    """Polls the gateway's page and the cloud's count every 100 ms: the cloud's count when the breaker first opened."""

    def __init__(self, stack: CloudStack) -> None:
        self.stack = stack
        self.at_open: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                state = self.stack.breaker()
                received = self.stack.cloud.received()
            except httpx.HTTPError:
                continue
            if self.at_open is None and state in ("open", "half_open"):
                self.at_open = received
                return

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def poisson_traffic(stack: CloudStack, seed: int, rate: float, seconds: float) -> list[Answer]:
    rng = random.Random(seed)
    headers = stack.auth("research", INSTANT)

    async def run() -> list[Answer]:
        tasks: list[asyncio.Task[Answer]] = []
        async with httpx.AsyncClient(timeout=120) as client:
            start = time.monotonic()
            at = 0.0
            i = 0
            while at < seconds:
                delay = start + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(safe(client, f"s{seed}-{i}-{rng.random():.6f}")))
                i += 1
                at += rng.expovariate(rate)
            return list(await asyncio.gather(*tasks))

    async def safe(client: httpx.AsyncClient, tag: str) -> Answer:
        try:
            return await chat(client, stack.url, headers, tag, 8, stack.model, words=20)
        except httpx.HTTPError as exc:
            return Answer(0, None, "", f"{type(exc).__name__}: {exc}")

    return asyncio.run(run())


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


def one_run(stack: CloudStack, fault: str, seed: int, rate: float, seconds: float) -> Run:
    stack.close_breaker()
    opened = stack.counter("cognitora_cloud_breaker_opened_total")
    probes = stack.counter("cognitora_cloud_breaker_probes_total")
    before = stack.cloud.received()
    stack.cloud.fault(fault, slow_ms=SLOW_MS)
    try:
        with Watch(stack) as watch:
            answers = poisson_traffic(stack, seed, rate, seconds)
    finally:
        stack.cloud.fault("none")
    received = stack.cloud.received()
    errors = [a for a in answers if a.status != 200]
    ttfts = [a.ttft_s for a in answers if a.ttft_s is not None]
    return Run(
        gateway=stack.gateway,
        fault=fault,
        seed=seed,
        requests=len(answers),
        errors=len(errors),
        from_cloud=sum(a.cloud(stack.cloud_marks) for a in answers),
        cloud_calls=received - before,
        calls_after_open=0 if watch.at_open is None else received - watch.at_open,
        half_open_probes=int(stack.counter("cognitora_cloud_breaker_probes_total") - probes),
        breaker_opened=int(stack.counter("cognitora_cloud_breaker_opened_total") - opened),
        ttft_p50_s=quantile(ttfts, 0.5),
        ttft_p99_s=quantile(ttfts, 0.99),
        error_samples=[f"{a.status} {a.error[:120]}" for a in errors[:3]],
    )


@contextmanager
def stack_for(gateway: str, work: Path) -> Iterator[CloudStack]:
    starter: AbstractContextManager[CloudStack] = (
        envoy_stack(work, SMOLLM2_DIR) if gateway == "envoy" else litellm_stack(work, SMOLLM2_DIR)
    )
    with starter as stack:
        yield stack


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    for gateway in dict.fromkeys(r.gateway for r in runs):
        for fault in dict.fromkeys(r.fault for r in runs):
            group = [r for r in runs if (r.gateway, r.fault) == (gateway, fault)]
            if not group:
                continue
            row: dict[str, Any] = {"gateway": gateway, "fault": fault, "seeds": len(group)}
            for name in (
                "requests",
                "errors",
                "from_cloud",
                "cloud_calls",
                "calls_after_open",
                "half_open_probes",
                "ttft_p50_s",
                "ttft_p99_s",
            ):
                values = [float(getattr(r, name)) for r in group]
                row[name] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], command: str, args: argparse.Namespace) -> str:
    def cell(v: dict[str, float], digits: int = 1) -> str:
        if v["min"] == v["max"]:
            return f"{v['mean']:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{v['mean']:.0f}"
        return f"{v['mean']:.{digits}f} ({v['min']:.{digits}f}-{v['max']:.{digits}f})"

    out = [
        "# Cloud fault matrix (both gateways)",
        "",
        f"Command: `{command}`",
        "",
        f"Open-loop Poisson traffic at {args.rate:g} req/s for {args.phase_s:g} s per run, {args.seeds} seeds, "
        "streamed chat requests of a team allowed to burst in a class no local engine serves in time (every request "
        "is sent to the cloud while the breaker lets it); one slow simulated engine (`mac`), `cognitora sim cloud` "
        f"failing as the row says from the first request of the run (`slow`: {SLOW_MS} ms late). Breaker: first "
        "hold-off 5 s through Envoy, 10 s through LiteLLM (the proxy retries a wave of failures slower on this "
        "machine), doubling per failed half-open request. Each cell: mean over the seeds (min-max when they differ).",
        "",
        "| gateway | cloud fault | requests | client errors | answered by the cloud | cloud calls | calls after the "
        "breaker opened | of them half-open | TTFT p50 s | TTFT p99 s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['gateway']} | {r['fault']} | {cell(r['requests'], 0)} | {cell(r['errors'], 0)} | "
            f"{cell(r['from_cloud'], 1)} | {cell(r['cloud_calls'], 1)} | {cell(r['calls_after_open'], 1)} | "
            f"{cell(r['half_open_probes'], 1)} | {cell(r['ttft_p50_s'], 2)} | {cell(r['ttft_p99_s'], 2)} |"
        )
    return "\n".join([*out, "", *READING]) + "\n"


READING = [
    "Reading it:",
    "",
    "- **500, 503, 429, reset**: the first request fails (the engine answers it: Envoy's retry on the aggregate "
    "cluster, LiteLLM's `num_retries`), the breaker opens, and the cloud gets one more call per run: the half-open "
    "request once the hold-off is over, which fails and doubles the hold-off. A second call before the first "
    "failure came back happens when two requests arrive within its round trip (LiteLLM 500, one seed).",
    "- **hang**: no failure is known before the first hung request gives up (10 s: Envoy's `per_try_idle_timeout`, "
    "LiteLLM's `stream_timeout`); until then requests go out until the target's `max_concurrency` (16) is taken, "
    "and those 16 wait 10 s before the engine answers them; the others stay local at once (`cloud_at_capacity`). "
    "Every slot is given back when they give up (before: LiteLLM's 600 s default kept them).",
    "- **slow**: a slow answer is an answer (a cloud slower than the SLO may still beat a saturated fleet): no "
    'hold-off. The few local answers are the class\'s probes (`cognitora_burst_probes_total{result="too_slow"}`: '
    "one a second while the engine is idle; the 1 ms SLO of this class is never met, so none releases it).",
    "- Before this change (issue 39's measurements, Envoy): a cloud 500 reached 24 of 24 clients and the cloud was "
    "called 24 times; a reset gave 6 of 24 clients a 503; a hung cloud held each burst request up to the route's "
    "600 s; through LiteLLM a hung cloud kept 16 slots for over 5 minutes.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cloud_faults", description=__doc__.splitlines()[0])
    p.add_argument("--gateways", default="envoy,litellm")
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rate", type=float, default=3.0, help="requests per second")
    p.add_argument("--phase-s", type=float, default=12.0, help="seconds of traffic per run")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cloud_faults")
    args = p.parse_args(argv)
    command = "python -m bench.cloud_faults " + " ".join(argv if argv is not None else sys.argv[1:])
    runs: list[Run] = []
    for gateway in args.gateways.split(","):
        with (
            tempfile.TemporaryDirectory(prefix=f"cloud-faults-{gateway}-") as work,
            stack_for(gateway, Path(work)) as s,
        ):
            for fault in args.faults.split(","):
                for seed in range(args.seeds):
                    run = one_run(s, fault, seed, args.rate, args.phase_s)
                    runs.append(run)
                    print(json.dumps(asdict(run)), flush=True)
    rows = summarize(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"command": command, "runs": [asdict(r) for r in runs], "summary": rows}, indent=2) + "\n"
    )
    args.out.with_suffix(".md").write_text(markdown(rows, command, args))
    print(markdown(rows, command, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
