"""How far a request's best local endpoint is from its class's objectives (``LocalLoad``): the one number the burst
hysteresis reads, and what was measured of that endpoint (idle or not) for the local probes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cognitora.burst.reasons import BurstReason
from cognitora.config import PriorityClass
from cognitora.decision import CandidateScore, Decision

__all__ = ["LocalLoad", "best_local_load"]


@dataclass(frozen=True)
class LocalLoad:
    """How far the best local endpoint is from a request's class objectives."""

    ratio: float
    """Its predicted TTFT over the TTFT SLO, or its predicted ITL over the ITL SLO when the class sets one and that
    is larger; ``inf`` when no local endpoint is eligible."""
    ttft_s: float
    itl_s: float | None = None
    """Its predicted inter-token latency, when the ITL objective is the one that sets ``ratio``."""
    endpoint: str | None = None
    idle: bool = False
    """Measured idle: nothing running there and nothing queued, by the scrape and by the routers' own counts. Its
    prediction then rests on learned figures alone (rates, the short-prompt floor, the TTFT feedback), learned under
    the load that is gone: what a local probe checks (``cognitora.burst.probes``)."""
    own_prefill_s: float = math.inf
    """The request's own uncached prompt over the endpoint's learned prefill rate: what no queue explains."""

    def why(self, priority: str, pclass: PriorityClass, threshold: float) -> tuple[BurstReason, str]:
        """The burst reason and the explanation's words, for a request over ``threshold``."""
        if math.isinf(self.ratio):
            return BurstReason.NO_LOCAL_ENDPOINT, "no local endpoint is eligible"
        if self.itl_s is not None and pclass.itl_slo_s is not None:
            return BurstReason.ITL_SATURATED, (
                f"best local predicted inter-token latency {self.itl_s * 1000:.0f} ms over the burst threshold "
                f"{threshold * pclass.itl_slo_s * 1000:.0f} ms (class {priority!r}, ITL SLO "
                f"{pclass.itl_slo_s * 1000:g} ms)"
            )
        return BurstReason.SATURATED, (
            f"best local predicted TTFT {self.ttft_s:.2f} s over the burst threshold "
            f"{threshold * pclass.ttft_slo_s:.2f} s (class {priority!r}, SLO {pclass.ttft_slo_s:g} s)"
        )


def best_local_load(decision: Decision, pclass: PriorityClass) -> LocalLoad | None:
    """The load of ``decision``'s best local candidate (``inf`` when every local endpoint was excluded); None when
    the decision was refused for a reason other than the fleet's load (nothing to burst for)."""
    ranked = [c for c in decision.candidates if c.excluded is None]
    if ranked:
        if decision.rejection is not None and not decision.saturated:
            return None
        uncached = decision.prompt_tokens
        return min((_load(c, pclass, uncached) for c in ranked), key=lambda load: load.ratio)
    if decision.rejection is not None and decision.rejection.status == 503 and decision.candidates:
        return LocalLoad(math.inf, math.inf)
    return None


def measured_idle(c: CandidateScore) -> bool:
    """Nothing runs on the endpoint and nothing waits there, as the scrape and the routers' counts say."""
    return c.running == 0 and c.queued_prefill_tokens <= 0 and c.slot_wait_s <= 0


def _load(c: CandidateScore, pclass: PriorityClass, prompt_tokens: int) -> LocalLoad:
    own = max(0.0, prompt_tokens - c.cached_tokens) / c.prefill_tokens_per_s if c.prefill_tokens_per_s > 0 else 0.0
    idle = measured_idle(c)
    ttft_ratio = c.predicted_ttft_s / pclass.ttft_slo_s
    if pclass.itl_slo_s is None or c.predicted_itl_s is None:
        return LocalLoad(ttft_ratio, c.predicted_ttft_s, endpoint=c.endpoint, idle=idle, own_prefill_s=own)
    itl_ratio = c.predicted_itl_s / pclass.itl_slo_s
    if itl_ratio > ttft_ratio:
        return LocalLoad(
            itl_ratio, c.predicted_ttft_s, c.predicted_itl_s, endpoint=c.endpoint, idle=idle, own_prefill_s=own
        )
    return LocalLoad(ttft_ratio, c.predicted_ttft_s, endpoint=c.endpoint, idle=idle, own_prefill_s=own)
