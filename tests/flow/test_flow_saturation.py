"""The hold rule and the request cost (``cognitora.flow.saturation``): a table of placements, each with what a user
would see: does the request wait at the gateway, why, and what it costs its team's share."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cognitora.decision import CandidateScore, Decision, Rejection
from cognitora.flow.config import FairnessCost, HoldReason
from cognitora.flow.saturation import request_cost, saturation_of

SLO = 2.0


def cand(endpoint: str, ttft: float, **kw: float | str | None) -> CandidateScore:
    base: dict[str, object] = {
        "cached_tokens": 0.0,
        "queued_prefill_tokens": 0.0,
        "prefill_tokens_per_s": 10_000.0,
    }
    base.update(kw)
    return CandidateScore(endpoint=endpoint, predicted_ttft_s=ttft, **base)  # type: ignore[arg-type]


def decision(*candidates: CandidateScore, saturated: bool = False, rejection: Rejection | None = None) -> Decision:
    return Decision(
        request_id="r",
        model="m",
        endpoint=None if rejection else candidates[0].endpoint if candidates else None,
        url=None,
        prompt_tokens=8000,
        candidates=candidates,
        saturated=saturated,
        rejection=rejection,
    )


def test_room_somewhere_means_no_wait() -> None:
    d = decision(cand("a", 0.5, slot_wait_s=3.0), cand("b", 0.8))
    assert saturation_of(d, SLO) is None


def test_every_engine_at_its_seats_waits() -> None:
    d = decision(cand("a", 0.9, slot_wait_s=0.4), cand("b", 0.7, slot_wait_s=0.2), cand("c", 0.1, excluded="down"))
    s = saturation_of(d, SLO)
    assert s is not None and s.reason is HoldReason.SEATS
    assert "the soonest frees on b in 200 ms" in s.detail


def test_every_engine_short_of_kv_waits() -> None:
    d = decision(cand("a", 0.9, kv_pressure_s=0.5), cand("b", 0.7, kv_pressure_s=1.5))
    s = saturation_of(d, SLO)
    assert s is not None and s.reason is HoldReason.KV and "a, in 500 ms" in s.detail


def test_slo_missed_because_of_load_waits() -> None:
    # 30,000 tokens queued at 10,000 tokens/s: 3 s of queue; without it 0.8 s, within the 2 s objective
    d = decision(cand("a", 3.8, queued_prefill_tokens=30_000), saturated=True)
    s = saturation_of(d, SLO)
    assert s is not None and s.reason is HoldReason.SLO
    assert s.detail == "best predicted TTFT 3.80 s (on a) is over the class's 2 s objective because of load"


def test_a_sheddable_shed_waits_instead() -> None:
    shed = Rejection(429, "fleet saturated", 3)
    d = decision(cand("a", 3.8, queued_prefill_tokens=30_000), saturated=True, rejection=shed)
    s = saturation_of(d, SLO)
    assert s is not None and s.reason is HoldReason.SLO


def test_a_prompt_too_long_for_the_slo_on_an_idle_engine_does_not_wait() -> None:
    d = decision(cand("a", 3.1, queued_prefill_tokens=1000), cand("b", 3.0), saturated=True)
    assert saturation_of(d, SLO) is None


@pytest.mark.parametrize(
    "refused",
    [
        Rejection(404, "unknown model 'x'"),
        Rejection(503, "no eligible endpoint", 5),
        Rejection(429, "team over its budget", 60),
    ],
)
def test_refusals_other_than_saturation_never_wait(refused: Rejection) -> None:
    d = decision(cand("a", 0.9, slot_wait_s=1.0), rejection=refused)
    assert saturation_of(d, SLO) is None


def test_no_eligible_candidate_never_waits() -> None:
    assert saturation_of(decision(cand("a", 0.1, excluded="unhealthy", slot_wait_s=1.0)), SLO) is None


def test_hold_on_picks_the_signals() -> None:
    d = decision(cand("a", 0.9, slot_wait_s=0.4, kv_pressure_s=0.2))
    only_kv = saturation_of(d, SLO, hold_on=[HoldReason.KV])
    assert only_kv is not None and only_kv.reason is HoldReason.KV
    assert saturation_of(d, SLO, hold_on=[HoldReason.SLO]) is None


def test_cost_is_the_prompt_no_eligible_engine_holds() -> None:
    d = decision(
        cand("a", 1.0, cached_tokens=6000.0),
        cand("b", 0.5, cached_tokens=2000.0),
        cand("c", 0.1, cached_tokens=8000.0, excluded="down"),
    )
    assert request_cost(d, FairnessCost.UNCACHED_TOKENS, 16) == 2000.0
    assert request_cost(d, FairnessCost.PROMPT_TOKENS, 16) == 8000.0
    assert request_cost(d, FairnessCost.REQUESTS, 16) == 1.0
    assert request_cost(d, FairnessCost.FIFO, 16) == 1.0
    all_cached = replace(d, candidates=(cand("a", 0.1, cached_tokens=8000.0),))
    assert request_cost(all_cached, FairnessCost.UNCACHED_TOKENS, 16) == 16.0


def test_a_prediction_just_under_the_objective_waits_once_the_margin_says_it_runs_late() -> None:
    """Predicted 1.9 s against 2 s: placement finds no saturation; with predictions known to run 10% late it
    would be served at ~2.1 s, so it waits for load to drain (its own 0.9 s x 1.1 fits easily)."""
    d = decision(cand("a", 1.9, queued_prefill_tokens=10_000))
    assert saturation_of(d, SLO) is None
    s = saturation_of(d, SLO, margin=1.1)
    assert s is not None and s.reason is HoldReason.SLO
    assert s.detail == (
        "best predicted TTFT 1.90 s (on a) is over the class's 2 s objective (x margin 1.10, 2.00 s of it left) "
        "because of load"
    )


def test_the_wait_so_far_counts_against_the_objective() -> None:
    """A request that waited 0.5 s is placed only where it still meets what its objective left (1.5 s): 1.7 s
    predicted would have been served at 2.2 s. Once the wait leaves less than even an idle engine takes, it stays
    held (its wait bound sheds it) rather than being served late; a prompt too long for the objective on an idle
    engine is not held for it (waiting never could help)."""
    d = decision(cand("a", 1.7, queued_prefill_tokens=8_000))  # 0.8 s of load, 0.9 s of its own
    assert saturation_of(d, SLO) is None
    s = saturation_of(d, SLO, waited_s=0.5)
    assert s is not None and s.reason is HoldReason.SLO and "1.50 s of it left" in s.detail
    late = saturation_of(d, SLO, waited_s=1.2)
    assert late is not None and late.detail.startswith("after 1.20 s waiting, 0.80 s of the class's 2 s objective")
    too_long = decision(cand("a", 2.6, queued_prefill_tokens=1_000))  # 2.5 s of its own
    assert saturation_of(too_long, SLO, waited_s=0.5) is None


def test_what_a_request_takes_on_an_idle_engine_is_its_least_over_the_engines() -> None:
    """The engine with the least predicted TTFT (a: 1.7 s, all its own: it runs slow) is not what the request
    "takes on an idle engine" while another would take 0.9 s once its 1.3 s of load drains: after 0.5 s of
    waiting it is held for load, not as past hope."""
    d = decision(cand("a", 1.7), cand("b", 2.2, queued_prefill_tokens=13_000))
    s = saturation_of(d, SLO, waited_s=0.5)
    assert s is not None and "because of load" in s.detail, s.detail
