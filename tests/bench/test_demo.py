"""``make demo``'s verdict, exit status and files, at unit level (the real demo takes minutes: it is run by hand,
its table is in docs/benchmarks.md).

The runs are made up here (``run_all.run_target`` replaced by one that returns given TTFTs): what is under test is
what the demo makes of them: requests served with their TTFT (streams cut at the deadline are served, not failed),
a non-zero exit when Cognitora is not ahead of round-robin, and files written to a new directory outside the
checkout, never over anything.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from bench import demo, run_all
from bench import workloads as wl
from bench.loadgen import RequestResult
from bench.report import Slo, StageSummary, TargetRun, engine_hit_and_bound, summarize_stage
from bench.ttft_plot import series

ROOT = Path(__file__).resolve().parents[2]
STAGE = f"{demo.STAGE_RATE:g} rps"


def results(ttfts: Sequence[float], queued: int = 0) -> list[RequestResult]:
    """Requests of the measured stage: each streamed 300 tokens, then the deadline cut it; ``queued`` more had no
    first token by the deadline (their TTFT: the wait so far)."""
    cut = "not finished when the run ended"
    streamed = [
        RequestResult(i, STAGE, True, i * 0.1, status=200, error=cut, censored=True, ttft_s=t, itl_s=0.04,
                      tokens_received=300, max_tokens=1000, end_s=i * 0.1 + 20.0)
        for i, t in enumerate(ttfts)
    ]  # fmt: skip
    waiting = [
        RequestResult(len(ttfts) + j, STAGE, True, 15.0, status=0, error=cut, censored=True, ttft_s=5.0,
                      max_tokens=1000, end_s=20.0)
        for j in range(queued)
    ]  # fmt: skip
    return streamed + waiting


def fake_run_target(ttfts: dict[str, list[float]], queued: int = 0) -> Callable[..., TargetRun]:
    def run_target(
        name: str,
        schedule: wl.Schedule,
        spec: run_all.FleetSpec,
        args: argparse.Namespace,
        slo: Slo,
        raw: list[dict[str, Any]] | None = None,
    ) -> TargetRun:
        rs = results(ttfts[name.split("-")[0]], queued)
        assert raw is not None, "the demo keeps every request (for its plot)"
        raw.extend({"target": name, **asdict(r)} for r in rs)
        served = sum(1 for r in rs if r.tokens_received > 0)
        run = TargetRun(target=name, settings="made up", total_requests=len(rs), total_ok=0, total_served=served)
        run.stages = [summarize_stage(STAGE, demo.STAGE_RATE, demo.STAGE_S, rs, 0.7, slo)]
        engine_hit_and_bound(run, rs)
        return run

    return run_target


FAST, SLOW = [0.2, 0.3, 0.4, 0.5, 0.6], [2.0, 2.5, 3.0, 4.0, 4.5]


def run_demo(monkeypatch: pytest.MonkeyPatch, ttfts: dict[str, list[float]], argv: list[str], queued: int = 0) -> int:
    monkeypatch.setattr(run_all, "run_target", fake_run_target(ttfts, queued))
    return demo.main([*argv, "--no-progress"])


def stage(ttft_p90: float | None, goodput: float) -> StageSummary:
    return StageSummary(
        stage=STAGE, offered_rps=10, duration_s=16, requests=10, ok=0, failed=10, ttft_p50=None, ttft_p90=ttft_p90,
        ttft_p99=None, itl_p50=None, e2e_p50=None, e2e_p99=None, output_tps=1.0, goodput_rps=goodput,
        hit_rate=None, reuse_bound=0.7, prompt_tokens=0, cached_tokens=0, completion_tokens=0, streaming_at_cut=10,
    )  # fmt: skip


def test_verdict_ahead_needs_a_lower_ttft_p90_and_no_less_goodput() -> None:
    assert demo.verdict(stage(1.0, 5.0), stage(4.0, 2.0)).ahead
    assert demo.verdict(stage(1.0, 2.0), stage(4.0, 2.0)).ahead  # the same goodput, faster
    slower = demo.verdict(stage(4.5, 5.0), stage(4.0, 2.0))
    assert not slower.ahead and "TTFT p90 is not lower" in slower.reason and "4.50 s vs 4.00 s" in slower.reason
    less = demo.verdict(stage(1.0, 1.0), stage(4.0, 2.0))
    assert not less.ahead and "goodput is lower" in less.reason
    assert not demo.verdict(stage(None, 0.0), stage(4.0, 2.0)).ahead
    assert not demo.verdict(None, stage(4.0, 2.0)).ahead
    assert demo.verdict(stage(1.0, 5.0), stage(None, 0.0)).ahead


def test_cognitora_ahead_exits_0_and_writes_every_file_where_it_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = run_demo(monkeypatch, {"envoy": SLOW, "sglang": FAST, "cognitora": FAST}, ["--out", str(out)], queued=1)
    printed = capsys.readouterr().out
    assert code == 0
    assert "Verdict: Cognitora is ahead of round-robin (Envoy)" in printed
    assert f"Results: {out}/" in printed
    assert sorted(p.name for p in out.iterdir()) == ["demo.json", "demo.md", "demo.png", "demo.requests.jsonl.gz"]
    assert (out / "demo.png").stat().st_size > 20_000
    with gzip.open(out / "demo.requests.jsonl.gz", "rt") as fh:
        assert len(fh.readlines()) == 3 * (len(FAST) + 1)
    # The full report says served too, not "0 / 6" (none finished: every answer outlasts the demo).
    assert "| cognitora-litellm | made up | 5 / 6 (0 finished) |" in (out / "demo.md").read_text()
    report = json.loads((out / "demo.json").read_text())
    assert [r["target"] for r in report["runs"]] == ["envoy-rr", "sglang-cache-aware", "cognitora-litellm"]
    # Served with their TTFT: the 5 streams the deadline cut; the one without a first token is queued; none failed.
    row = next(line for line in printed.splitlines() if line.startswith("| Cognitora (LiteLLM)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert dict(zip(demo.HEADER, cells, strict=True)) | {"TTFT p50 s": "", "TTFT p90 s": ""} == {
        "target": "Cognitora (LiteLLM)", "sent": "6", "served": "5", "TTFT p50 s": "", "TTFT p90 s": "",
        "queued at deadline": "1", "failed": "0", "goodput req/s": "0.31", "cache hit*": "-", "reuse bound*": "-",
    }  # fmt: skip


def test_cognitora_not_ahead_of_round_robin_exits_2_and_still_writes_its_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = run_demo(monkeypatch, {"envoy": FAST, "sglang": FAST, "cognitora": SLOW}, ["--out", str(out)])
    printed = capsys.readouterr()
    assert code == demo.EXIT_NOT_AHEAD == 2
    assert "Verdict: Cognitora is NOT ahead of round-robin (Envoy): its TTFT p90 is not lower" in printed.err
    assert (out / "demo.md").exists() and (out / "demo.png").exists()


def test_by_default_results_go_to_a_new_directory_outside_the_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    committed = {p: p.stat().st_mtime_ns for p in (ROOT / "bench" / "results").iterdir()}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ttfts = {"envoy": SLOW, "sglang": FAST, "cognitora": FAST}
    assert run_demo(monkeypatch, ttfts, []) == 0
    assert run_demo(monkeypatch, ttfts, []) == 0  # a second run: its own directory, the first one's kept
    runs = sorted((tmp_path / "cache" / "cognitora" / "demo").iterdir())
    assert len(runs) == 2 and all((r / "demo.png").exists() for r in runs)
    assert f"Results: {runs[0]}/" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (ROOT / "bench" / "results").iterdir()} == committed


def test_an_out_directory_with_files_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "keep.md").write_text("mine")

    def must_not_run(*args: object, **kwargs: object) -> TargetRun:
        raise AssertionError("the demo ran a target before refusing --out")

    monkeypatch.setattr(run_all, "run_target", must_not_run)
    with pytest.raises(SystemExit, match="not an empty directory; the demo never overwrites files"):
        demo.main(["--out", str(tmp_path)])
    assert (tmp_path / "keep.md").read_text() == "mine"


def test_the_plot_draws_every_request_of_the_stage_queued_ones_at_their_wait_so_far() -> None:
    drawn = series("Cognitora", results(FAST, queued=2), STAGE)
    assert len(drawn.points) == 7 and drawn.served == 5
    ttfts, shares = drawn.cdf()
    assert ttfts == [*FAST, 5.0, 5.0] and shares[-1] == 1.0
    assert drawn.points[0][0] == 0.0  # arrivals from the stage's first
