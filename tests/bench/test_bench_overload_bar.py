"""Issue 42's overload bar read from protocol runs (bench/overload_bar.py), on a small synthetic run."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench import overload_bar
from bench.loadgen import RequestResult
from bench.report import Report, Slo, TargetRun, report_json, summarize_stage

SEEDS = (11, 12, 13)
PEER, PLAIN, FLOW = "sglang-cache-aware", "cognitora-envoy", "cognitora-envoy@flow_control={}"
SHORT, LONG = 1_000, 40_000
"""Prompt tokens: SHORT prefills in ~0.1 s on an idle h100x2 engine, LONG in ~4.7 s (over the 2 s objective)."""
TIMEOUT = (
    "waited 0.812 s and the fleet is still saturated: placed any later, this request would miss class 'default''s "
    "2 s TTFT objective (the wait follows it; flow_control max_wait_s overrides); retry later"
)

Request = tuple[int, float | str]
"""(prompt tokens, TTFT or the error status answered before any token: "429", "400")"""
TOO_LONG = "This model's maximum context length is 40960 tokens. However, you requested 41807 tokens."


def times(n: int, prompt: int, ttft: float | str) -> list[Request]:
    return [(prompt, ttft)] * n


# Per target and stage: (prompt tokens, TTFT or error) of each of the stage's 10 requests.
# s0: below saturation; flow control's TTFT is 1.5 s where plain Cognitora's is 0.5 s (good, but worse); one
#     prompt every engine refuses (over the context; short to prefill, as a cached one): unreachable too.
# s1: two prompts no router serves in time: the peer's TTFT p90 is over 2 s on all requests, not on the rest.
# s2: the peer serves 4 of 10 in time; flow control 8, and answers 2 with a queue timeout (429).
PLAN: dict[str, dict[str, list[Request]]] = {
    PEER: {
        "s0": times(9, SHORT, 0.5) + times(1, SHORT, "400"),
        "s1": times(8, SHORT, 0.5) + times(2, LONG, 5.0),
        "s2": times(4, SHORT, 0.5) + times(6, SHORT, 3.0),
    },
    PLAIN: {
        "s0": times(9, SHORT, 0.5) + times(1, SHORT, "400"),
        "s1": times(8, SHORT, 0.5) + times(2, LONG, 5.0),
        "s2": times(4, SHORT, 0.5) + times(6, SHORT, 3.0),
    },
    FLOW: {
        "s0": times(9, SHORT, 1.5) + times(1, SHORT, "400"),
        "s1": times(8, SHORT, 0.5) + times(2, LONG, 5.0),
        "s2": times(8, SHORT, 0.5) + times(2, SHORT, "429"),
    },
}


def _result(index: int, stage: int, label: str, prompt: int, ttft: float | str) -> RequestResult:
    arrival = 10.0 * stage + index % 10
    if isinstance(ttft, str):
        error = TIMEOUT if ttft == "429" else TOO_LONG
        return RequestResult(index, label, True, arrival, status=int(ttft), error=error, content_tokens=prompt)
    return RequestResult(
        index, label, True, arrival, status=200, ttft_s=ttft, itl_s=0.02, e2e_s=ttft + 0.2, prompt_tokens=prompt + 14,
        completion_tokens=10, content_tokens=prompt, tokens_received=10, max_tokens=10, end_s=arrival + ttft + 0.2,
    )  # fmt: skip


def write_run(prefix: Path, keep_records: bool = True, plan: dict[str, dict[str, list[Request]]] | None = None) -> None:
    labels = ["s0", "s1", "s2"]
    slo = Slo(2.0, 0.1)
    for seed in SEEDS:
        rows, runs = [], []
        for target, stages in (plan or PLAN).items():
            results = [
                _result(10 * i + j, i, label, prompt, ttft)
                for i, label in enumerate(labels)
                for j, (prompt, ttft) in enumerate(stages[label])
            ]
            rows += [{"target": target, **asdict(r)} for r in results]
            summaries = [
                summarize_stage(lb, 1.0, 10.0, [r for r in results if r.stage == lb], 0.0, slo) for lb in labels
            ]
            runs.append(TargetRun(target=target, settings="", stages=summaries, total_requests=len(results)))
        report = Report(
            command="python -m bench.run_all", workload="long-context", description="d", started_at="",
            time_scale=1.0, slo=slo, fleet={"engines": 2, "profile": "h100x2"},
            stages=[{"label": lb, "rate": 1.0, "duration_s": 10.0, "measured": True} for lb in labels],
            reuse_bound=dict.fromkeys(labels, 0.0), runs=runs,
        )  # fmt: skip
        Path(f"{prefix}_seed{seed}.json").write_text(json.dumps(report_json(report)))
        if keep_records:
            with gzip.open(f"{prefix}_seed{seed}.requests.jsonl.gz", "wt") as fh:
                fh.writelines(json.dumps(row) + "\n" for row in rows)


def test_the_bar_never_worse_the_reachable_bar_and_the_429s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "lc")
    assert overload_bar.main([str(tmp_path / "lc"), "--out", str(tmp_path / "bar.md")]) == 0
    text = capsys.readouterr().out
    assert text == (tmp_path / "bar.md").read_text()
    # 1. On all requests the peer misses at s1 (the two long prompts): everyone serves the same 8.
    assert "First stage where the best peer misses the TTFT SLO (all requests): **s1**, sglang-cache-aware" in text
    assert f"| {FLOW} | {same(0.8)} | 0.80, 0.80, 0.80 | 1.00x | {same(1)} | not met (1.00x) |" in text
    # 2. Below s1, flow control's TTFT p90 is worse than plain Cognitora's at s0, and the line says where.
    seeds = {v: f"{same(v)} ({v:.2f}, {v:.2f}, {v:.2f})" for v in (0.9, 1.5, 0.5, 0.8, 5.0)}
    assert f"| s0 | {FLOW} | {seeds[0.9]} | {seeds[0.9]} | within range | {seeds[1.5]} | {seeds[0.5]} | worse |" in text
    assert f"**Never worse below saturation: fails**: {FLOW} at s0 (TTFT p90 worse)." in text
    # 3. On reachable requests the peer meets s1 and misses s2, where flow control serves twice what it does.
    assert f"| s0 | 1 / 10, 1 / 10, 1 / 10 | {PEER} | {same(0.9)} | {same(0.5)} | {same(0.5)} |" in text
    assert f"| s1 | 2 / 10, 2 / 10, 2 / 10 | {PEER} | {same(0.8)} | {same(0.5)} | {same(5)} |" in text
    assert "First stage where the best peer misses the TTFT SLO (on reachable requests): **s2**" in text
    assert f"| {FLOW} | {same(0.8)} | 0.80, 0.80, 0.80 | 2.00x | {same(2)} | **met** (2.00x) |" in text
    assert f"| {PLAIN} | {same(0.4)} | 0.40, 0.40, 0.40 | 1.00x | {same(1)} | not met (1.00x) |" in text
    # ... and "never worse" read below s2 too: s1 within range, s0 still worse.
    assert "Never worse below saturation, read below s2 (where the peer misses on reachable requests):" in text
    assert f"| s1 | {FLOW} | {seeds[0.8]} | {seeds[0.8]} | within range | {seeds[5.0]} | {seeds[5.0]} |" in text
    assert text.count(f"**Never worse below saturation: fails**: {FLOW} at s0 (TTFT p90 worse).") == 2
    # 4. The 429s, by kind, from the records.
    assert f"| {FLOW} | s2 | 2, 2, 2 | 10, 10, 10 | 6 / 0 / 0 / 0 | records |" in text
    assert f"| {PLAIN} | every stage | 0 |" in text


def same(v: float) -> str:
    """A median [range] over seeds that agree."""
    return f"{v:.2f} [{v:.2f}-{v:.2f}]"


def test_without_records_it_says_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "lc", keep_records=False)
    assert overload_bar.main([str(tmp_path / "lc")]) == 0
    text = capsys.readouterr().out
    assert f"Per-request records kept by: none; not by: {PEER} (seeds 11, 12, 13);" in text
    assert "The bar on reachable requests is not read: no target kept records." in text
    assert "(on reachable requests)" not in text
    # The 429s still come from the JSON's error counts.
    assert f"| {FLOW} | s2 | 2, 2, 2 | 10, 10, 10 | 6 / 0 / 0 / 0 | JSON |" in text


def test_a_ladder_saturated_from_its_first_stage_has_nothing_below_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = {**PLAN, PEER: {**PLAN[PEER], "s0": times(10, SHORT, 3.0)}}
    write_run(tmp_path / "lc", plan=plan)
    assert overload_bar.main([str(tmp_path / "lc")]) == 0
    text = capsys.readouterr().out
    assert "First stage where the best peer misses the TTFT SLO (all requests): **s0**" in text
    assert "No stage below s0 on this ladder (the peer misses at its first stage)" in text
    assert "Never worse below saturation: fails" not in text.split("### 3.")[0]
