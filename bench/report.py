"""Benchmark report: per target and stage, latency percentiles, goodput, cache hits against the reuse bound, energy.

Definitions (engine seconds throughout; see bench/loadgen.py for the time scale):

- TTFT: percentiles over the stage's successful requests plus those still running when the run's deadline cut
  them (their wait so far, a lower bound).
- E2E: percentiles over the finished requests, plus a projection for requests cut while streaming (TTFT + their
  remaining tokens at their ITL so far); requests cut before their first token have none.
- ITL: each request's mean time between output tokens ((last token - first token) / (tokens - 1)), also for
  requests cut while streaming (over what arrived); the table shows its median over requests.
- Output tokens/s: output tokens streamed to the stage's requests (finished or cut by the deadline) / (last end or
  cut - first arrival) of the stage.
- Goodput: requests of the stage with TTFT <= slo_ttft_s and ITL <= slo_itl_s, per second of the stage's
  scheduled duration. A request cut by the run's deadline while streaming is judged on the tokens that arrived
  (the benchmark ended it, not the server); one cut before its first token is not good.
- Hit rate: sum(cached_tokens) / sum(prompt_tokens) from the engines' own usage, next to the workload's reuse bound
  (bench/workloads.py). Prompt tokens include the chat template's few tokens; the bound counts content tokens only.
- Energy per output token: the fleet's DCGM energy counters (before/after the whole run of a target, warm-up
  included) / completion tokens of the whole run.
"""

from __future__ import annotations

import gzip
import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.loadgen import HarnessHealth, RequestResult
from bench.run_args import build_schedule, parse_args


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 2.0
    itl_s: float = 0.100


@dataclass
class StageSummary:
    stage: str
    offered_rps: float
    duration_s: float
    requests: int
    ok: int
    failed: int
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    itl_p50: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    output_tps: float
    goodput_rps: float
    hit_rate: float | None
    """From the usage of requests that finished; None when none did (see TargetRun.engine_hit_rate)."""
    reuse_bound: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    errors: dict[str, int] = field(default_factory=dict)
    streaming_at_cut: int = 0
    """Of ``failed``: requests still streaming when the run's deadline cut them (judged on what had arrived)."""
    waiting_at_cut: int = 0
    """Of ``failed``: requests cut by the deadline before their first token (queued, not failed by the server)."""
    router_cpu_share: float | None = None
    """Cores the router's processes used from the stage's first arrival to its last (``bench.cpu_timeline``); None
    when not measured."""

    @property
    def errored(self) -> int:
        """Requests that failed for another reason than the run's deadline (an error answer, a reset)."""
        return self.failed - self.streaming_at_cut - self.waiting_at_cut


@dataclass
class EngineStats:
    """One engine over a target's run: from its own /metrics (deltas) and sampled gauges."""

    url: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    energy_j: float = 0.0
    max_waiting: float = 0.0
    max_running: float = 0.0
    max_kv_usage: float = 0.0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    """The engine's own TTFT histogram over the run (vLLM's ``vllm:time_to_first_token_seconds``: from the request's
    arrival at the engine to its first token): the client's TTFT minus this is the gateway's time."""

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class TargetRun:
    target: str
    settings: str
    stages: list[StageSummary] = field(default_factory=list)
    engines: list[EngineStats] = field(default_factory=list)
    health: HarnessHealth | None = None
    energy_j: float | None = None
    energy_per_output_token_j: float | None = None
    total_requests: int = 0
    total_ok: int = 0
    total_served: int | None = None
    """Requests whose first token arrived (finished, or streaming when the run's deadline cut them); None in
    reports made before it was counted."""
    not_sent: int = 0
    engine_hit_rate: float | None = None
    """The engines' own prefix-cache hits / queries over the whole run (warm-up included): counts every prefill,
    also of requests later cut by the deadline."""
    engine_reuse_bound: float | None = None
    """The reuse bound over the requests that got a first token (were prefilled), whole run: compare with the above."""
    router_cpu_share: float | None = None
    """CPU of the router's processes over the run, in cores (1.0 = one core busy all the time)."""
    fleet_cpu_share: float | None = None
    skipped: str = ""
    """Why the target never ran (its fleet or router did not start); empty when it ran."""
    errors: dict[str, int] = field(default_factory=dict)
    """The most common errors of its failed requests, each with its count (what a reader needs when none succeeded)."""


def why_unusable(run: TargetRun) -> str | None:
    """Why ``run`` has no result to show (it never ran, or not one of its requests succeeded), else None.

    A demo or benchmark that prints numbers for such a run would show an empty row as if it were a result: callers
    report this reason instead and exit non-zero.
    """
    if run.skipped:
        return run.skipped
    if not run.total_requests:
        return "it sent no request"
    # Requests the run's deadline cut while they streamed are a result (an overloaded target: its TTFT and
    # token pace are measured), not a failure to run: unusable is no success and not one token streamed.
    streamed = any(stage.output_tps > 0 for stage in run.stages)
    if run.total_ok == 0 and not streamed:
        common = "; ".join(f"{count} x {error}" for error, count in run.errors.items())
        return f"none of its {run.total_requests} requests succeeded" + (f" ({common})" if common else "")
    return None


@dataclass
class Report:
    command: str
    workload: str
    description: str
    started_at: str
    time_scale: float
    slo: Slo
    fleet: dict[str, Any]
    stages: list[dict[str, Any]]
    reuse_bound: dict[str, float]
    runs: list[TargetRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    capacity_bound: dict[str, float] = field(default_factory=dict)
    """Per stage, the most of its prompt tokens any router could serve from cache with the fleet's finite KV
    (``bench.capacity_bound``: Belady's MIN over one cache of the fleet's size). Empty in reports made before it."""
    pooled_lru_bound: dict[str, float] = field(default_factory=dict)
    """Per stage, what one LRU cache of the fleet's size would serve (a yardstick, not a bound)."""


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize_stage(
    stage: str, offered_rps: float, duration_s: float, results: list[RequestResult], reuse_bound: float, slo: Slo
) -> StageSummary:
    ok = [r for r in results if r.ok]
    # Requests cut at the end of the run keep their wait so far as TTFT (a lower bound): leaving them out would
    # make the most overloaded router look fastest.
    ttft = [r.ttft_s for r in results if r.ttft_s is not None and (r.ok or r.censored)]
    itl = [r.itl_s for r in results if r.itl_s is not None and (r.ok or r.censored)]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    # A request cut while streaming gets a projected E2E: its TTFT plus its remaining tokens at its pace so far.
    e2e += [
        r.ttft_s + r.itl_s * (r.max_tokens - 1)
        for r in results
        if r.censored and r.ttft_s is not None and r.itl_s is not None and r.max_tokens > 1
    ]
    # A request cut by the run's deadline is judged on what arrived before the cut: it is good if its first token
    # and its token pace so far met the SLO (a long generation cut by the benchmark is not the server's failure).
    good = [
        r
        for r in results
        if (r.ok or (r.censored and r.tokens_received > 0))
        and r.ttft_s is not None
        and r.ttft_s <= slo.ttft_s
        and (r.itl_s is None or r.itl_s <= slo.itl_s)
    ]
    completion = sum(r.completion_tokens for r in ok)
    streamed = sum(r.tokens_received for r in results if r.ok or r.censored)
    ends = [r.end_s for r in results if r.end_s is not None and (r.ok or r.censored)]
    span = max(ends) - min(r.arrival_s for r in results) if ends else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if r.errored:  # a request cut by the run's deadline is counted apart (streaming_at_cut, waiting_at_cut)
            key = f"{r.status}: {r.error[:80]}"
            errors[key] = errors.get(key, 0) + 1
    return StageSummary(
        stage=stage,
        offered_rps=offered_rps,
        duration_s=duration_s,
        requests=len(results),
        ok=len(ok),
        failed=len(results) - len(ok),
        ttft_p50=percentile(ttft, 50),
        ttft_p90=percentile(ttft, 90),
        ttft_p99=percentile(ttft, 99),
        itl_p50=percentile(itl, 50),
        e2e_p50=percentile(e2e, 50),
        e2e_p99=percentile(e2e, 99),
        output_tps=streamed / span if span > 0 else 0.0,
        goodput_rps=len(good) / duration_s if duration_s > 0 else 0.0,
        hit_rate=cached / prompt if prompt else None,
        reuse_bound=reuse_bound,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        errors=errors,
        streaming_at_cut=sum(1 for r in results if r.censored and not r.ok and r.tokens_received > 0),
        waiting_at_cut=sum(1 for r in results if r.censored and not r.ok and r.tokens_received == 0),
    )


# --------------------------------------------------------------------------------------------------------------------
# Output


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.1f}x"


def render_markdown(report: Report) -> str:
    lines = [
        f"# Side-by-side benchmark: {report.workload}",
        "",
        "Command:",
        "",
        "```bash",
        report.command,
        "```",
        "",
        f"Started {report.started_at}. {report.description}.",
        "",
        f"Fleet: {json.dumps(report.fleet)}. Time scale {report.time_scale:g} (engine time runs "
        f"{1 / report.time_scale:g}x slower than wall time; all durations below are engine seconds). "
        f"SLO for goodput: TTFT <= {report.slo.ttft_s:g} s and ITL <= {report.slo.itl_s * 1000:g} ms.",
        "",
    ]
    lines += [f"- {n}" for n in report.notes]
    if report.capacity_bound:
        lines.append(
            "- With the fleet's finite KV cache, the most any router could serve from cache (capacity bound, "
            "`bench/capacity_bound.py`) / one pooled LRU cache of that size, per stage: "
            + ", ".join(
                f"{label} {bound:.3f} / {report.pooled_lru_bound.get(label, 0.0):.3f}"
                for label, bound in report.capacity_bound.items()
            )
        )
    if report.notes or report.capacity_bound:
        lines.append("")
    lines += [
        "## Targets",
        "",
        "| target | settings | requests served / sent | engine hit rate / bound (whole run) | router CPU | sim CPU "
        "| harness CPU | machine busy | valid |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for run in report.runs:
        if run.skipped:
            lines.append(f"| {run.target} | {run.settings} | skipped: {run.skipped} | | | | | | |")
            continue
        h = run.health
        valid = "yes" if h and not h.saturated else f"**no**: {h.reason if h else 'no data'}"
        cpu = f"{h.cpu_share:.0%} of a core" if h else "-"
        busy = f"{h.machine_busy_share:.0%}" if h else "-"
        router = _cores(run.router_cpu_share)
        sim = _cores(run.fleet_cpu_share)
        hits = f"{_f(run.engine_hit_rate)} / {_f(run.engine_reuse_bound)}"
        # Served: a first token arrived; streams the run's deadline cut count (judged on what arrived), not as failed.
        served = (
            f"{run.total_ok} finished / {run.total_requests}"
            if run.total_served is None
            else f"{run.total_served} / {run.total_requests} ({run.total_ok} finished)"
        )
        lines.append(
            f"| {run.target} | {run.settings} | {served} | {hits} | {router} | {sim} | {cpu} | {busy} | {valid} |"
        )
    lines.append("")

    measured = [s["label"] for s in report.stages if s.get("measured", True)]
    lines += ["## Results per stage", ""]
    header = (
        "| stage | target | sent/s | finished / streaming at end / sent | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 ms "
        "| E2E p50 | E2E p99 | out tok/s | goodput rps | hit rate | reuse bound | router CPU |"
    )
    lines += [header, "|" + "---|" * 15]
    for label in measured:
        for run in report.runs:
            for s in run.stages:
                if s.stage != label:
                    continue
                lines.append(
                    f"| {label} | {run.target} | {s.requests / s.duration_s if s.duration_s else 0:.1f} | "
                    f"{s.ok} / {s.streaming_at_cut} / {s.requests} | {_f(s.ttft_p50)} | {_f(s.ttft_p90)} | "
                    f"{_f(s.ttft_p99)} | {_f(None if s.itl_p50 is None else s.itl_p50 * 1000, 1)} | "
                    f"{_f(s.e2e_p50, 2)} | {_f(s.e2e_p99, 2)} | {s.output_tps:.0f} | {s.goodput_rps:.2f} | "
                    f"{_f(s.hit_rate)} | {s.reuse_bound:.3f} | {_cores(s.router_cpu_share)} |"
                )
    lines.append("")

    lines += ["## Energy", "", "| target | fleet energy (kJ) | J per output token |", "|---|---|---|"]
    for run in report.runs:
        if not run.skipped:
            kj = None if run.energy_j is None else run.energy_j / 1000
            lines.append(f"| {run.target} | {_f(kj, 1)} | {_f(run.energy_per_output_token_j, 3)} |")
    lines.append("")

    cog = [r for r in report.runs if r.target.startswith("cognitora") and not r.skipped]
    if cog and measured:
        top = measured[-1]
        lines += [f"## Cognitora against each peer at the top stage ({top})", ""]
        lines += ["| cognitora | peer | TTFT p50 ratio (peer/cog) | TTFT p90 ratio | goodput ratio (cog/peer) |"]
        lines.append("|---|---|---|---|---|")
        for c in cog:
            cs = next((s for s in c.stages if s.stage == top), None)
            for peer in report.runs:
                if peer.target.startswith("cognitora") or peer.skipped:
                    continue
                ps = next((s for s in peer.stages if s.stage == top), None)
                if cs is None or ps is None:
                    continue
                lines.append(
                    f"| {c.target} | {peer.target} | {_ratio(ps.ttft_p50, cs.ttft_p50)} | "
                    f"{_ratio(ps.ttft_p90, cs.ttft_p90)} | {_ratio(cs.goodput_rps, ps.goodput_rps)} |"
                )
        lines.append("")

    lines += ["## Per-engine evidence (whole run of each target)", ""]
    for run in report.runs:
        if run.skipped or not run.engines:
            continue
        lines += [f"**{run.target}**", ""]
        lines += ["| engine | requests | prompt tok | hit rate | max waiting | max running | max KV use |"]
        lines.append("|---|---|---|---|---|---|---|")
        for e in run.engines:
            lines.append(
                f"| {e.url} | {e.requests} | {e.prompt_tokens} | {e.hit_rate:.3f} | {e.max_waiting:.0f} | "
                f"{e.max_running:.0f} | {e.max_kv_usage:.2f} |"
            )
        lines.append("")
    errors = [(run.target, s.stage, s.errors) for run in report.runs for s in run.stages if s.errors]
    if errors:
        lines += ["## Errors", ""]
        for target, stage, errs in errors:
            for msg, n in errs.items():
                lines.append(f"- {target} / {stage}: {n} x `{msg}`")
        lines.append("")
    cut = [(run.target, s) for run in report.runs for s in run.stages if s.streaming_at_cut or s.waiting_at_cut]
    if cut:
        lines += [
            "## Cut by the run's end",
            "",
            "Not errors: requests still streaming when the run stopped waiting are judged on the tokens that had "
            "arrived (their TTFT and pace count; goodput includes them); those still queued count with the wait so "
            "far as their TTFT.",
            "",
        ]
        for target, s in cut:
            lines.append(f"- {target} / {s.stage}: {s.streaming_at_cut} streaming, {s.waiting_at_cut} queued")
        lines.append("")
    return "\n".join(lines)


def _cores(share: float | None) -> str:
    return "-" if share is None else f"{share:.2f} cores"


def engine_hit_and_bound(run: TargetRun, results: list[RequestResult]) -> None:
    """Fill ``engine_hit_rate`` (engines' counters), ``engine_reuse_bound`` (requests that got a first token) and
    energy per output token (the fleet's energy / every output token streamed, also to requests later cut)."""
    energy = sum(e.energy_j for e in run.engines)
    tokens = sum(r.tokens_received for r in results)
    run.energy_j = energy if energy > 0 else None
    run.energy_per_output_token_j = energy / tokens if energy > 0 and tokens else None
    queries = sum(e.prompt_tokens for e in run.engines)
    run.engine_hit_rate = sum(e.cached_tokens for e in run.engines) / queries if queries else None
    prefilled = [r for r in results if r.tokens_received > 0 or r.ok]
    content = sum(r.content_tokens for r in prefilled)
    run.engine_reuse_bound = sum(r.reusable_tokens for r in prefilled) / content if content else None


def load_report(data: dict[str, Any]) -> Report:
    """A Report from its JSON (to re-render, or to recompute from raw results)."""
    runs = []
    for r in data.pop("runs"):
        stages = [StageSummary(**s) for s in r.pop("stages")]
        engines = [EngineStats(**e) for e in r.pop("engines")]
        health = HarnessHealth(**r.pop("health")) if r.get("health") else None
        r.pop("health", None)
        runs.append(TargetRun(**r, stages=stages, engines=engines, health=health))
    slo = Slo(**data.pop("slo"))
    return Report(**data, slo=slo, runs=runs)


def report_json(report: Report) -> dict[str, Any]:
    return asdict(report)


def plot(report: Report, path: Path) -> None:
    """TTFT p90 and goodput against offered load, one line per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in report.runs:
        stages = [s for s in run.stages if s.ttft_p90 is not None]
        if run.skipped or not stages:
            continue
        x = [s.offered_rps for s in stages]
        style = "-o" if run.target.startswith("cognitora") else "--."
        ax1.plot(x, [s.ttft_p90 for s in stages], style, label=run.target)
        # every stage: one where nothing finished (a gateway that died) has goodput 0, and that is the point
        ax2.plot([s.offered_rps for s in run.stages], [s.goodput_rps for s in run.stages], style, label=run.target)
    ax1.set_yscale("log")
    ax1.set_xlabel("offered load (requests / engine s)")
    ax1.set_ylabel("TTFT p90 (engine s, log)")
    ax1.set_title("TTFT p90")
    ax2.set_xlabel("offered load (requests / engine s)")
    ax2.set_ylabel(f"goodput (req/s, TTFT<={report.slo.ttft_s:g}s, ITL<={report.slo.itl_s * 1000:g}ms)")
    ax2.set_title("Goodput")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    if ax2.lines:  # a run where no target ran has nothing to label
        ax2.legend(fontsize=8)
    fig.suptitle(f"{report.workload}: {report.description}"[:150], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: Report, out_prefix: Path) -> list[Path]:
    """``<prefix>.md``, ``<prefix>.json``, ``<prefix>.png``."""
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    md, js, png = (out_prefix.with_suffix(s) for s in (".md", ".json", ".png"))
    md.write_text(render_markdown(report))
    js.write_text(json.dumps(report_json(report), indent=1))
    plot(report, png)
    return [md, js, png]


def _fill_max_tokens(report: Report, raw: dict[str, list[RequestResult]]) -> None:
    """Older raw files lack max_tokens: rebuild the schedule from the command at the top of the report."""
    if all(r.max_tokens for results in raw.values() for r in results):
        return
    argv = shlex.split(report.command.split("#")[0])[3:]
    schedule = build_schedule(parse_args(argv))
    by_index = {r.index: r.max_tokens for r in schedule.requests}
    for results in raw.values():
        for r in results:
            r.max_tokens = r.max_tokens or by_index.get(r.index, 0)


def read_requests(prefix: Path) -> list[dict[str, Any]]:
    """Every request of a run, as the runner kept them in ``<prefix>.requests.jsonl.gz`` (one JSON object a line,
    with its ``target``)."""
    with gzip.open(prefix.with_suffix(".requests.jsonl.gz"), "rt") as fh:
        return [json.loads(line) for line in fh]


def rerender(prefix: Path) -> list[Path]:
    """Recompute every summary of ``<prefix>.json`` from the raw ``<prefix>.requests.jsonl.gz`` and write again."""
    report = load_report(json.loads(prefix.with_suffix(".json").read_text()))
    raw: dict[str, list[RequestResult]] = {}
    for row in read_requests(prefix):
        raw.setdefault(row.pop("target"), []).append(RequestResult(**row))
    _fill_max_tokens(report, raw)
    bounds = report.reuse_bound
    for run in report.runs:
        results = raw.get(run.target)
        if run.skipped or not results:
            continue
        run.stages = [
            summarize_stage(
                st["label"],
                st["rate"],
                st["duration_s"],
                [r for r in results if r.stage == st["label"]],
                bounds[st["label"]],
                report.slo,
            )
            for st in report.stages
            if st.get("measured", True) and any(r.stage == st["label"] for r in results)
        ]
        engine_hit_and_bound(run, results)
    return write_report(report, prefix)


if __name__ == "__main__":
    import sys

    for arg in sys.argv[1:]:
        print("\n".join(map(str, rerender(Path(arg)))))
