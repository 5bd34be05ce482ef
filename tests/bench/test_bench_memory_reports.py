"""The soak's and bench.litellm_rss's reports: slopes after the warm-up, and the command that reproduces a probe."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench import litellm_rss, soak


def test_the_soak_reports_a_warm_up_step_apart_from_the_steady_slope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that loads 50 MiB in its first two minutes, then stays flat: the fit over the whole run says it
    # grows, the fit from the warm-up on says it does not.
    monkeypatch.setattr(soak, "RESULTS", tmp_path)
    run = soak.Run()
    run.samples["proxy"] = [(t, 300.0 + min(t, 120.0) / 120.0 * 50.0, 20) for t in range(0, 1800, 10)]
    run.load = [2.0, 4.0, 6.0]
    args = argparse.Namespace(
        duration_s=1800, cycle_s=120, rps=3, seed=99, kv_capacity_tokens=16384, gateways="both", trace=[], limit=[],
        out=None,
    )  # fmt: skip
    soak.report(args, run, [], tmp_path / "soak_seed99")
    data = json.loads((tmp_path / "soak_seed99.json").read_text())
    proxy = data["processes"]["proxy"]
    assert proxy["rss_mib_per_hour"] > 10
    assert proxy["rss_mib_per_hour_after_warmup"] == 0.0
    assert data["load_average_1m"] == {"min": 2.0, "mean": 4.0, "max": 6.0}
    md = (tmp_path / "soak_seed99.md").read_text()
    assert "--kv-capacity-tokens 16384" in md
    assert "| proxy | 300.0 | 350.0 | 350.0 |" in md
    assert "4.0 mean" in md


def test_an_rss_only_probe_report_names_its_flags_and_where_the_growth_went(tmp_path: Path) -> None:
    out = tmp_path / "probe.md"
    args = argparse.Namespace(
        duration_s=600.0, cycle_s=120.0, rps=1.0, frames=4, tracemalloc=False, router="simple-shuffle",
        gc_pacing_s=None, limit=["tokenizer_cache_bytes=0"], malloc_arena_max=2, kv_capacity_tokens=4096,
        trace_collector=None, out=out, fault="cycle", snapshot_dir=None, count_gen2=False,
    )  # fmt: skip
    run = soak.Run()
    run.answers = [(1.0, "litellm", 200)] * 600
    # 36 MiB an hour from the outside, steadily.
    run.samples["litellm"] = [(float(t), 400.0 + t / 100.0, 16) for t in range(0, 600, 10)]
    samples = tmp_path / "probe.jsonl"
    mib = 2**20
    lines = [
        {"t": 1000.0 + t, "rss": (400 + t / 100) * mib, "threads": 8, "malloc_arena": 120 * mib,
         "malloc_mmapped": 4 * mib, "malloc_in_use": 100 * mib, "malloc_free": 20 * mib, "py_blocks": 2_000_000 + t}
        for t in range(0, 600, 60)
    ]  # fmt: skip
    samples.write_text("".join(json.dumps(x) + "\n" for x in lines))
    litellm_rss.report_rss(args, run, samples)
    text = out.read_text()
    assert (
        "`python -m bench.litellm_rss --duration-s 600 --cycle-s 120 --rps 1 --frames 4 --no-tracemalloc --router "
        "simple-shuffle --limit tokenizer_cache_bytes=0 --malloc-arena-max 2 --kv-capacity-tokens 4096 --out "
    ) in text
    assert "Requests answered 200: 600 of 600" in text
    assert "| 120 | 590 | 401.2 | 405.9 | +36.0 |" in text
    assert "| RSS MiB |" in text and "| +36.0 |" in text
    assert "| glibc malloc, arena bytes from the system MiB | 120.0 | 120.0 | +0.0 |" in text


def test_a_per_fault_report_lists_rss_before_each_fault_and_says_what_a_step_was_made_of(tmp_path: Path) -> None:
    out = tmp_path / "faults.md"
    args = argparse.Namespace(
        duration_s=480.0, cycle_s=120.0, rps=3.0, frames=4, tracemalloc=False, router="cognitora", gc_pacing_s=None,
        limit=[], malloc_arena_max=None, kv_capacity_tokens=16384, trace_collector=None, out=out,
        fault="redis-restart", faults=4, every_s=60.0, warmup_s=120.0, after_s=15.0, snapshot_dir=None,
        count_gen2=True,
    )  # fmt: skip
    run = soak.Run()
    run.answers = [(1.0, "litellm", 200)] * 100
    run.faults = [(120.0 + 60 * n, "redis-restart") for n in range(4)]
    run.samples["litellm"] = [(120.0 + 60 * n, 400.0 + (6.4 if n >= 2 else 0.0), 20) for n in range(5)]
    # every 10 s: flat, but for one 6.4 MiB step between 190 and 200 s (10 s after the second fault at 180 s)
    run.samples["litellm-10s"] = [(float(t), 400.0 + (6.4 if t >= 200 else 0.0), 20) for t in range(0, 400, 10)]
    mib = 2**20
    wall0 = 1000.0
    lines = [
        {"t": wall0 + t + 3, "rss": (400 + (6.4 if t >= 200 else 0)) * mib, "threads": 9,
         "malloc_arena": (120 + (6.4 if t >= 200 else 0)) * mib, "malloc_mmapped": 4 * mib,
         "malloc_in_use": 100 * mib, "malloc_free": (20 + (6.4 if t >= 200 else 0)) * mib, "py_blocks": 2_000_000,
         "gen2_objects": 830_000}
        for t in range(0, 400, 10)
    ]  # fmt: skip
    samples = tmp_path / "probe.jsonl"
    samples.write_text("".join(json.dumps(x) + "\n" for x in lines))
    litellm_rss.report_per_fault(args, run, samples, wall0)
    text = out.read_text()
    assert (
        "`python -m bench.litellm_rss --fault redis-restart --faults 4 --every-s 60 --warmup-s 120 --rps 3 --frames 4 "
        "--no-tracemalloc --count-gen2 --kv-capacity-tokens 16384 --out "
    ) in text
    assert "| 2 | 240 | 406.40 | +6.40 |" in text
    assert "first half of the faults +6.40, second half +0.00" in text
    assert (
        "- +6.40 MiB, from 190 s to 200 s, 10 s after a fault; inside: Python blocks +0, glibc malloc in use "
        "+0.00 MiB, free but kept +6.40 MiB, from the system +6.40 MiB, threads 9 -> 9"
    ) in text
    assert "| objects in the oldest GC generation (thousands; --count-gen2) | 830.0 | 830.0 | +0.0 |" in text
