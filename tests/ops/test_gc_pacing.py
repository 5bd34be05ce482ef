"""``GcPacer``: while it runs, every garbage collection starts from its loop callback (never inside a
``ContextVar.set``, where CPython can crash: python/cpython#148891), garbage is still collected, and stopping it gives
the process its automatic collector back."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import signal
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cognitora.ops.gc_pacing import GcPacer

VAR: contextvars.ContextVar[int] = contextvars.ContextVar("test_gc_pacing", default=0)


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was_enabled = gc.isenabled()
    yield
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def started_by_pacer() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is GcPacer.collect_due.__code__:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Cycle:
    """Garbage only the cycle collector frees."""

    def __init__(self) -> None:
        self.me = self


class SettingCycle(Cycle):
    """The same, whose finalizer sets a context variable, as LiteLLM's abandoned coroutines do: with Python's own
    collector this is the pattern that can crash CPython, so only the pacer's tests make it."""

    def __del__(self) -> None:
        VAR.set(VAR.get() + 1)


async def churn(rounds: int, kind: type[Cycle] = SettingCycle) -> list[weakref.ref[Cycle]]:
    """Allocates cycles and sets a context variable, 2,000 a round, yielding to the loop after each round."""
    refs: list[weakref.ref[Cycle]] = []
    for _ in range(rounds):
        for i in range(2_000):
            refs.append(weakref.ref(kind()))
            VAR.set(i)
        await asyncio.sleep(0.001)
    return refs


def test_every_collection_starts_from_the_pacer_and_garbage_is_still_collected() -> None:
    starts: list[bool] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            starts.append(started_by_pacer())

    async def scenario() -> list[weakref.ref[Cycle]]:
        pacer = GcPacer(0.01)
        assert pacer.start(asyncio.get_running_loop())
        gc.callbacks.append(on_gc)
        try:
            refs = await churn(20)
            deadline = asyncio.get_running_loop().time() + 5
            while any(r() is not None for r in refs):
                assert asyncio.get_running_loop().time() < deadline, "the pacer left garbage uncollected"
                await asyncio.sleep(0.01)
        finally:
            gc.callbacks.remove(on_gc)
            pacer.stop()
        assert sum(pacer.collections) == len(starts)
        return refs

    refs = asyncio.run(scenario())
    assert len(refs) > 10_000
    assert starts, "no collection ran"
    assert all(starts), f"{starts.count(False)} of {len(starts)} collections started at an allocation"
    assert gc.isenabled()


def test_without_the_pacer_collections_start_at_allocations() -> None:
    """The check above can fail: the same churn with Python's own collector (cycles without the finalizer, which
    could crash it) starts collections at allocations."""
    starts: list[bool] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            starts.append(started_by_pacer())

    gc.enable()
    gc.callbacks.append(on_gc)
    try:
        asyncio.run(churn(20, kind=Cycle))
    finally:
        gc.callbacks.remove(on_gc)
    assert starts and not any(starts)


def test_a_process_whose_collector_is_off_keeps_it_off() -> None:
    gc.disable()

    async def scenario() -> None:
        pacer = GcPacer(0.01)
        assert not pacer.start(asyncio.get_running_loop())
        pacer.stop()

    asyncio.run(scenario())
    assert not gc.isenabled()


def test_one_pacer_per_process_and_stop_is_idempotent() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        first, second = GcPacer(0.01), GcPacer(0.01)
        assert first.start(loop)
        assert not second.start(loop)
        second.stop()
        assert not gc.isenabled(), "a pacer that never started turned the collector back on"
        first.stop()
        first.stop()
        assert gc.isenabled()
        assert second.start(loop), "the first pacer's stop let another start"
        second.stop()

    asyncio.run(scenario())


def test_a_nonpositive_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be positive"):
        GcPacer(0)


def test_garbage_that_reached_the_oldest_generation_is_collected_once_it_grew_by_a_quarter() -> None:
    async def scenario() -> tuple[int, list[int]]:
        pacer = GcPacer(0.005)
        assert pacer.start(asyncio.get_running_loop())
        try:
            old = [SettingCycle() for _ in range(max(50_000, len(gc.get_objects(generation=2)) // 2))]
            refs = [weakref.ref(c) for c in old[:: len(old) // 100]]
            gc.collect(1)  # what survives a collection of the middle generation moves to the oldest
            del old
            deadline = asyncio.get_running_loop().time() + 30
            while any(r() is not None for r in refs):
                assert asyncio.get_running_loop().time() < deadline, f"no full collection: {pacer.collections}"
                await churn(5)
            return len(refs), pacer.collections
        finally:
            pacer.stop()

    freed, collections = asyncio.run(scenario())
    assert freed >= 100
    assert collections[2] >= 1


@pytest.mark.parametrize("mode", ["plain", "paced"])
def test_the_crash_it_prevents(mode: str) -> None:
    """The churn that segfaults this CPython with its own collector (every run here: 8 of 8) runs to the end paced.
    If a CPython release fixes python/cpython#148891, the plain run survives and this test says so: the pacing can
    then go for that version."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.ops.contextvar_gc_crash", mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    if mode == "paced":
        assert run.returncode == 0 and "survived" in run.stdout, (run.returncode, run.stderr[-2000:])
    else:
        assert run.returncode == -signal.SIGSEGV, (
            f"the plain churn exited {run.returncode} instead of crashing: has {sys.version.split()[0]} fixed "
            "python/cpython#148891? Then GcPacer is not needed on it"
        )
