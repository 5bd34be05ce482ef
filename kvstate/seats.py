"""How many requests an engine runs at once (its seats: vLLM's and SGLang's ``--max-num-seqs`` /
``--max-running-requests``, llama.cpp's ``-np``), learned from its load gauges where it does not say.

Placement needs the count to see a full engine before the engine itself shows it: between two scrapes a gateway
can send an engine hundreds of requests, and a request beyond the last seat waits for a running one to *finish*
(seconds to minutes of decode), not for prefill (``cognitora.placement.seat_wait``).

llama.cpp says it (``/slots``, ``kvstate.slots``). vLLM and SGLang export no gauge of the limit, but they show its
effect: a request waits while the KV cache has room only when the running count is at the limit, or for a moment
when the step's token budget (``max_num_batched_tokens``) went to other prefills. The moment passes within a step
and the running count moves with it; the limit holds, and pins the running count. So a count is taken as the
engine's seats once **two scrapes in a row** both show requests waiting, KV below ``KV_ROOM``, and the same
running count. The largest count so learned is kept: a wait that was for something else can only make it low,
and the engine running more than it later raises it.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_ROOM = 0.9
"""KV usage under which a request that waits is not waiting for KV blocks (a cold request needs a few percent of
a large cache; vLLM also keeps a watermark free)."""


@dataclass
class SeatCount:
    """One endpoint's learned seat count (0: not learned yet)."""

    seats: int = 0
    _pinned_at: int | None = None
    """The running count of the previous scrape, when that scrape showed a wait with KV to spare."""

    def observe(self, running: int, waiting: int, kv_usage: float) -> int:
        """Take one scrape's gauges; the seats learned so far."""
        if waiting > 0 and running > 0 and kv_usage < KV_ROOM:
            if self._pinned_at == running:
                self.seats = max(self.seats, running)
            self._pinned_at = running
        else:
            self._pinned_at = None
        return self.seats

    def restart(self) -> None:
        """The endpoint failed a scrape: the next pair of readings starts afresh (the count learned is kept: a
        restarted engine runs the same command line, nearly always)."""
        self._pinned_at = None
