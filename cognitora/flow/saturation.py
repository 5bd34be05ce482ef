"""Whether a placement says "wait": every eligible engine is at capacity for this request, and what the request
costs its team's fair share. Pure functions of a ``Decision``: the core calls them on the decision it just made.

**Hold rule.** Among the decision's eligible candidates (``CandidateScore.excluded`` is None), in this order, for
the reasons ``flow_control.hold_on`` lists:

- ``seats``: every one would make the request wait for a seat (``slot_wait_s`` > 0);
- ``kv``: every one would make it wait for KV room (``kv_pressure_s`` > 0);
- ``slo``: none meets the class's objective (``Decision.saturated``), or the chosen engine's predicted TTFT x the
  prediction margin (``cognitora.flow.margin``) is over what the objective leaves after the request's wait so
  far; and one engine would meet the objective without its load: its predicted TTFT less the load terms (queued
  prefill, seat wait, KV wait, steps slowed by resident context, decode load), x the margin, meets
  ``ttft_slo_s``. Load is what frees up; a 30k-token prompt over a 2 s objective on an idle engine is placed as
  before (waiting cannot help it). A request whose wait left too little for even that is held (it leaves the
  queue at its wait bound): placed, it would be served late.

A decision refused for anything but saturation (unknown model, no eligible endpoint, a budget), or one with no
candidates, never waits.

**Cost.** What the request adds to the fleet's prefill work: its prompt tokens less the most any eligible engine
holds (Cognitora knows what is cached where), at least ``min_cost_tokens``; measured once, at enqueue, like
Dynamo's router. ``prompt_tokens`` and ``requests`` are there to compare (bench/flow_fairness.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from cognitora.decision import CandidateScore, Decision
from cognitora.flow.config import FairnessCost, HoldReason

__all__ = [
    "Saturation",
    "chosen_ttft_s",
    "clock_known",
    "clock_rate",
    "load_s",
    "own_ttft_s",
    "request_cost",
    "saturation_of",
    "uncached_tokens",
]


@dataclass(frozen=True)
class Saturation:
    """Why a request waits, in words for ``cognitora explain`` and a label for metrics."""

    reason: HoldReason
    detail: str
    label: str = ""
    """The hold's name in metrics when it is not ``reason``'s: ``priority`` (held for an active higher band's
    objective) and ``isolation`` (team isolation, ``cognitora.flow.isolation``; turned on by
    ``flow_control.isolation``, not ``hold_on``). Both are holds about this request, as ``slo`` is (``reason``
    ``slo``: another team's request may still go)."""

    @property
    def kind(self) -> str:
        """``seats``, ``kv``, ``slo``, ``priority`` or ``isolation``: the ``reason`` label of
        ``cognitora_flow_holds_total``."""
        return self.label or self.reason.value


def load_s(c: CandidateScore) -> float:
    """The seconds of ``c``'s predicted TTFT that the engine's current load adds (they shrink as work finishes)."""
    queue = c.queued_prefill_tokens / c.prefill_tokens_per_s if c.prefill_tokens_per_s > 0 else 0.0
    return queue + c.slot_wait_s + c.kv_pressure_s + c.interference_s + c.decode_penalty_s


def _eligible(decision: Decision) -> list[CandidateScore]:
    return [c for c in decision.candidates if c.excluded is None]


def own_ttft_s(decision: Decision) -> float | None:
    """The request's predicted TTFT on its best eligible engine with that engine's load taken away: what it takes
    once it leaves the gateway queue onto an engine that has room (``Band.wait_bound_s``). None: no candidate."""
    eligible = _eligible(decision)
    if not eligible:
        return None
    return min(max(0.0, c.predicted_ttft_s - load_s(c)) for c in eligible)


def chosen_ttft_s(decision: Decision) -> float | None:
    """The predicted TTFT (engine seconds) on the engine ``decision`` chose, else on its best eligible one, as the
    ``slo`` hold reads it; None: no eligible candidate."""
    eligible = _eligible(decision)
    return _chosen(decision, eligible).predicted_ttft_s if eligible else None


def _chosen(decision: Decision, eligible: Sequence[CandidateScore]) -> CandidateScore:
    """The candidate on the engine ``decision`` chose, else the one with the lowest predicted TTFT (``eligible``
    not empty)."""
    chosen = next((c for c in eligible if c.endpoint == decision.endpoint), None)
    return chosen if chosen is not None else min(eligible, key=lambda c: c.predicted_ttft_s)


def clock_rate(decision: Decision) -> float:
    """Engine seconds per gateway second on the engine ``decision`` chose (else its first eligible one; 1 with
    none): ``CandidateScore.clock_rate``. Predictions and objectives are engine seconds, the queue's waits gateway
    seconds; on real engines the two are one clock, on a time-scaled simulator this converts between them."""
    clocked = _clocked(decision)
    return 1.0 if clocked is None or clocked.clock_rate <= 0 else clocked.clock_rate


def clock_known(decision: Decision) -> bool:
    """Whether ``clock_rate(decision)`` is the engine's, not a stand-in: placement had a fresh snapshot of the
    engine it chose (``CandidateScore.clock_rate`` 0 says it had none). A first token timed on an unknown clock says
    nothing about the prediction: on the simulator at time scale 0.5 it reads twice as late."""
    clocked = _clocked(decision)
    return clocked is None or clocked.clock_rate > 0


def _clocked(decision: Decision) -> CandidateScore | None:
    """The candidate whose clock ``clock_rate`` and ``clock_known`` read: the engine ``decision`` chose, else its
    first eligible one; None with none."""
    eligible = _eligible(decision)
    return next((c for c in eligible if c.endpoint == decision.endpoint), eligible[0] if eligible else None)


def uncached_tokens(decision: Decision) -> float:
    """Its prompt tokens less the most any eligible engine holds: the prefill it adds wherever it goes."""
    cached = max((c.cached_tokens for c in _eligible(decision)), default=0.0)
    return max(0.0, float(decision.prompt_tokens) - cached)


def saturation_of(
    decision: Decision,
    ttft_slo_s: float,
    hold_on: Collection[HoldReason] = tuple(HoldReason),
    *,
    margin: float = 1.0,
    waited_s: float = 0.0,
) -> Saturation | None:
    """Why ``decision``'s request should wait at the gateway, or None when it should not (see the module doc).
    ``margin``: the prediction margin; ``waited_s``: how long it has waited already (its objective counts it)."""
    if decision.rejection is not None and not decision.saturated:
        return None
    eligible = _eligible(decision)
    if not eligible:
        return None
    waits = (
        (HoldReason.SEATS, "slot_wait_s", "every engine's seats are taken (the soonest frees on {e} in {ms:.0f} ms)"),
        (HoldReason.KV, "kv_pressure_s", "no engine has KV room for this request (the soonest, {e}, in {ms:.0f} ms)"),
    )
    for reason, term, sentence in waits:
        if reason in hold_on and all(getattr(c, term) > 0 for c in eligible):
            soonest = min(eligible, key=lambda c: float(getattr(c, term)))
            return Saturation(reason, sentence.format(e=soonest.endpoint, ms=getattr(soonest, term) * 1000))
    if HoldReason.SLO not in hold_on:
        return None
    chosen = _chosen(decision, eligible)
    left = ttft_slo_s - waited_s
    if not (decision.saturated or chosen.predicted_ttft_s * margin > left):
        return None
    if not any((c.predicted_ttft_s - load_s(c)) * margin <= ttft_slo_s for c in eligible):
        return None  # too long for its objective even on an idle engine: waiting cannot help it
    own = min(max(0.0, c.predicted_ttft_s - load_s(c)) for c in eligible)
    if own * margin > left:
        return Saturation(
            HoldReason.SLO,
            f"after {waited_s:.2f} s waiting, {left:.2f} s of the class's {ttft_slo_s:g} s objective is left, less "
            f"than this request takes on an idle engine ({own:.2f} s x margin {margin:.2f})",
        )
    how = "" if margin == 1.0 and waited_s == 0 else f" (x margin {margin:.2f}, {left:.2f} s of it left)"
    return Saturation(
        HoldReason.SLO,
        f"best predicted TTFT {chosen.predicted_ttft_s:.2f} s (on {chosen.endpoint}) is over the class's "
        f"{ttft_slo_s:g} s objective{how} because of load",
    )


def request_cost(decision: Decision, fairness: FairnessCost, min_cost_tokens: int) -> float:
    """What ``decision``'s request costs its flow under ``fairness`` (see the module doc)."""
    if fairness is FairnessCost.REQUESTS or fairness is FairnessCost.FIFO:
        return 1.0
    prompt = uncached_tokens(decision) if fairness is FairnessCost.UNCACHED_TOKENS else float(decision.prompt_tokens)
    return max(float(min_cost_tokens), prompt)
