"""Engines sharing one host's CPU cores (``cognitora sim fleet --host-cores N``; off by default).

A real CPU engine (the ``cpu`` profile: vLLM's CPU backend, one thread) computes on a core of its host. When more
engines step at once than the host has cores, the operating system shares the cores among them, and each one's steps
take longer: the real benchmark's 3 one-thread engines on a 2-core machine decoded at 47 ms a token alone and
62-122 ms under load. The sim models it as processor sharing: while ``k`` engines of the fleet are busy (have running
or waiting requests) on a host of ``N`` cores, every step of a busy engine takes ``max(1, k / N)`` times the
profile's time. Idle engines take no core and slow no one.

The share is re-evaluated whenever an engine turns busy or idle: each engine of the host is woken, and a step in
progress is re-timed from that instant (its remaining work at the new share), so a long prefill that starts alone
slows down when a second engine starts work beside it. (A run of several decode steps planned at once, which the
engine does only when no request streams, is replanned after its current step: that one step keeps its share.)

Engine time, not wall time: the sim process's own CPU use does not enter the model.
"""

from __future__ import annotations

from typing import Protocol


class SharesHost(Protocol):
    @property
    def busy(self) -> bool:
        """Has running or waiting requests (and is neither crashed nor hung)."""
        ...

    def host_changed(self) -> None:
        """Another engine of the host turned busy or idle: re-time the step in progress."""
        ...


class HostCores:
    """The cores that a fleet's engines share; ``factor()`` is the slowdown of a busy engine's steps now."""

    def __init__(self, cores: int) -> None:
        if cores < 1:
            raise ValueError(f"--host-cores must be at least 1, got {cores}")
        self.cores = cores
        self._engines: list[SharesHost] = []

    def join(self, engine: SharesHost) -> None:
        self._engines.append(engine)

    def busy(self) -> int:
        return sum(1 for e in self._engines if e.busy)

    def factor(self) -> float:
        """``max(1, k / N)``: k busy engines on N cores (an engine asking about its own step counts itself)."""
        return max(1.0, self.busy() / self.cores)

    def changed(self, who: SharesHost) -> None:
        for e in self._engines:
            if e is not who:
                e.host_changed()
