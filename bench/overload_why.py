"""Why Cognitora's goodput is what it is at the first stage where the best peer misses the TTFT SLO.

    python -m bench.overload_why --out bench/results/overload_why.md

Offline: it reads the committed protocol runs (``bench/results/protocol_*_seedN.json``, the same sets the rows of
docs/benchmarks.md name) and, where a run kept them, the per-request records (``*.requests.jsonl.gz``, Cognitora's
targets only: the peers' runs predate them). Starts no gateway or engine. Per workload:

- **the stage**: the first stage where the best peer (highest median goodput over the seeds, ties by the lower
  median TTFT p90, as ``bench.protocol``) has a median TTFT p90 over the SLO; each target's median goodput there
  and the stage below, and the router's CPU (cores) where the run measured it;
- **the misses** (per-request records, per seed, summed): a request is good when its first token came within the
  TTFT objective and its mean ITL within the ITL objective (``bench.report``'s rule). A miss is *refused* when the
  server answered an error before any token (the Mooncake trace's prompts over the model's context); *unreachable*
  when its prefill alone, on an idle engine of the run's profile, with the whole prefix an unlimited cache would
  hold (``reusable_tokens``), takes longer than the objective: no router can serve it in time; *cut* when the run
  ended before its first token; *queued* when its TTFT is over the objective though reachable (it waited: for a
  seat, KV room, or prefill queued ahead of it); *ITL* when its first token was in time and its decode too slow;
- **the starts** inside the stage's window (first tokens, any stage's requests): of earlier stages' requests in
  time / of this stage's in time / late. *Late holders*: reachable requests served late that held a seat in the
  window (first token before its end, their end after its start). A gateway queue that sheds a request once its
  objective can no longer be met (``flow_control: {}``) gives those seats to requests that can still make it, so
  *estimate* = min(reachable, good + late holders) per second is an upper estimate of what flow control serves in
  that stage from the seats this run had; *reachable* = the stage's arrivals less unreachable and refused, per
  second, the most any router serves;
- **the seats**: requests between first token and end at the window's start, at most during it, and how many
  ended (seats freed) inside it; the engines' maximum running / waiting / KV use over the run (an engine has
  ``max_num_seqs`` seats: 256 on h100x2).

Engine seconds throughout (``bench/loadgen.py``'s time scale), as the results.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

RESULTS = Path("bench/results")
SEEDS = (20251130, 20251201, 20251202)


@dataclass(frozen=True)
class Seed:
    seed: int
    runs: dict[str, Any]
    """target -> its run (the first prefix that has it)"""
    source: dict[str, tuple[str, dict[str, Any]]]
    """target -> (the prefix its run came from, that report)"""
    first: dict[str, Any]


@dataclass(frozen=True)
class Workload:
    name: str
    prefixes: tuple[str, ...]
    """Result prefixes, first wins per target (``bench.protocol --merge`` order)."""


WORKLOADS = (
    Workload(
        "shared-prefix-32x32",
        (
            "protocol_shared-prefix-32x32_litellm_workers",
            "protocol_shared-prefix-32x32_energy_pooled",
            "protocol_shared-prefix-32x32",
        ),
    ),
    Workload("mooncake1000", ("protocol_mooncake1000_energy_pooled", "protocol_mooncake1000")),
    Workload("long-context", ("protocol_long-context_energy_pooled", "protocol_long-context")),
    Workload(
        "b2b-saas",
        (
            "protocol_b2b-saas_litellm_redis_1w",
            "protocol_b2b-saas_litellm_workers",
            "protocol_b2b-saas_energy_pooled",
            "protocol_b2b-saas_same_run",
        ),
    ),
)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _load(prefix: str, seed: int) -> dict[str, Any] | None:
    path = RESULTS / f"{prefix}_seed{seed}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _records(prefix: str, seed: int) -> list[dict[str, Any]]:
    path = RESULTS / f"{prefix}_seed{seed}.requests.jsonl.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def idle_ttft_s(profile_name: str, prompt_tokens: int, cached_tokens: int) -> float:
    """A lone request's prefill on an idle engine of ``profile_name``, its first ``cached_tokens`` a cache hit
    (the simulator's own step model: chunks of ``max_num_batched_tokens``, causal attention over the context)."""
    from cognitora_sim.profiles import get_profile

    prof = get_profile(profile_name)
    done = min(cached_tokens, max(0, prompt_tokens - 1))
    t = 0.0
    while done < prompt_tokens:
        n = min(prof.max_num_batched_tokens, prompt_tokens - done)
        pairs = (done + n) * (done + n + 1) // 2 - done * (done + 1) // 2
        t += prof.step_time(n, pairs, 0)
        done += n
    return t


def _good(r: dict[str, Any], ttft_slo: float, itl_slo: float) -> bool:
    if r["tokens_received"] <= 0 or r["ttft_s"] is None:
        return False
    return bool(r["ttft_s"] <= ttft_slo and (r["itl_s"] is None or r["itl_s"] <= itl_slo))


def _windows(report: dict[str, Any]) -> dict[str, tuple[float, float]]:
    out, t = {}, 0.0
    for st in report["stages"]:
        out[st["label"]] = (t, t + st["duration_s"])
        t += st["duration_s"]
    return out


def analyse(w: Workload) -> list[str]:
    seeds: list[Seed] = []
    for seed in SEEDS:
        runs: dict[str, Any] = {}
        source: dict[str, tuple[str, dict[str, Any]]] = {}
        first: dict[str, Any] | None = None
        for p in w.prefixes:
            rep = _load(p, seed)
            if rep is None:
                continue
            first = first or rep
            for run in rep["runs"]:
                if run["target"] not in runs:
                    runs[run["target"]] = run
                    source[run["target"]] = (p, rep)
        if first is not None:
            seeds.append(Seed(seed, runs, source, first))
    rep0 = seeds[0].first
    slo_t, slo_i = rep0["slo"]["ttft_s"], rep0["slo"]["itl_s"]
    labels = [s["label"] for s in rep0["stages"] if s.get("measured", True)]
    targets = list(seeds[0].runs)
    peers = [t for t in targets if not t.startswith("cognitora")]

    def stage(t: str, label: str, field: str) -> list[float]:
        vals = []
        for sd in seeds:
            for st in sd.runs.get(t, {}).get("stages", []):
                if st["stage"] == label and st.get(field) is not None:
                    vals.append(float(st[field]))
        return vals

    def best_peer(label: str) -> str:
        return min(
            peers, key=lambda p: (-_median(stage(p, label, "goodput_rps")), _median(stage(p, label, "ttft_p90")))
        )

    first_miss = next((lb for lb in labels if _median(stage(best_peer(lb), lb, "ttft_p90")) > slo_t), None)
    lines = [f"## {w.name}", ""]
    runs_s = ", ".join(f"`{p}_seedN`" for p in w.prefixes)
    stages_s = ", ".join(f"{s['label']} x {s['duration_s']:g} s" for s in rep0["stages"])
    lines.append(
        f"Runs: {runs_s}; time scale {rep0['time_scale']}, stages {stages_s}; SLO TTFT {slo_t:g} s, "
        f"ITL {slo_i:g} s; fleet {rep0['fleet'].get('engines')} x {rep0['fleet'].get('profile')}."
    )
    if first_miss is None:
        return [*lines, "", "The best peer meets the SLO at every stage.", ""]
    bp = best_peer(first_miss)
    at = labels.index(first_miss)
    shown = labels[max(0, at - 1) : at + 1]
    lines += ["", f"First stage where the best peer ({bp}) misses the TTFT SLO: **{first_miss}**.", ""]
    lines += [
        "| target | " + " | ".join(f"goodput {lb}" for lb in shown) + f" | TTFT p90 {first_miss} | ratio to "
        f"{bp} | router CPU {first_miss} (cores) |",
        "|---|" + "---|" * (len(shown) + 3),
    ]
    peer_good = _median(stage(bp, first_miss, "goodput_rps"))
    for t in targets:
        cells = [f"{_median(stage(t, lb, 'goodput_rps')):.2f}" for lb in shown]
        mine = _median(stage(t, first_miss, "goodput_rps"))
        ratio = f"{mine / peer_good:.2f}x" if peer_good > 0 else "no ratio (peer 0)"
        cpu = stage(t, first_miss, "router_cpu_share")
        cpu_s = f"{_median(cpu):.2f} [{min(cpu):.2f}-{max(cpu):.2f}]" if cpu else "-"
        p90 = _median(stage(t, first_miss, "ttft_p90"))
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {p90:.2f} | {ratio} | {cpu_s} |")
    lines += ["", *_per_request(seeds, first_miss, slo_t, slo_i)]
    return lines


PerSeed = list[tuple[int, dict[str, Any], list[dict[str, Any]]]]


def _classify(r: dict[str, Any], profile: str, slo_t: float, slo_i: float) -> str:
    """good / unreachable / refused / cut / queued / itl (the module docstring)."""
    if _good(r, slo_t, slo_i):
        return "good"
    if r["tokens_received"] <= 0 and not r.get("censored"):
        return "refused"
    if idle_ttft_s(profile, r["prompt_tokens"], r.get("reusable_tokens") or 0) > slo_t:
        return "unreachable"
    if r["tokens_received"] <= 0:
        return "cut"
    return "queued" if r["ttft_s"] > slo_t else "itl"


def _per_request(seeds: list[Seed], label: str, slo_t: float, slo_i: float) -> list[str]:
    by_target: dict[str, PerSeed] = {}
    for sd in seeds:
        for p in dict.fromkeys(prefix for prefix, _ in sd.source.values()):
            recs = _records(p, sd.seed)
            for t in sorted({r["target"] for r in recs}):
                if sd.source.get(t, ("", {}))[0] == p:
                    rep = sd.source[t][1]
                    by_target.setdefault(t, []).append((sd.seed, rep, [r for r in recs if r["target"] == t]))
    if not by_target:
        return ["No per-request records for this set.", ""]
    lines = [
        "Per-request records, every measured stage, the seeds summed (late holders and the estimate per seed). "
        f"**{label}** is the stage above. Columns: the module docstring.",
        "",
        "| target | stage | arrivals | good | unreachable | refused | cut | queued | ITL | TTFT p50 of queued "
        "| starts in window: earlier / this / late | late holders | estimate (req/s) | reachable (req/s) "
        "| seats at start / max / freed | hit of misses / good |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t, per_seed in by_target.items():
        labels = [s["label"] for s in per_seed[0][1]["stages"] if s.get("measured", True)]
        for lb in labels:
            lines.append(_stage_row(t, lb, per_seed, slo_t, slo_i))
    lines += ["", *_engines(by_target)]
    lags = [r.get("dispatch_lag_s") or 0.0 for ps in by_target.values() for _, _, recs in ps for r in recs]
    lags.sort()
    lines += [
        f"The load generator's dispatch lag, p99 over every record: {lags[int(0.99 * (len(lags) - 1))] * 1000:.0f} ms.",
        "",
    ]
    return lines


def _stage_row(t: str, label: str, per_seed: PerSeed, slo_t: float, slo_i: float) -> str:
    count = dict.fromkeys(("good", "unreachable", "refused", "cut", "queued", "itl"), 0)
    n = 0
    q_ttft: list[float] = []
    late_s, est, reach, seats, starts_s = [], [], [], [], []
    hit = {"miss": [0, 0], "good": [0, 0]}
    for _, rep, recs in per_seed:
        profile = rep["fleet"].get("profile", "h100x2").split(",")[0]
        lo, hi = _windows(rep)[label]
        kind = {r["index"]: _classify(r, profile, slo_t, slo_i) for r in recs}
        here = [r for r in recs if r["stage"] == label]
        good = 0
        for r in here:
            k = kind[r["index"]]
            n += 1
            count[k] += 1
            good += k == "good"
            side = hit["good" if k == "good" else "miss"]
            side[0] += r["cached_tokens"]
            side[1] += r["prompt_tokens"]
            if k == "queued":
                q_ttft.append(r["ttft_s"])
        # A reachable request served late that held a seat in the window (its first token before the window's
        # end, its end after the window's start): shed instead, its seat was free for one of this stage's.
        late = sum(
            1
            for r in recs
            if kind[r["index"]] in ("queued", "itl")
            and r["ttft_s"] > slo_t
            and r["arrival_s"] + r["ttft_s"] < hi
            and r["end_s"] > lo
        )
        reachable = sum(1 for r in here if kind[r["index"]] not in ("unreachable", "refused"))
        late_s.append(str(late))
        est.append(f"{min(reachable, good + late) / (hi - lo):.1f}")
        reach.append(f"{reachable / (hi - lo):.1f}")
        served = [(r["arrival_s"] + r["ttft_s"], r["end_s"]) for r in recs if r["tokens_received"] > 0]
        # First tokens inside the window: of earlier stages' requests in time / of this stage's in time / late.
        order = {lb: i for i, lb in enumerate(_windows(rep))}
        starts = [r for r in recs if r["tokens_received"] > 0 and lo <= r["arrival_s"] + r["ttft_s"] < hi]
        early = sum(1 for r in starts if order[r["stage"]] < order[label] and r["ttft_s"] <= slo_t)
        mine = sum(1 for r in starts if r["stage"] == label and r["ttft_s"] <= slo_t)
        starts_s.append(f"{early}/{mine}/{sum(1 for r in starts if r['ttft_s'] > slo_t)}")
        at_start = sum(1 for a, b in served if a <= lo < b)
        cur, peak = 0, at_start
        for when, d in sorted([(a, 1) for a, _ in served] + [(b, -1) for _, b in served]):
            cur += d
            if lo <= when < hi:
                peak = max(peak, cur)
        seats.append(f"{at_start}/{peak}/{sum(1 for _, b in served if lo <= b < hi)}")
    hm, hg = (hit[k][0] / hit[k][1] if hit[k][1] else float("nan") for k in ("miss", "good"))
    return (
        f"| {t} | {label} | {n} | {count['good']} | {count['unreachable']} | {count['refused']} | {count['cut']} | "
        f"{count['queued']} | {count['itl']} | {_median(q_ttft):.2f} | {', '.join(starts_s)} | {', '.join(late_s)} | "
        f"{', '.join(est)} | {', '.join(reach)} | {', '.join(seats)} | {hm:.2f} / {hg:.2f} |"
    )


def _engines(by_target: dict[str, PerSeed]) -> list[str]:
    lines = ["Engines over the whole run (max over engines and seeds): running / waiting / KV use.", ""]
    for t, per_seed in by_target.items():
        run = [r for _, rep, _ in per_seed for r in rep["runs"] if r["target"] == t]
        eng = [e for r in run for e in r.get("engines", [])]
        if eng:
            lines.append(
                f"- {t}: {max(e['max_running'] for e in eng):g} / {max(e['max_waiting'] for e in eng):g} / "
                f"{max(e['max_kv_usage'] for e in eng):.2f}"
            )
    return [*lines, ""]


def _started(rep: dict[str, Any]) -> datetime:
    return datetime.strptime(rep["started_at"], "%Y-%m-%d %H:%M UTC")


def setup_per_target_s(w: Workload) -> tuple[float, list[float], float]:
    """(median wall per target, per-target setup (the gap between consecutive seeds' ``started_at`` less the
    targets' wall, over the targets; minute resolution), the measured tail past (warm-up + stages) / time scale)."""
    walls, setups, tails = [], [], []
    for p in w.prefixes:
        reps = [(seed, rep) for seed in SEEDS if (rep := _load(p, seed)) is not None]
        for _, rep in reps:
            runs = [r for r in rep["runs"] if r.get("health")]
            walls += [r["health"]["wall_s"] for r in runs]
            load = sum(st["duration_s"] for st in rep["stages"]) / rep["time_scale"]
            tails += [r["health"]["wall_s"] - load for r in runs]
        for (_, a), (_, b) in pairwise(reps):
            gap = (_started(b) - _started(a)).total_seconds()
            used = sum(r["health"]["wall_s"] for r in a["runs"] if r.get("health"))
            setups.append((gap - used) / len(a["runs"]))
    return _median(walls), setups, _median(tails)


@dataclass(frozen=True)
class Rerun:
    """One proposed ladder: engine seconds of warm-up and stages, the time scale, the drain bound, the targets."""

    workload: str
    stages: str
    load_s: float
    time_scale: float
    drain_s: float
    targets: int


RERUNS = (
    Rerun("shared-prefix-32x32", "100,150,200,300 rps x 4 s", 16, 0.1, 4, 4),
    Rerun("mooncake1000", "the trace at --speed 2", 272.653 / 2, 0.7, 4, 4),
    Rerun("long-context", "4,6,8 rps x 16 s", 48, 0.5, 10, 4),
    Rerun("b2b-saas", "warm-up 10 s, 30,45,60 rps x 8 s", 34, 0.25, 10, 4),
)


def plan() -> list[str]:
    lines = [
        "| workload | committed: wall per target (s) | setup per target (s) | tail past the load (s) | proposed "
        "| per target (s) | per seed (min) | 3 seeds (min) | 3 seeds, envoy-rr too (min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    total = total_rr = 0.0
    for rr in RERUNS:
        w = next(x for x in WORKLOADS if x.name == rr.workload)
        wall, setups, tail = setup_per_target_s(w)
        setup = max(0.0, _median(setups))
        # The drain is a bound: a run whose requests all finish sooner ends sooner (the committed tail says).
        drain_wall = min(rr.drain_s / rr.time_scale, max(tail, 0.0))
        per_target = rr.load_s / rr.time_scale + drain_wall + setup
        per_seed = per_target * rr.targets / 60
        with_rr = 3 * per_target * (rr.targets + 1) / 60
        total += 3 * per_seed
        total_rr += with_rr
        setups_s = ", ".join(f"{x:.0f}" for x in setups)
        lines.append(
            f"| {rr.workload} | {wall:.0f} | {setup:.0f} ({setups_s}) | {tail:.0f} | {rr.stages}, time scale "
            f"{rr.time_scale:g}, --drain {rr.drain_s:g}, {rr.targets} targets | {per_target:.0f} | {per_seed:.1f} | "
            f"{3 * per_seed:.0f} | {with_rr:.0f} |"
        )
    lines += ["", f"All four, 3 seeds: {total:.0f} min ({total_rr:.0f} min with envoy-rr as a fifth target).", ""]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overload_why", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write the report here (markdown); stdout always")
    args = p.parse_args(argv)
    lines = ["# Why Cognitora's overload goodput is what it is (committed protocol runs, offline)", ""]
    lines += ["Command: `PYTHONPATH=.:sim python -m bench.overload_why --out bench/results/overload_why.md`", ""]
    lines += [*(__doc__ or "").split("\n\n", 2)[2].splitlines(), ""]
    for w in WORKLOADS:
        lines += analyse(w)
    lines += ["## Wall time: the committed runs, and the proposed rerun", ""]
    lines += [
        "Per target: (warm-up + stages) / time scale + the drain (a bound: the committed tail past the load when "
        "that is shorter) + the setup between targets. Targets: sglang-cache-aware, cognitora-envoy, "
        'cognitora-envoy@flow_control={}, cognitora-litellm@flow_control={} (docs/flow_control.md, "Overload '
        'ladders").',
        "",
    ]
    lines += plan()
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
