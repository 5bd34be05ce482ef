"""The pure parts of the real-engine benchmark (the benchmark itself runs by hand: docs/real_engines.md):
the calibration fit recovers known step costs, and the sim-vs-real comparison ranks routers as its table says."""

from __future__ import annotations

from typing import Any

import pytest

from bench.cpu_calibration import fit, fit_slowdowns, isolated
from bench.real_engines import CPU_SHARED_PREFIX, compare, parse_args, schedule_for
from bench.report import Report, Slo, StageSummary, TargetRun


def _measured(overhead: float, per_token: float, attn: float, noise: float = 0.0) -> dict[str, Any]:
    def cold(n: int) -> float:
        return overhead + n * per_token + n * (n + 1) / 2 * attn

    hit = overhead + 32 * per_token + 32 * (1888 + 33 / 2) * attn
    return {
        "cold": [
            {"tokens": n, "ttft_s": cold(n) * (1 + noise * (-1) ** i)}
            for i, n in enumerate((128, 512, 1024, 1536, 1920))
        ],
        "cached": [{"tokens": 1920, "ttft_s": hit, "cached_tokens": 1888}] * 3,
        "decode": {"context_tokens": 256, "itl_1_s": 0.05, "itl_4_s": 0.062},
    }


def test_fit_recovers_the_step_costs_it_was_made_from() -> None:
    got = fit(_measured(0.08, 1 / 300, 2e-7))
    assert got["overhead_s"] == pytest.approx(0.08, abs=0.002)
    assert got["compute_tokens_per_s"] == pytest.approx(300, rel=0.02)
    assert got["attn_s_per_pair"] == pytest.approx(2e-7, rel=0.05)
    assert got["fit_max_error"] < 0.01
    # decode: each extra sequence adds 4 ms, of which 1/300 s is its token's compute, the rest its context's KV
    assert got["kv_read_s_per_token"] == pytest.approx((0.004 - 1 / 300) / 256, rel=0.05)


def test_fit_never_returns_a_negative_cost_from_noisy_points() -> None:
    got = fit(_measured(0.0, 1 / 300, 0.0, noise=0.3))
    assert got["overhead_s"] >= 0 and got["attn_s_per_pair"] >= 0 and got["compute_tokens_per_s"] > 0


_ALONE = {
    "overhead_s": 0.05,
    "compute_tokens_per_s": 1000.0,
    "attn_s_per_pair": 2e-6,
    "weights_read_s": 0.001,
    "kv_read_s_per_token": 8e-6,
}


def _request(arrival: float, cached: int, step: float, prefill: float, target: str = "t") -> dict[str, Any]:
    """A request of 1,134 prompt tokens (``cached`` of them cached) timed as the step model scaled by the factors."""
    o, w, kv, a = (_ALONE[k] for k in ("overhead_s", "weights_read_s", "kv_read_s_per_token", "attn_s_per_pair"))
    n = 1134 - cached
    ttft = step * o + prefill * (n / _ALONE["compute_tokens_per_s"] + n * (cached + (n + 1) / 2) * a)
    itl = step * (o + w + (1134 + 8) * kv)
    end = arrival + ttft + 15 * itl
    return {
        "target": target,
        "status": 200,
        "arrival_s": arrival,
        "end_s": end,
        "ttft_s": ttft,
        "itl_s": itl,
        "prompt_tokens": 1134,
        "cached_tokens": cached,
        "completion_tokens": 16,
    }


def test_slowdown_fit_recovers_the_factors_from_the_requests_that_ran_alone() -> None:
    alone = [_request(10.0 * i, cached, 0.8, 0.2) for i, cached in enumerate((0, 992, 992, 1120, 0, 992))]
    # two requests in flight together (their times are off: queueing) and one of another target beside them
    crowded = [_request(100.0, 0, 3.0, 3.0), _request(100.1, 992, 3.0, 3.0), _request(100.0, 0, 0.8, 0.2, "u")]
    kept = isolated(alone + crowded)
    assert len(kept) == len(alone) + 1
    got = fit_slowdowns(kept, _ALONE)
    assert got["step_slowdown"] == pytest.approx(0.8, rel=0.01)
    assert got["prefill_slowdown"] == pytest.approx(0.2, rel=0.01)
    assert got["ttft_median_abs_error"] < 0.01 and got["itl_median_abs_error"] < 0.01


def test_the_workload_fits_the_engines_and_reuses_its_system_prompts() -> None:
    schedule = schedule_for(20251130, [0.3, 0.6], 45.0, (0.3, 30.0))
    assert {s.label for s in schedule.stages} == {"warmup", "0.3 rps", "0.6 rps"}
    lengths = {r.prompt_tokens for r in schedule.requests}
    assert lengths == {CPU_SHARED_PREFIX.system_tokens + CPU_SHARED_PREFIX.question_tokens}
    assert min(lengths) >= 500 and max(lengths) <= 2000  # the 0.5-2k tokens, under max_model_len 2048
    assert schedule.reuse_bound("0.6 rps") > 0.8


def _report(ttft: dict[str, tuple[float, float]], fleet: dict[str, Any] | None = None) -> Report:
    runs = []
    for target, (p50, p90) in ttft.items():
        stage = StageSummary(
            "1 rps", 1.0, 10.0, 10, 10, 0, p50, p90, p90, 0.05, 1.0, 2.0, 10.0, 1 / p90, 0.9, 0.9, 100, 90, 10
        )
        runs.append(TargetRun(target=target, settings="", stages=[stage]))
    stages = [{"label": "1 rps", "rate": 1.0, "duration_s": 10.0, "measured": True}]
    return Report("cmd", "w", "desc", "now", 1.0, Slo(), fleet or {}, stages, {"1 rps": 0.9}, runs=runs)


def test_compare_reports_errors_and_whether_the_ranking_holds() -> None:
    real = _report({"cognitora-envoy": (1.0, 2.0), "envoy-rr": (4.0, 8.0)})
    same = _report({"cognitora-envoy": (1.2, 2.1), "envoy-rr": (3.0, 9.0)})
    text = compare([real], [same], "python -m bench.real_engines --compare")
    assert "| 1 rps | cognitora-envoy | 1.00 | 1.20 | +20% | 2.00 | 2.10 | +5% |" in text
    assert "| 1 rps | envoy-rr | 4.00 | 3.00 | -25% | 8.00 | 9.00 | +12% |" in text
    assert "within 25% of the real engines: 4 of 4" in text
    assert "| 1 rps | ttft_p90 | cognitora-envoy, envoy-rr | cognitora-envoy, envoy-rr | yes |" in text
    flipped = _report({"cognitora-envoy": (5.0, 9.0), "envoy-rr": (1.0, 2.0)})
    text = compare([real], [flipped], "cmd")
    assert "| 1 rps | ttft_p90 | cognitora-envoy, envoy-rr | envoy-rr, cognitora-envoy | no |" in text
    assert "within 25% of the real engines: 0 of 4" in text


def test_a_target_only_the_real_run_had_is_left_out_of_the_ranking() -> None:
    # The real run adds cognitora-litellm-redis-1w, which the sim run does not have: before, each of its decided
    # pairs counted as one the sim got wrong (20 of 72 on the 2026-12-07 run, all of them this target's).
    real = _report({"cognitora-envoy": (1.0, 2.0), "envoy-rr": (4.0, 8.0), "cognitora-litellm-redis-1w": (0.5, 1.0)})
    sim = _report({"cognitora-envoy": (1.1, 2.2), "envoy-rr": (3.9, 8.5)})
    text = compare([real, real], [sim], "cmd")
    assert "| 1 rps | ttft_p90 | cognitora-envoy, envoy-rr | cognitora-envoy, envoy-rr | yes | 1 of 1: " in text
    assert "redis-1w > " not in text


def test_the_sim_shares_the_real_runs_cores_unless_told_otherwise() -> None:
    assert parse_args(["--sim"]).host_cores == 2  # the real run's 3 engines on this machine's 2 cores
    assert parse_args(["--sim", "--host-cores", "0"]).host_cores == 0
    real = _report({"cognitora-envoy": (1.0, 2.0)})
    shared = _report({"cognitora-envoy": (1.0, 2.0)}, {"sim_args": ["--disable-scale-out", "--host-cores", "2"]})
    assert "`cognitora sim fleet --profile cpu --host-cores 2`, its engines sharing 2 cores" in compare(
        [real], [shared], "c"
    )
    assert "`cognitora sim fleet --profile cpu`. Each cell" in compare([real], [real], "c")


def test_the_engines_run_the_committed_results_executor_and_the_normal_class_unless_told_otherwise() -> None:
    # the committed run (2026-12-07) used vLLM's uni executor: on 2 cores the mp worker's spinning is a core the
    # routers do not get; the scheduling class stays the normal one
    assert (parse_args([]).engine_executor, parse_args([]).engine_sched) == ("uni", "other")
    assert parse_args(["--engine-executor", "mp"]).engine_executor == "mp"
    assert parse_args(["--engine-sched", "idle"]).engine_sched == "idle"


def test_the_gateway_share_is_the_clients_ttft_minus_the_engines_own() -> None:
    from bench.real_engines import gateway_section, gateway_times
    from bench.report import EngineStats

    report = _report({"cognitora-litellm": (1.0, 2.0), "cognitora-envoy": (1.0, 2.0), "sim-only": (1.0, 2.0)})
    timed = {"cognitora-litellm": [(3.0, 2), (1.0, 1)], "cognitora-envoy": [(2.4, 3)]}  # (sum s, count) per engine
    for run in report.runs:
        run.engines = [
            EngineStats(url=f"e{i}", ttft_sum_s=s, ttft_count=n) for i, (s, n) in enumerate(timed.get(run.target, []))
        ]
    requests = [
        *({"target": "cognitora-litellm", "ttft_s": t} for t in (2.0, 3.0, 4.0)),
        {"target": "cognitora-litellm", "ttft_s": None},  # no first token: not in the client's mean
        *({"target": "cognitora-envoy", "ttft_s": t} for t in (0.8, 0.9, 1.0)),
        {"target": "sim-only", "ttft_s": 1.0},  # the engines did not time it: left out
    ]
    seed = gateway_times(report, requests)
    assert seed["cognitora-litellm"] == pytest.approx((3.0, 4.0 / 3))
    assert seed["cognitora-envoy"] == pytest.approx((0.9, 0.8))
    assert "sim-only" not in seed
    other = {"cognitora-litellm": (5.0, 2.0), "cognitora-envoy": (1.0, 0.9)}
    text = gateway_section([seed, other, {"cognitora-litellm": (4.0, 2.0), "cognitora-envoy": (1.2, 1.0)}])
    assert "| cognitora-litellm | 4.00 [3.00-5.00] | 2.00 [1.33-2.00] | 2.00 [1.67-3.00] |" in text
    assert "| cognitora-envoy | 1.00 [0.90-1.20] | 0.90 [0.80-1.00] | 0.10 [0.10-0.20] |" in text
    assert gateway_section([{}]) == ""
