"""The prediction margin: how much later than predicted this gateway's requests see their first token, measured.

Flow control decides with predictions: a request is committed only where its predicted TTFT meets its class's
objective, it waits at most its objective less its own predicted TTFT, and a lower band keeps room for a higher
band's next request by the predicted load. An error in those predictions is then an error in admission: predicted
1.9 s against a 2 s objective and served in 2.2 s is a request the gateway let miss. A model bias that happened to
over-predict (before the attention term stopped being counted twice, long prompts were predicted 1.46x too slow)
was a margin nobody had chosen; removing it left the flow bench's ``default`` p99 just over its objective.

So the margin is explicit and measured. Every local dispatch this process makes reports its achieved TTFT
(dispatch to first token, as the gateway times it: the proxy's and the engine's time, not the queue wait before
it), and the ratio achieved / predicted goes into a window of the last ``samples``. The margin is the window's
``quantile`` (0.9 by default: nine requests in ten are no later than their prediction x the margin), clamped to
``[1, max_factor]``: an over-prediction is not spent (it stays a margin), and a burst of very late requests (an
engine stalled) cannot make the gateway refuse everything. Flow control multiplies the predictions it decides
with by it (``cognitora.core.flow_gate``). Only requests predicted at least ``min_predicted_s`` count: a short
prompt's error is milliseconds, and its ratio (often 2x: network and step overhead the model does not price)
says nothing about whether a long one meets a 2 s objective. Until ``min_samples`` (10) are in, the margin is 1.

Bounds: the quantile of the last ``samples`` requests, so it follows a change in ~that many long requests, and
with 10 samples its 0.9 quantile is the second-largest ratio (a noisy estimate: more samples, less noise, slower).
It is one figure for the whole process (every class and engine): the per-engine bias is the TTFT feedback's
(``cognitora.ttft_feedback``), which corrects the predictions before this sees them.

Each gateway learns its own; with ``flow_control.leases`` each replica shares it with its heartbeat
(``Leases.publish_margin``), and ``cognitora explain``, whose process times no request, decides with the largest
of those that reached ``min_samples`` (``most_cautious``): the gateway that would hold the request soonest.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from cognitora.flow.config import MarginConfig
from cognitora.flow.leases import SharedMargin

__all__ = ["FleetMargin", "PredictionMargin", "most_cautious"]


class PredictionMargin:
    """The window of achieved / predicted TTFT ratios and the margin it gives (see the module doc)."""

    def __init__(self, config: MarginConfig) -> None:
        self.config = config
        self._ratios: deque[float] = deque(maxlen=config.samples)
        self._factor = 1.0
        self._dirty = False

    def observe(self, predicted_s: float, achieved_s: float) -> None:
        """One local dispatch's first token: ``achieved_s`` from dispatch, against its ``predicted_s``."""
        if self.config.quantile <= 0 or predicted_s < self.config.min_predicted_s or achieved_s < 0:
            return
        self._ratios.append(achieved_s / predicted_s)
        self._dirty = True

    @property
    def samples(self) -> int:
        return len(self._ratios)

    @property
    def factor(self) -> float:
        """What flow control multiplies its predictions by: 1 until ``min_samples`` ratios are in."""
        if self._dirty:
            self._dirty = False
            self._factor = self._compute()
        return self._factor

    def _compute(self) -> float:
        n = len(self._ratios)
        if n < self.config.min_samples:
            return 1.0
        ordered = sorted(self._ratios)
        at = ordered[min(n - 1, max(0, math.ceil(self.config.quantile * n) - 1))]
        return min(self.config.max_factor, max(1.0, at))


@dataclass(frozen=True)
class FleetMargin:
    """The margin the gateway replicas shared that ``cognitora explain`` decides with (``most_cautious``)."""

    factor: float
    samples: int
    """The ratios that replica's margin is from."""
    replicas: int
    """Live replicas whose margin reached ``min_samples`` (the largest is among them)."""


def most_cautious(shared: Mapping[str, SharedMargin], min_samples: int) -> FleetMargin | None:
    """The largest factor among the replicas' margins from at least ``min_samples`` ratios (a margin from fewer is
    1, not a measurement); None when there is none. The largest, not a mean: explain answers "would this request
    wait", and the replica with the largest margin is the one that holds it soonest."""
    learned = [m for m in shared.values() if m.samples >= min_samples]
    if not learned:
        return None
    top = max(learned, key=lambda m: (m.factor, m.samples))
    return FleetMargin(top.factor, top.samples, len(learned))
