"""The prediction margin (``cognitora.flow.margin``): a quantile of how late requests were against their predicted
TTFT, from what a user's requests really took; never below 1, never above its bound, 1 until enough are in."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cognitora.flow.config import FlowControlConfig, MarginConfig
from cognitora.flow.leases import SharedMargin
from cognitora.flow.margin import FleetMargin, PredictionMargin, most_cautious


def test_the_margin_is_the_quantile_of_achieved_over_predicted() -> None:
    margin = PredictionMargin(MarginConfig(quantile=0.9, samples=100, min_samples=10))
    for i in range(9):
        margin.observe(1.0, 1.0 + i / 100)  # 1.00 .. 1.08
        assert margin.factor == 1.0  # fewer than min_samples: no margin yet
    margin.observe(1.0, 1.3)  # the tenth: one late request in ten
    assert margin.factor == pytest.approx(1.08)  # the 0.9 quantile of ten is the ninth
    for _ in range(10):
        margin.observe(2.0, 2.6)
    assert margin.factor == pytest.approx(1.3)
    assert margin.samples == 20


def test_only_requests_long_enough_to_matter_count_and_the_factor_is_bounded() -> None:
    margin = PredictionMargin(MarginConfig(min_samples=1, min_predicted_s=0.5, max_factor=1.5))
    margin.observe(0.05, 0.2)  # a short prompt 4x late: milliseconds, not counted
    assert margin.samples == 0 and margin.factor == 1.0
    margin.observe(1.0, 0.7)  # early: stays a margin, not spent
    assert margin.factor == 1.0
    margin.observe(1.0, 5.0)
    margin.observe(1.0, 5.0)
    assert margin.factor == 1.5  # an engine that stalled: bounded


def test_quantile_zero_turns_it_off_and_the_window_forgets() -> None:
    off = PredictionMargin(MarginConfig(quantile=0, min_samples=1))
    off.observe(1.0, 2.0)
    assert off.factor == 1.0 and off.samples == 0
    window = PredictionMargin(MarginConfig(samples=10, min_samples=1, quantile=0.5))
    for _ in range(10):
        window.observe(1.0, 1.4)
    for _ in range(10):
        window.observe(1.0, 1.1)
    assert window.factor == pytest.approx(1.1)


def test_the_config_says_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match=r"min_samples \(50\) is more than samples \(20\)"):
        MarginConfig(samples=20, min_samples=50)
    assert FlowControlConfig().margin.quantile == 0.9 and FlowControlConfig().priority_arrivals_quantile == 0.9


def test_the_wait_explanation_names_the_margin_for_the_holds_it_decides() -> None:
    """``cognitora explain``'s "would wait" line: an ``slo`` or ``priority`` hold was decided with the margin, and
    says which (explain's own process times no request: a gateway's is on its /metrics); a seat or team-isolation
    hold was not, and does not."""
    from cognitora.flow.config import HoldReason
    from cognitora.flow.saturation import Saturation
    from cognitora.flow.snapshot import wait_explanation

    phrase = "predicted times x prediction margin 1.00, learned from 0 requests in this process; a gateway's own is "
    for held in (Saturation(HoldReason.SLO, "over"), Saturation(HoldReason.SLO, "room", label="priority")):
        line = wait_explanation("batch", 3, 0, held, 30.0, margin=1.0, margin_samples=0)
        assert f"; {held.detail} ({phrase}cognitora_flow_prediction_margin on its /metrics); at most 30 s" in line
    for held in (Saturation(HoldReason.SEATS, "seats"), Saturation(HoldReason.SLO, "team", label="isolation")):
        assert "margin" not in wait_explanation("batch", 3, 0, held, 30.0, margin=1.2, margin_samples=40)


def test_explain_takes_the_most_cautious_margin_among_replicas_that_learned_one() -> None:
    """The largest factor among the replicas' margins from at least ``min_samples`` ratios: a margin from fewer is
    1 by definition, not a measurement, and does not count."""
    shared = {
        "a": SharedMargin(1.2, 50),
        "b": SharedMargin(1.35, 10),
        "c": SharedMargin(1.6, 9),  # the largest, but from too few
        "d": SharedMargin(1.0, 200),
    }
    assert most_cautious(shared, 10) == FleetMargin(1.35, 10, 3)
    assert most_cautious({"c": SharedMargin(1.0, 9)}, 10) is None
    assert most_cautious({}, 10) is None


def test_the_wait_explanation_says_a_shared_margin_came_from_the_gateway_replicas() -> None:
    from cognitora.flow.config import HoldReason
    from cognitora.flow.saturation import Saturation
    from cognitora.flow.snapshot import wait_explanation

    held = Saturation(HoldReason.SLO, "over")
    line = wait_explanation("batch", 3, 0, held, 30.0, margin=1.35, margin_samples=10, margin_replicas=3)
    assert (
        "; over (predicted times x prediction margin 1.35, learned by 3 gateway replicas, the largest, from 10 "
        "requests: the most cautious gateway decides; each holds with its own, cognitora_flow_prediction_margin on "
        "its /metrics); at most 30 s"
    ) in line, line
    one = wait_explanation("batch", 3, 0, held, 30.0, margin=1.1, margin_samples=20, margin_replicas=1)
    assert "learned by 1 gateway replica, the largest, from 20 requests" in one, one
