"""The benchmark protocol's verdicts (bench/protocol.py) and the long-context workload (bench/long_context.py)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from bench import protocol
from bench.long_context import LongContextProfile, long_context_schedule
from bench.report import Report, Slo, StageSummary, TargetRun, report_json
from bench.workloads import ladder


def stage(label: str, p90: float, goodput: float) -> StageSummary:
    return StageSummary(
        stage=label, offered_rps=4, duration_s=20, requests=80, ok=80, failed=0, ttft_p50=p90 / 2, ttft_p90=p90,
        ttft_p99=p90 * 2, itl_p50=0.02, e2e_p50=5.0, e2e_p99=9.0, output_tps=500.0, goodput_rps=goodput,
        hit_rate=0.1, reuse_bound=0.2, prompt_tokens=1000, cached_tokens=100, completion_tokens=100,
    )  # fmt: skip


def report(seed: int, figures: dict[str, list[tuple[float, float]]]) -> Report:
    runs = [
        TargetRun(target=t, settings="", stages=[stage(f"s{i}", p90, g) for i, (p90, g) in enumerate(rows)])
        for t, rows in figures.items()
    ]
    return Report(
        command=f"run {seed}", workload="long-context", description="d", started_at="", time_scale=1.0,
        slo=Slo(2.0, 0.1), fleet={}, stages=[{"label": "s0"}, {"label": "s1"}], reuse_bound={}, runs=runs,
    )  # fmt: skip


def test_verdicts_say_when_a_difference_is_within_the_run_to_run_range() -> None:
    rr = [[(1.0, 3.0), (5.0, 1.0)], [(1.1, 3.0), (5.5, 1.1)], [(1.2, 2.9), (6.0, 0.9)]]
    sglang = [[(0.9, 3.1), (3.0, 2.0)], [(1.0, 3.0), (3.2, 2.1)], [(1.1, 2.9), (3.4, 1.9)]]
    cog = [[(0.95, 3.1), (1.5, 3.0)], [(0.85, 3.0), (1.6, 3.1)], [(1.05, 2.9), (1.4, 2.9)]]
    seeds = [report(i, {"envoy-rr": rr[i], "sglang": sglang[i], "cognitora-envoy": cog[i]}) for i in range(3)]
    text = protocol.aggregate(seeds, "cmd")
    rows = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| s") and "sglang |" in line
    }
    assert "within range (0.95 [0.85-1.05] vs 1.00 [0.90-1.10])" in rows["s0"]
    assert "better (1.50 [1.40-1.60] vs 3.20 [3.00-3.40])" in rows["s1"] and "better (3.00" in rows["s1"]
    assert "First stage where the best peer misses the TTFT SLO: **s1**" in text
    assert "cognitora-envoy: 1.50x sglang's (bar: 1.3x)" in text
    assert "| s0 | cognitora-envoy | 0.47 [0.42-0.53] | 0.95 [0.85-1.05] |" in text


def test_protocol_aggregates_the_seeds_already_run(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    for seed in protocol.DEFAULT_SEEDS[:3]:
        rep = report(seed, {"envoy-rr": [(1.0, 3.0), (5.0, 1.0)], "cognitora-envoy": [(0.9, 3.0), (1.5, 3.0)]})
        Path(f"{prefix}_seed{seed}.json").write_text(json.dumps(report_json(rep)))
    assert protocol.main(["--seeds", "3", "--out", str(prefix), "--aggregate"]) == 0
    text = prefix.with_suffix(".md").read_text()
    assert "3 seeds" in text and "| s1 | cognitora-envoy | envoy-rr | better" in text


def test_a_merged_run_adds_its_peers_and_a_rerun_target_keeps_this_runs_rows(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    for seed in protocol.DEFAULT_SEEDS[:3]:
        before = report(seed, {"envoy-rr": [(1.0, 3.0), (5.0, 1.0)], "cognitora-envoy": [(9.0, 0.5), (9.5, 0.4)]})
        Path(f"{old}_seed{seed}.json").write_text(json.dumps(report_json(before)))
        rerun = report(seed, {"cognitora-envoy": [(0.9, 3.0), (1.5, 3.0)]})
        Path(f"{new}_seed{seed}.json").write_text(json.dumps(report_json(rerun)))
    assert protocol.main(["--seeds", "3", "--out", str(new), "--aggregate", "--merge", str(old)]) == 0
    text = new.with_suffix(".md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| s1 | cognitora-envoy | ")]
    assert len(rows) == 2, rows  # the table's row and the verdict's: the merged file's old row is not there
    assert "| s1 | cognitora-envoy | 0.75 [0.75-0.75] | 1.50 [1.50-1.50] |" in text
    assert "| s1 | envoy-rr |" in text  # the peer came from the merged file


def test_long_context_profile_is_long_with_low_reuse() -> None:
    schedule = long_context_schedule(LongContextProfile(), ladder([4.0], 100.0), seed=7)
    prompts = [r.prompt_tokens for r in schedule.requests]
    assert len(prompts) > 300
    assert min(prompts) >= 8_000 and max(prompts) <= 40_000
    assert 11_000 < statistics.mean(prompts) < 16_000
    assert 0.05 < schedule.reuse_bound() < 0.3
    again = long_context_schedule(LongContextProfile(), ladder([4.0], 100.0), seed=7)
    assert [r.prompt_tokens for r in again.requests] == prompts  # a seed is one reproducible instance


def test_a_peer_that_serves_nothing_at_the_first_missed_stage_is_said_so() -> None:
    # B2B SaaS at 60 rps: the best peer misses the SLO and serves nothing in it; the line must not go missing.
    sglang = [(1.0, 3.0), (30.0, 0.0)]
    cog = [(1.2, 2.9), (32.0, 0.9)]
    seeds = [report(i, {"sglang": sglang, "cognitora-envoy": cog}) for i in range(3)]
    text = protocol.aggregate(seeds, "cmd")
    assert "First stage where the best peer misses the TTFT SLO: **s1**" in text
    assert "cognitora-envoy: 0.90 req/s against sglang's 0.00: no ratio (the peer's median goodput is 0)" in text


def test_hit_rates_are_judged_against_each_seeds_own_bounds_including_the_fleets_capacity() -> None:
    # Each seed is a different workload instance with its own bounds: seed 2's hit rate of 0.1 against its bound
    # of 0.4 is 0.25 of it, not 0.5 of seed 0's.
    seeds = []
    for i, (reuse, lru) in enumerate([(0.2, 0.05), (0.2, 0.08), (0.4, 0.1)]):
        rep = report(i, {"sglang": [(1.0, 3.0), (3.0, 2.0)], "cognitora-envoy": [(0.9, 3.0), (1.5, 3.0)]})
        rep.reuse_bound = {"s0": reuse, "s1": reuse}
        for run in rep.runs:
            # The router's CPU per stage (the one seed that did not measure it shows in no cell).
            cpu = None if i == 2 else 0.8 + i / 10
            run.stages = [replace(st, reuse_bound=reuse, router_cpu_share=cpu) for st in run.stages]
        rep.capacity_bound = {"s0": reuse, "s1": reuse}
        rep.pooled_lru_bound = {"s0": lru, "s1": lru}
        seeds.append(rep)
    text = protocol.aggregate(seeds, "cmd")
    row = next(line for line in text.splitlines() if line.startswith("| s0 | cognitora-envoy | 0.45"))
    assert row.endswith("| 0.100 [0.100-0.100] | 0.200 [0.200-0.400] | 0.50 [0.25-0.50] | 0.85 [0.80-0.90] |")
    assert "## Cache hits against the fleet's KV capacity" in text
    assert "| s0 | 0.200 [0.200-0.400] | 0.200 [0.200-0.400] | 0.080 [0.050-0.100] | cognitora-envoy | " in text
    assert "| 0.50 [0.25-0.50] | 1.25 [1.00-2.00] |" in text


def test_reports_without_the_fleets_capacity_get_no_capacity_section() -> None:
    seeds = [
        report(i, {"sglang": [(1.0, 3.0), (3.0, 2.0)], "cognitora-envoy": [(0.9, 3.0), (1.5, 3.0)]}) for i in range(3)
    ]
    text = protocol.aggregate(seeds, "cmd")
    assert "KV capacity" not in text and "| s0 | cognitora-envoy |" in text
    assert not protocol.fill_capacity_bound(seeds[0])  # "run 0" is not a bench.run_all command


def test_the_report_sums_what_met_the_slo_across_the_overload_stage_and_the_one_before() -> None:
    # Cognitora wins the overload stage s1 only by missing more in s0: together both served the same.
    rr = [(1.0, 3.0), (5.0, 1.0)]
    cog = [(0.9, 2.0), (1.5, 2.0)]
    seeds = [report(i, {"envoy-rr": rr, "cognitora-envoy": cog}) for i in range(3)]
    text = protocol.aggregate(seeds, "cmd")
    assert "cognitora-envoy: 2.00x envoy-rr's (bar: 1.3x)" in text
    assert "met the SLO in s0 and s1 together" in text
    # 20 s stages: (3 + 1) x 20 and (2 + 2) x 20 requests.
    assert "- envoy-rr: 80 [80-80] (seeds: 80, 80, 80)" in text
    assert "- cognitora-envoy: 80 [80-80] (seeds: 80, 80, 80)" in text
