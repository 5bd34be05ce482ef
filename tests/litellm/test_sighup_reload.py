"""``litellm_plugin.live.sighup_reloads``: SIGHUP reloads the config where nobody else handles it, and is left alone
where somebody does (the end-to-end test sends SIGHUP to a real proxy: tests/e2e/test_litellm_ops_e2e.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cognitora.ops.reload import ConfigSource, ReloadOutcome
from litellm_plugin.live import sighup_reloads


class FakeLive:
    def __init__(self) -> None:
        self.source = ConfigSource(Path("cognitora.yaml"), lambda: None)  # type: ignore[arg-type,return-value]
        self.reloaded: list[str] = []
        self.done = asyncio.Event()

    async def reload(self, why: str = "SIGHUP") -> ReloadOutcome:
        self.reloaded.append(why)
        self.done.set()
        return ReloadOutcome(True, "changed: placement", ("placement",))

    async def retire_idle(self) -> None:
        return None


@pytest.fixture
def default_sighup() -> Iterator[None]:
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


def reloads_on_a_real_sighup() -> list[str]:
    """Install the handler, send this process a SIGHUP, wait for the reload, take the handler off; the reloads seen."""

    async def run() -> list[str]:
        live = FakeLive()
        off = sighup_reloads(live, asyncio.get_running_loop())
        assert off is not None
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.wait_for(live.done.wait(), 5)
        off()
        return live.reloaded

    return asyncio.run(run())


def test_sighup_reloads_then_goes_back_to_the_default(default_sighup: None) -> None:
    assert reloads_on_a_real_sighup() == ["SIGHUP"]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


def test_an_ignored_sighup_still_reloads_and_is_ignored_again_after(default_sighup: None) -> None:
    # A proxy started under nohup (or by a runner that ignores hangups) inherits SIG_IGN: CI's first run of the
    # e2e SIGHUP tests under nohup timed out waiting for the reload.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    assert reloads_on_a_real_sighup() == ["SIGHUP"]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_a_sighup_somebody_handles_is_left_to_them(default_sighup: None) -> None:
    def theirs(signum: int, frame: object) -> None:
        return None

    signal.signal(signal.SIGHUP, theirs)

    async def run() -> object:
        return sighup_reloads(FakeLive(), asyncio.get_running_loop())

    assert asyncio.run(run()) is None
    assert signal.getsignal(signal.SIGHUP) is theirs


def test_a_loop_off_the_main_thread_takes_no_signal(default_sighup: None) -> None:
    found: list[object] = []

    async def run() -> None:
        found.append(sighup_reloads(FakeLive(), asyncio.get_running_loop()))

    thread = threading.Thread(target=lambda: asyncio.run(run()))
    thread.start()
    thread.join(10)
    assert found == [None]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
