"""Flow control measured side by side: the noisy neighbour, priority under 2x overload, and goodput there.

    python -m bench.flow_bench --seeds 3

One schedule per seed, sent to every target in turn, each in front of a fresh simulated fleet (``bench.run_all``'s
``run_target``: same fleet, loadgen, engine counters). The schedule, in engine seconds:

1. ``alone``: team B alone, a steady light load of short prompts (B's own TTFT: the baseline).
0. ``warmup``: B's load, unmeasured (a fresh target's first requests).
2. ``noisy``: B goes on unchanged while team A sends long prompts at 5x its fair share of the fleet's prefill
   (half the fleet each: A offers 2.5x the whole fleet). B's TTFT p90 here / in ``alone`` is the noisy-neighbour
   ratio (issue 42's bar: within 1.25x).
3. ``gap``: nothing is sent, so the backlog a router let into the engines drains before the next stage.
4. ``over``: 2x overload in two priority classes, ``default`` (TTFT SLO 2 s, the highest) and ``batch`` (30 s,
   sheddable): per class TTFT p99, who waits and who is shed, and goodput (requests whose TTFT met their class's
   SLO, per engine second).

Time scale 1 by default (engine seconds per wall second). Flow control compares its waits with predictions on
the engines' clock (the scraper's learned ``clock_rate``, docs/flow_control.md, "The engines' clock, not the
gateway's"), so any scale is measured alike; before 2026-12-07 its waits ran on the gateway's wall clock and only
scale 1 was right (at scale 2 ``default``'s p99 went from 1.89 s to 3.06 s: "The bench's clock"). A scale below 1
slows the simulated engines so that the gateway's, Envoy's and the load generator's milliseconds on the same 2
cores weigh less against the engines' (as the protocol ladders run, 0.1-0.7). The isolation and priority windows
stay on the gateway's clock (configured seconds). At scale 1 the run takes ~2.3 wall minutes per target.

``--phase noisy`` or ``--phase priority`` runs one part of the schedule (``flow_phase``): the warm-up, then the
noisy-neighbour stages, or the overload stage after a short gap (its arrivals the same, relative to the stage's
start, as in the whole schedule of that seed): what a change to one rule is measured on in a third of the time.

Team and class travel as headers a trusted auth filter would set (``x-bench-team``, ``x-bench-priority``; the
Cognitora Envoy target's extproc is told to trust them). Peers ignore them: they have no notion of team or class.
The Cognitora LiteLLM targets (``cognitora-litellm``, ``cognitora-litellm@flow_control={}``) take identity from
the caller's API key, as an operator's proxy does (litellm_plugin.auth, examples/litellm_config.yaml): each run
mints one random key per (team, class) of the schedule, lists them in the proxy's config as ``os.environ/NAME``
(the values only in its environment, never in a file or the results), and each request sends its team's and
class's key as ``Authorization: Bearer`` (``with_api_keys``)::

    python -m bench.flow_bench --seeds 1 --phase noisy --targets 'cognitora-litellm@flow_control={}'

Results: ``bench/results/flow_bench.{md,json}`` with the exact command.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import signal
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import workloads as wl
from bench.report import Slo, why_unusable
from bench.run_all import RESULTS, FleetSpec, run_target
from bench.run_args import SMOLLM2_TOKENIZER
from bench.targets import (
    BenchApiKey,
    CognitoraEnvoyTarget,
    CognitoraLiteLLMTarget,
    Target,
    mint_api_keys,
    takes_api_keys,
)

__all__ = [
    "PHASES",
    "FlowWorkload",
    "flow_identities",
    "flow_phase",
    "flow_schedule",
    "main",
    "summarize",
    "with_api_keys",
]

TEAM_HEADER = "x-bench-team"
PRIORITY_HEADER = "x-bench-priority"
AUTH_HEADER = "Authorization"
"""Spelled as ``LiteLLMTarget.headers`` spells it, so a request's own key replaces the run's master key."""
CLASS_SLO_S = {"default": 2.0, "batch": 30.0}
"""Cognitora's default priority classes (placement.priorities): the TTFT objective each is judged by."""

DEFAULT_TARGETS = (
    "envoy-rr,sglang-cache-aware,vllm-cache-aware,cognitora-envoy,cognitora-envoy@flow_control={},"
    "cognitora-litellm,cognitora-litellm@flow_control={}"
)
"""Cognitora in both gateways without flow control, and with ``flow_control: {}`` (its defaults: each class's wait
follows its objective), what an operator turns on."""
PHASES = ("all", "noisy", "priority")
"""``--phase``: the whole schedule, or one of its two measured parts (``flow_phase``)."""
PHASE_GAP_S = 12.0
"""``--phase priority``: engine seconds between the warm-up's end and the overload stage: longer than team
isolation's 10 s window (``flow_control.isolation.window_s``), so team B of the warm-up no longer counts as active
in the ``default`` band when team C's requests arrive, as in the whole schedule (B's last request 45 s before).
With 4 s, C's second request was held for isolation beside an idle engine and shed."""


@dataclass(frozen=True)
class FlowWorkload:
    """Rates in requests per engine second, prompts in tokens. Sized for 2 h100x2 engines (~13.3k prefill tok/s
    each, ~26.6k the fleet): A's 3 x 22k = 66k tok/s is 5x its half share; ``over`` offers ~53k tok/s (2x)."""

    alone_s: float = 16.0
    noisy_s: float = 20.0
    gap_s: float = 45.0
    warmup_s: float = 6.0
    over_s: float = 16.0
    b_rate: float = 2.0
    b_tokens: int = 500
    a_rate: float = 3.0
    a_tokens: int = 22_000
    high_rate: float = 1.0
    high_tokens: int = 13_000
    low_rate: float = 2.0
    low_tokens: int = 20_000
    max_tokens: int = 16


def _poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    out: list[float] = []
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return out
        out.append(t)


def flow_schedule(w: FlowWorkload, seed: int) -> wl.Schedule:
    rng = random.Random(seed)
    t_alone = w.warmup_s
    t_noisy = t_alone + w.alone_s
    t_gap = t_noisy + w.noisy_s
    t_over = t_gap + w.gap_s
    streams = [
        ("warmup:B", "B", "default", w.b_rate, w.b_tokens, 0.0, t_alone),
        ("alone:B", "B", "default", w.b_rate, w.b_tokens, t_alone, t_noisy),
        ("noisy:B", "B", "default", w.b_rate, w.b_tokens, t_noisy, t_gap),
        ("noisy:A", "A", "default", w.a_rate, w.a_tokens, t_noisy, t_gap),
        ("over:default", "C", "default", w.high_rate, w.high_tokens, t_over, t_over + w.over_s),
        ("over:batch", "D", "batch", w.low_rate, w.low_tokens, t_over, t_over + w.over_s),
    ]
    arrivals = [
        (t, label, team, cls, tokens)
        for label, team, cls, rate, tokens, start, end in streams
        for t in _poisson(rng, rate, start, end)
    ]
    arrivals.sort()
    requests = [
        wl.BenchRequest(
            index=i,
            arrival_s=t,
            stage=label,
            api="chat",
            # a unique prompt each (no reuse): the long ones cost their whole prefill on any engine
            messages=(wl.MessageSpec("user", (wl.Segment(f"{seed}:{i}", tokens),)),),
            max_tokens=w.max_tokens,
            session=f"{team}:{i}",
            headers=((TEAM_HEADER, team), (PRIORITY_HEADER, cls)),
        )
        for i, (t, label, team, cls, tokens) in enumerate(arrivals)
    ]
    durations = {"warmup": w.warmup_s, "alone": w.alone_s, "noisy": w.noisy_s, "over": w.over_s}
    stages = [
        wl.Stage(label, rate, durations[label.split(":")[0]], measured=not label.startswith("warmup"))
        for label, _, _, rate, _, _, _ in streams
    ]
    return wl.Schedule(
        workload="flow",
        description=(
            f"noisy neighbour + priority overload: {w.warmup_s:g} s unmeasured warm-up (B's load), "
            f"B {w.b_rate:g} rps x {w.b_tokens} tok alone {w.alone_s:g} s, "
            f"then with A {w.a_rate:g} rps x {w.a_tokens} tok for {w.noisy_s:g} s; gap {w.gap_s:g} s; then "
            f"default {w.high_rate:g} rps x {w.high_tokens} + batch {w.low_rate:g} rps x {w.low_tokens} "
            f"for {w.over_s:g} s"
        ),
        requests=requests,
        stages=stages,
    )


def _identity(request: wl.BenchRequest) -> tuple[str, str]:
    headers = dict(request.headers)
    return headers[TEAM_HEADER], headers[PRIORITY_HEADER]


def flow_identities(schedule: wl.Schedule) -> set[tuple[str, str]]:
    """The (team, class) pairs ``schedule``'s requests are sent as."""
    return {_identity(r) for r in schedule.requests}


def with_api_keys(schedule: wl.Schedule, keys: Sequence[BenchApiKey]) -> wl.Schedule:
    """``schedule`` for a target that identifies callers by key (``takes_api_keys``): each request also sends the
    key of its team and class as ``Authorization: Bearer``; without keys, ``schedule`` itself."""
    if not keys:
        return schedule
    bearer = {(k.team, k.priority): f"Bearer {k.key}" for k in keys}
    requests = [replace(r, headers=(*r.headers, (AUTH_HEADER, bearer[_identity(r)]))) for r in schedule.requests]
    return replace(schedule, requests=requests)


def flow_phase(schedule: wl.Schedule, w: FlowWorkload, phase: str) -> wl.Schedule:
    """``schedule`` (``flow_schedule``'s) cut to ``phase``: ``all`` as it is; ``noisy``: the warm-up, B alone and
    beside A; ``priority``: the warm-up, then the overload stage ``PHASE_GAP_S`` after it, its arrivals moved
    earlier by the stages left out (the same requests, at the same offsets into the stage)."""
    if phase == "all":
        return schedule
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: one of {', '.join(PHASES)}")
    keep = ("warmup", "alone", "noisy") if phase == "noisy" else ("warmup", "over")
    shift = 0.0 if phase == "noisy" else w.alone_s + w.noisy_s + w.gap_s - PHASE_GAP_S
    requests = [
        replace(r, arrival_s=r.arrival_s - (shift if r.stage.startswith("over") else 0.0))
        for r in schedule.requests
        if r.stage.split(":")[0] in keep
    ]
    requests = [replace(r, index=i) for i, r in enumerate(requests)]
    stages = [s for s in schedule.stages if s.label.split(":")[0] in keep]
    return replace(
        schedule, description=f"{schedule.description} (phase {phase} only)", requests=requests, stages=stages
    )


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def summarize(raw: Sequence[dict[str, Any]], w: FlowWorkload) -> dict[str, Any]:
    """One target's run: per stream TTFT percentiles (served requests), served / 429 / failed shares; the
    noisy-neighbour ratio; the overload stage's goodput (TTFT within the class's SLO, per engine second)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in raw:
        by.setdefault(r["stage"], []).append(r)
    out: dict[str, Any] = {"streams": {}}
    for label, rs in sorted(by.items()):
        ok = [r for r in rs if r["status"] == 200 and not r["error"]]
        ttfts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
        cls = "batch" if label.endswith("batch") else "default"
        out["streams"][label] = {
            "sent": len(rs),
            "served": len(ok),
            "shed_429": sum(1 for r in rs if r["status"] == 429),
            "failed": sum(1 for r in rs if not (r["status"] == 200 and not r["error"]) and r["status"] != 429),
            "ttft_p50": _pct(ttfts, 0.50),
            "ttft_p90": _pct(ttfts, 0.90),
            "ttft_p99": _pct(ttfts, 0.99),
            "within_slo": sum(1 for t in ttfts if t <= CLASS_SLO_S[cls]),
        }
    s = out["streams"]
    alone, noisy = s.get("alone:B", {}).get("ttft_p90"), s.get("noisy:B", {}).get("ttft_p90")
    out["b_ratio"] = noisy / alone if alone and noisy is not None else None
    over = [s.get("over:default", {}), s.get("over:batch", {})]
    out["goodput"] = sum(x.get("within_slo", 0) for x in over) / w.over_s
    out["goodput_default"] = over[0].get("within_slo", 0) / w.over_s
    return out


def _configure(log_level: str | None, api_keys: Sequence[BenchApiKey] = ()) -> Callable[[Target], None]:
    """Trust the bench's identity headers (Envoy) or list ``api_keys`` (LiteLLM); ``log_level``: the extproc's
    (``info``: a JSON line per decision and per departure from the gateway queue, in ``<workdir>/extproc.log``,
    whose path is printed)."""

    def configure(target: Target) -> None:
        if isinstance(target, CognitoraLiteLLMTarget):
            target.api_keys = tuple(api_keys)
        if isinstance(target, CognitoraEnvoyTarget):
            more = ("--log-level", log_level) if log_level else ()
            target.extproc_args = (
                "--trusted-team-header",
                TEAM_HEADER,
                "--trusted-priority-header",
                PRIORITY_HEADER,
                *more,
            )
            if log_level:
                print(f"  extproc log: {target.workdir / 'extproc.log'}", file=sys.stderr, flush=True)

    return configure


def _spread(values: Sequence[float | None], fmt: str = "{:.2f}") -> str:
    vs = [v for v in values if v is not None]
    if not vs:
        return "-"
    med = statistics.median(vs)
    return f"{fmt.format(med)} ({fmt.format(min(vs))} .. {fmt.format(max(vs))})" if len(vs) > 1 else fmt.format(med)


def render(doc: dict[str, Any]) -> str:
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed_doc in doc["seeds"]:
        for name, summary in seed_doc["targets"].items():
            if summary is not None:
                runs.setdefault(name, []).append(summary)
    lines = [
        "# Flow control side by side: noisy neighbour, priority under 2x overload, goodput",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Started {doc['started_at']}; finished {doc.get('finished_at', '(partial)')}. Seeds: "
        f"{', '.join(str(s['seed']) for s in doc['seeds'])}. Fleet: {doc['fleet']}. Time scale {doc['time_scale']:g} "
        "(engine seconds per wall second; TTFTs below are engine seconds). Each cell: median over seeds (min .. max).",
        "",
        f"Workload: {doc['description']}. Every request: a unique prompt, 16 output tokens.",
        "",
        "## Noisy neighbour: team B's TTFT p90 (s) alone and beside team A",
        "",
        "| target | B alone p90 | B beside A p90 | ratio (bar <= 1.25) | B served | A served | A 429 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, ss in runs.items():
        st = [x["streams"] for x in ss]
        lines.append(
            f"| {name} | {_spread([x.get('alone:B', {}).get('ttft_p90') for x in st])} "
            f"| {_spread([x.get('noisy:B', {}).get('ttft_p90') for x in st])} "
            f"| {_spread([x['b_ratio'] for x in ss])} "
            f"| {_spread([_share(x.get('noisy:B'), 'served') for x in st], '{:.0%}')} "
            f"| {_spread([_share(x.get('noisy:A'), 'served') for x in st], '{:.0%}')} "
            f"| {_spread([_share(x.get('noisy:A'), 'shed_429') for x in st], '{:.0%}')} |"
        )
    lines += [
        "",
        "## Priority under 2x overload: per class TTFT p99 (s), served and shed",
        "",
        "| target | default p99 (SLO 2 s) | default served | default 429 | batch p99 (SLO 30 s) | batch served "
        "| batch 429 | goodput (req/s within SLO) | default goodput |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, ss in runs.items():
        st = [x["streams"] for x in ss]
        d, b = [x.get("over:default") for x in st], [x.get("over:batch") for x in st]
        lines.append(
            f"| {name} | {_spread([x and x['ttft_p99'] for x in d])} "
            f"| {_spread([_share(x, 'served') for x in d], '{:.0%}')} "
            f"| {_spread([_share(x, 'shed_429') for x in d], '{:.0%}')} "
            f"| {_spread([x and x['ttft_p99'] for x in b])} "
            f"| {_spread([_share(x, 'served') for x in b], '{:.0%}')} "
            f"| {_spread([_share(x, 'shed_429') for x in b], '{:.0%}')} "
            f"| {_spread([x['goodput'] for x in ss])} | {_spread([x['goodput_default'] for x in ss])} |"
        )
    lines += ["", "## Per seed goodput ratio to the best peer of that seed", ""]
    for seed_doc in doc["seeds"]:
        t = {k: v for k, v in seed_doc["targets"].items() if v is not None}
        peers = [v["goodput"] for k, v in t.items() if not k.startswith("cognitora")]
        best = max(peers, default=0.0)
        cells = ", ".join(
            f"{k}: {v['goodput'] / best:.2f}x" for k, v in t.items() if k.startswith("cognitora") and best > 0
        )
        lines.append(f"- seed {seed_doc['seed']}: best peer {best:.2f} req/s; {cells or '-'}")
    saturated = [
        f"{k} (seed {s['seed']}): {v['health']['reason']}"
        for s in doc["seeds"]
        for k, v in s["targets"].items()
        if v is not None and v.get("health") and v["health"]["saturated"]
    ]
    if saturated:
        lines += [
            "",
            "The load generator could not keep the schedule (read these runs with care): " + "; ".join(saturated),
        ]
    skipped = [f"{k} (seed {s['seed']}): {v}" for s in doc["seeds"] for k, v in s.get("skipped", {}).items()]
    if skipped:
        lines += ["", "Not run: " + "; ".join(skipped)]
    return "\n".join(lines) + "\n"


def _share(stream: dict[str, Any] | None, key: str) -> float | None:
    if not stream or not stream["sent"]:
        return None
    return float(stream[key]) / stream["sent"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.flow_bench", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=20251130)
    p.add_argument("--targets", default=DEFAULT_TARGETS)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="engine seconds per wall second; below 1 the gateway's own milliseconds weigh less (see the docstring)",
    )
    p.add_argument("--drain", type=float, default=60.0, help="engine seconds to wait after the last request")
    p.add_argument("--phase", choices=PHASES, default="all", help="run one part of the schedule (see the docstring)")
    p.add_argument("--log-level", default=None, help="the Cognitora extproc's log level (info: its decisions)")
    p.add_argument("--raw", action="store_true", help="also write every request's result (OUT.raw.jsonl)")
    p.add_argument(
        "--out", default=None, help="results path without suffix (default: bench/results/flow_bench[_PHASE])"
    )
    args = p.parse_args(argv)
    w = FlowWorkload()
    spec = FleetSpec(args.engines, "h100x2", "sim-qwen3-32b", args.time_scale, 32, str(SMOLLM2_TOKENIZER))
    run_args = argparse.Namespace(
        duration=None, max_requests=None, request_timeout=600.0, drain=args.drain, progress=False
    )
    slo = Slo(2.0, 0.1)
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    out = Path(args.out or RESULTS / ("flow_bench" if args.phase == "all" else f"flow_bench_{args.phase}"))
    doc: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.flow_bench", *argv]),
        "started_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "fleet": f"{args.engines} x h100x2 (sim, vLLM kind), SmolLM2 tokenizer",
        "time_scale": args.time_scale,
        "workload": w.__dict__,
        "description": flow_phase(flow_schedule(w, args.first_seed), w, args.phase).description,
        "seeds": [],
    }
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def write() -> None:
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
        out.with_suffix(".md").write_text(render(doc))

    for k in range(args.seeds):
        seed = args.first_seed + k
        schedule = flow_phase(flow_schedule(w, seed), w, args.phase)
        seed_doc: dict[str, Any] = {"seed": seed, "targets": {}, "skipped": {}}
        doc["seeds"].append(seed_doc)
        for name in names:
            print(f"== seed {seed} {name}", file=sys.stderr, flush=True)
            raw: list[dict[str, Any]] = []
            keys = mint_api_keys(flow_identities(schedule)) if takes_api_keys(name) else ()
            run = run_target(
                name,
                with_api_keys(schedule, keys),
                spec,
                run_args,
                slo,
                raw=raw,
                configure=_configure(args.log_level, keys),
            )
            why = why_unusable(run)
            if why:
                seed_doc["skipped"][name] = why
                seed_doc["targets"][name] = None
                print(f"  FAILED: {why}", file=sys.stderr, flush=True)
            else:
                seed_doc["targets"][name] = summarize(raw, w)
                if args.raw:
                    with out.with_suffix(".raw.jsonl").open("a") as f:
                        f.writelines(json.dumps({"seed": seed, **r}) + "\n" for r in raw)
                seed_doc["targets"][name]["router_cpu_share"] = run.router_cpu_share
                seed_doc["targets"][name]["health"] = asdict(run.health) if run.health else None
            write()
    doc["finished_at"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    write()
    print(out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
