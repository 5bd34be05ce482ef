"""A demo or benchmark that could not run a target says why, writes no result for it, and exits non-zero."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import demo, run_all
from bench.report import StageSummary, TargetRun, why_unusable


def test_demo_reports_the_real_error_and_exits_1_when_the_fleet_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "tokenizer.json"
    out = tmp_path / "demo"
    code = demo.main(["--tokenizer", str(missing), "--out", str(out), "--no-progress"])
    printed = capsys.readouterr()
    assert code == 1
    # The fleet's own complaint reaches the user, for each target, instead of an empty table row.
    assert f"--tokenizer {missing}: no such file" in printed.err
    assert "round-robin (Envoy) could not run" in printed.err
    assert "Cognitora (LiteLLM) could not run" in printed.err
    assert "PLACEHOLDER" not in printed.out + printed.err
    # No report of a run that did not happen (not even its directory).
    assert not out.exists()


def test_bench_exits_1_and_names_the_target_that_could_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "tokenizer.json"
    argv = [
        "--workload", "shared-prefix-32x32", "--rates", "2", "--stage-duration", "1", "--warmup", "",
        "--engines", "1", "--targets", "envoy-rr", "--tokenizer", str(missing), "--out", str(tmp_path / "b"),
        "--no-progress",
    ]  # fmt: skip
    assert run_all.main(argv) == 1
    err = capsys.readouterr().err
    assert "FAILED: envoy-rr could not run: the simulated fleet did not start" in err
    assert f"--tokenizer {missing}: no such file" in err


def test_a_run_where_no_request_succeeded_is_not_a_result() -> None:
    run = TargetRun(target="t", settings="", total_requests=5, total_ok=0, errors={"HTTP 503": 5})
    assert why_unusable(run) == "none of its 5 requests succeeded (5 x HTTP 503)"
    assert why_unusable(TargetRun(target="t", settings="", skipped="failed to start: boom")) == "failed to start: boom"
    assert why_unusable(TargetRun(target="t", settings="", total_requests=5, total_ok=1)) is None


def test_an_overloaded_target_whose_requests_the_deadline_cut_is_still_a_result() -> None:
    """Round-robin in `make demo`: every request still streaming when the run ended, none finished; its TTFT and
    token pace are the result (the slow target the demo exists to show), not a failure to run."""
    stage = StageSummary(
        stage="10 rps", offered_rps=10, duration_s=8, requests=5, ok=0, failed=0, ttft_p50=2.7, ttft_p90=4.2,
        ttft_p99=4.9, itl_p50=0.02, e2e_p50=9.0, e2e_p99=12.0, output_tps=180.0, goodput_rps=0.0, hit_rate=0.2,
        reuse_bound=0.6, prompt_tokens=5000, cached_tokens=1000, completion_tokens=0,
    )  # fmt: skip
    run = TargetRun(target="envoy-rr", settings="", total_requests=5, total_ok=0, stages=[stage])
    assert why_unusable(run) is None
    silent = TargetRun(target="t", settings="", total_requests=5, total_ok=0, stages=[replace(stage, output_tps=0.0)])
    assert why_unusable(silent) == "none of its 5 requests succeeded"


def test_cognitora_targets_take_placement_overrides_and_peers_refuse_them(tmp_path: Path) -> None:
    from bench.targets import TargetUnavailable, make_target, split_target

    name = "cognitora-envoy@power_ttft_slack_s=0;power_e2e_slack_ratio=0.2"
    assert split_target(name) == ("cognitora-envoy", {"power_ttft_slack_s": 0, "power_e2e_slack_ratio": 0.2})
    target = make_target(name, "m", tmp_path)
    assert target.name == name and target.placement == {"power_ttft_slack_s": 0, "power_e2e_slack_ratio": 0.2}
    assert "placement overrides: power_ttft_slack_s=0" in target.settings
    assert run_all.resolve_targets(f"envoy-rr,{name}") == ["envoy-rr", name]
    with pytest.raises(TargetUnavailable, match="takes no placement overrides"):
        make_target("envoy-rr@tie_band_s=0", "m", tmp_path)
    with pytest.raises(TargetUnavailable, match="key=value"):
        split_target("cognitora-envoy@oops")


def test_cost_model_overrides_nest_by_their_dotted_keys(tmp_path: Path) -> None:
    from bench.targets import make_target

    target = make_target("cognitora-litellm@cost_model.feedback.enabled=false;recompute_weight=0", "m", tmp_path)
    assert target.placement == {"recompute_weight": 0}
    assert target.cost_model == {"feedback": {"enabled": False}}
    shedding = make_target("cognitora-envoy@priorities.default.itl_slo_s=0.1;priorities.default.sheddable=true", "m")
    assert shedding.placement == {"priorities": {"default": {"itl_slo_s": 0.1, "sheddable": True}}}


def test_the_demo_table_shows_requests_cut_while_streaming_as_such_not_as_failures() -> None:
    """Round-robin at the demo's deadline: 158 sent, none finished, 150 still streaming, 8 queued. The table counts
    the 150 as served (with their TTFT), the 8 as queued, none as failed: not "finished 0" or "0/158"."""
    stage = StageSummary(
        stage="10 rps", offered_rps=10, duration_s=16, requests=158, ok=0, failed=158, ttft_p50=2.7, ttft_p90=4.2,
        ttft_p99=4.9, itl_p50=0.02, e2e_p50=9.0, e2e_p99=12.0, output_tps=180.0, goodput_rps=0.0, hit_rate=None,
        reuse_bound=0.6, prompt_tokens=0, cached_tokens=0, completion_tokens=0, streaming_at_cut=150,
        waiting_at_cut=8,
    )  # fmt: skip
    run = TargetRun(target="envoy-rr", settings="", total_requests=158, total_ok=0, stages=[stage])
    table = demo._table([demo._row("round-robin (Envoy)", run, stage)])
    header, row = (line for line in table.splitlines() if line.startswith("|"))
    cells = dict(zip((c.strip() for c in header.split("|")), (c.strip() for c in row.split("|")), strict=True))
    assert cells["sent"] == "158" and cells["served"] == "150" and "finished" not in cells
    assert cells["queued at deadline"] == "8" and cells["failed"] == "0"
    assert (cells["TTFT p50 s"], cells["TTFT p90 s"]) == ("2.70", "4.20")
    assert "0/158" not in table


def test_the_bench_report_counts_streams_cut_by_the_run_apart_from_errors() -> None:
    """B2B SaaS decodes 1,000 tokens a request, longer than the run waits: every request is still streaming at the
    end. The per-stage table must not read "0/3" and the Errors section must not list them; a real error still is."""
    from bench.loadgen import RequestResult
    from bench.report import Report, Slo, render_markdown, summarize_stage

    cut = "not finished when the run ended"
    results = [
        RequestResult(0, "30 rps", True, 0.0, status=200, error=cut, censored=True, ttft_s=0.4, itl_s=0.05,
                      tokens_received=300, max_tokens=1000),
        RequestResult(1, "30 rps", True, 0.1, status=200, error=cut, censored=True, ttft_s=0.5, itl_s=0.05,
                      tokens_received=280, max_tokens=1000),
        RequestResult(2, "30 rps", True, 0.2, status=200, error=cut, censored=True, ttft_s=9.0, max_tokens=1000),
        RequestResult(3, "30 rps", True, 0.3, status=429, error="fleet saturated", ttft_s=None, max_tokens=1000),
    ]  # fmt: skip
    stage = summarize_stage("30 rps", 30.0, 1.0, results, 0.9, Slo())
    assert stage.errors == {"429: fleet saturated": 1}
    assert (stage.streaming_at_cut, stage.waiting_at_cut, stage.errored) == (2, 1, 1)
    assert stage.goodput_rps == 2.0  # the two streams that met the SLO before the cut count
    report = Report(
        command="c", workload="w", description="d", started_at="now", time_scale=1.0, slo=Slo(), fleet={},
        stages=[{"label": "30 rps", "measured": True}], reuse_bound={"30 rps": 0.9},
        runs=[TargetRun(target="t", settings="", total_requests=4, stages=[stage])],
    )  # fmt: skip
    text = render_markdown(report)
    assert "| 30 rps | t | 4.0 | 0 / 2 / 4 |" in text
    errors = text.split("## Errors")[1].split("##")[0]
    assert "fleet saturated" in errors and cut not in errors
    assert "- t / 30 rps: 2 streaming, 1 queued" in text.split("## Cut by the run's end")[1]
