"""bench.snapshot_diff: what a fault left, read from the snapshots the proxy dumps before and after each."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from bench import snapshot_diff

KEPT: list[bytes] = []


def keep_after_a_fault(n: int) -> None:
    KEPT.extend(bytes(1000) for _ in range(n))  # this line is the site the report must name


def test_it_names_the_site_that_kept_growing_from_fault_to_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracemalloc.start(4)
    try:
        for n in range(3):
            tracemalloc.take_snapshot().dump(str(tmp_path / f"before-{n:02d}.snap"))
            keep_after_a_fault(500)
            tracemalloc.take_snapshot().dump(str(tmp_path / f"after-{n:02d}.snap"))
    finally:
        tracemalloc.stop()
        KEPT.clear()
    assert snapshot_diff.main([str(tmp_path), "--from", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    grew = out.split("grew from before-01 to before-02:")[1].split("grew from before-02")[0]
    site = f"test_bench_snapshot_diff.py:{keep_after_a_fault.__code__.co_firstlineno + 1}"
    # 500 kept objects of ~1 KiB between the two snapshots, first in the list
    assert site in grew.splitlines()[3], grew
    assert "+500 blocks" in grew.splitlines()[2], grew
    assert "before-02" in out.split("traced MiB before each fault")[1]
