"""The benchmark harness end to end: a real simulated fleet, two real routers, a tiny workload, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import run_all

pytestmark = pytest.mark.e2e


def test_harness_runs_two_targets_and_reports_sane_numbers(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    argv = [
        "--workload", "shared-prefix-32x32", "--rates", "6", "--stage-duration", "2", "--warmup", "",
        "--engines", "2", "--profile", "h100", "--time-scale", "1", "--targets", "envoy-rr,sglang-cache-aware",
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    assert run_all.main(argv) == 0

    report = json.loads(out.with_suffix(".json").read_text())
    schedule = run_all.build_schedule(run_all.parse_args(argv))
    sent = len(schedule.requests)
    assert sent > 0
    assert [r["target"] for r in report["runs"]] == ["envoy-rr", "sglang-cache-aware"]
    for run in report["runs"]:
        assert not run["skipped"], run["skipped"]
        (stage,) = run["stages"]
        # Every request is accounted for, and none failed against a healthy fleet.
        assert run["total_requests"] == sent and run["not_sent"] == 0
        assert stage["requests"] == sent and stage["ok"] == sent and stage["failed"] == 0
        assert 0.0 <= stage["reuse_bound"] <= 1.0
        # No router beats the bound (a little slack: engine prompt tokens include the chat template's).
        assert stage["hit_rate"] <= stage["reuse_bound"] + 0.02
        assert 0 < stage["ttft_p50"] <= stage["ttft_p90"] <= stage["ttft_p99"]
        assert stage["e2e_p50"] >= stage["ttft_p50"]
        assert stage["completion_tokens"] == 256 * sent
        assert stage["goodput_rps"] <= stage["offered_rps"] * 3
        assert run["energy_per_output_token_j"] > 0
        # The engines saw exactly our requests.
        assert sum(e["requests"] for e in run["engines"]) == sent
        assert not run["health"]["saturated"]
        # The router's CPU is measured per stage, not only over the run (a 2 s stage spans two samples).
        assert stage["router_cpu_share"] is not None and 0 <= stage["router_cpu_share"] < 2
    md = out.with_suffix(".md").read_text()
    assert md.splitlines()[5].startswith("python -m bench.run_all --workload shared-prefix-32x32")
    assert out.with_suffix(".png").stat().st_size > 0


def test_auto_time_scale_slows_the_sim_so_the_peak_stage_is_feasible() -> None:
    args = run_all.parse_args(["--workload", "b2b-saas", "--rates", "10,60", "--stage-duration", "5"])
    schedule = run_all.build_schedule(args)
    assert run_all.pick_time_scale(schedule, "auto", max_wall_rps=4.0) == pytest.approx(4 / 60, rel=0.1)
    assert run_all.pick_time_scale(schedule, "auto", max_wall_rps=4.0) <= 4 / 60
    assert run_all.pick_time_scale(schedule, "0.5", max_wall_rps=4.0) == 0.5
