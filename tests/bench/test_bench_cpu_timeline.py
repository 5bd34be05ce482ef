"""The per-stage CPU figure of the benchmark (bench/cpu_timeline.py): mean cores between two wall times."""

from __future__ import annotations

import asyncio

from bench.cpu_timeline import CpuTimeline


def test_cores_between_interpolates_between_samples() -> None:
    # One core busy for the first 10 s, then idle.
    timeline = CpuTimeline(lambda: 0.0, samples=[(0.0, 0.0), (4.0, 4.0), (10.0, 10.0), (20.0, 10.0)])
    assert timeline.cores_between(2.0, 8.0) == 1.0
    assert timeline.cores_between(10.0, 20.0) == 0.0
    assert timeline.cores_between(5.0, 15.0) == 0.5


def test_a_window_it_cannot_cover_has_no_figure() -> None:
    timeline = CpuTimeline(lambda: 0.0, samples=[(0.0, 0.0), (4.0, 4.0)])
    assert timeline.cores_between(1.0, 1.5) is None  # shorter than one sampling interval
    assert timeline.cores_between(2.0, 9.0) is None  # past the last sample
    assert CpuTimeline(lambda: 0.0).cores_between(0.0, 5.0) is None


def test_sampling_reads_the_counter_over_time() -> None:
    reads = iter(range(100))
    timeline = CpuTimeline(lambda: float(next(reads)), interval_s=0.01)

    async def sample_a_while() -> None:
        timeline.sample()  # taken at once, before the loop runs: the run's start lies within the samples
        assert len(timeline.samples) == 1
        task = asyncio.create_task(timeline.sample_forever())
        while len(timeline.samples) < 3:
            await asyncio.sleep(0.005)
        task.cancel()

    asyncio.run(sample_a_while())
    times = [t for t, _ in timeline.samples]
    assert [c for _, c in timeline.samples[:3]] == [0.0, 1.0, 2.0] and times == sorted(times)
