"""The ``flow_control:`` section (``cognitora.flow.config``) and the bands it makes: clear errors for bad values,
reference checks against ``placement.priorities``, and the band order."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cognitora.config import PlacementConfig
from cognitora.flow.bands import Band, plan_bands
from cognitora.flow.config import FlowControlConfig, HoldReason

SLOS = {"default": 2.0, "batch": 30.0, "interactive": 0.5}


def test_defaults_are_valid_and_order_bands_by_slo() -> None:
    config = FlowControlConfig()
    assert config.hold_on == [HoldReason.SEATS, HoldReason.KV, HoldReason.SLO]
    assert [b.name for b in plan_bands(config, SLOS)] == ["interactive", "default", "batch"]
    bands = plan_bands(config, SLOS)
    assert all(b.max_wait_s is None and b.aged_after_s is None for b in bands)
    assert [b.longest_wait_s for b in bands] == [0.5, 2.0, 30.0]  # each class's objective bounds its waits


def test_by_default_a_wait_lasts_while_leaving_could_still_meet_the_objective() -> None:
    batch = plan_bands(FlowControlConfig(), SLOS)[2]
    assert batch.wait_bound_s(2.0) == 28.0  # a 2 s prefill must leave by 28 s to make 30 s
    assert batch.wait_bound_s(0.0) == 30.0
    assert batch.wait_bound_s(45.0) == 30.0  # misses it anyway: the objective bounds the delay
    assert batch.wait_bound_s(None) == 30.0


def test_an_explicit_max_wait_overrides_the_objective() -> None:
    config = FlowControlConfig.model_validate(
        {"default_max_wait_s": 5, "classes": {"batch": {"max_wait_s": 120}, "default": {"aged_after_s": 1}}}
    )
    interactive, default, batch = plan_bands(config, SLOS)
    assert (interactive.wait_bound_s(0.1), default.wait_bound_s(1.5), batch.wait_bound_s(2.0)) == (5.0, 5.0, 120.0)
    assert default.aged_after_s == 1.0
    assert config.longest_wait_s(SLOS) == 120.0
    assert FlowControlConfig().longest_wait_s(SLOS) == 30.0


def test_the_shipped_priorities_make_bands() -> None:
    slos = {name: c.ttft_slo_s for name, c in PlacementConfig().priorities.items()}
    assert [b.name for b in plan_bands(FlowControlConfig(), slos)] == ["default", "batch"]


def test_explicit_bands_and_class_limits() -> None:
    config = FlowControlConfig.model_validate(
        {
            "bands": ["default", "interactive", "batch"],
            "classes": {"batch": {"max_wait_s": 120, "aged_after_s": 20}},
            "default_max_wait_s": 5,
        }
    )
    assert plan_bands(config, SLOS) == (
        Band("default", 5.0, None, 2.0),
        Band("interactive", 5.0, None, 0.5),
        Band("batch", 120.0, 20.0, 30.0),
    )
    assert config.longest_wait_s(SLOS) == 120.0


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"classes": {"batch": {"max_wait_s": 10, "aged_after_s": 10}}}, "must be shorter than max_wait_s"),
        ({"classes": {"batch": {"max_wait_s": 0}}}, "greater than 0"),
        ({"bands": ["batch", "batch"]}, "batch listed more than once"),
        ({"bands": []}, "at least one priority class"),
        ({"hold_on": []}, "at least one of seats, kv, slo"),
        ({"hold_on": ["queue"]}, "'seats', 'kv' or 'slo'"),
        ({"fairness": "tokens"}, "'uncached_tokens', 'prompt_tokens', 'requests' or 'fifo'"),
        ({"max_queued": 10, "max_queued_per_flow": 20}, "max_queued_per_flow (20) is more than max_queued (10)"),
        ({"team_weights": {"team:a": 0}}, "team_weights must be positive"),
        ({"aged_share": 0.9}, "less than or equal to 0.5"),
        ({"max_wait": 3}, "Extra inputs are not permitted"),
        ({"leases": {"overcommit": 0.5}}, "greater than or equal to 1"),
    ],
)
def test_bad_values_say_what_is_wrong(section: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError) as info:
        FlowControlConfig.model_validate(section)
    assert says in str(info.value)


def test_names_are_checked_against_the_priority_classes() -> None:
    config = FlowControlConfig.model_validate(
        {"bands": ["interactive", "bulk"], "classes": {"premium": {"max_wait_s": 3}}}
    )
    problems = config.problems(SLOS)
    assert problems == [
        "flow_control.classes.premium: 'premium' is not a class of placement.priorities (default, batch, interactive)",
        "flow_control.bands: 'bulk' is not a class of placement.priorities (default, batch, interactive)",
        "flow_control.bands: every priority class needs a band; default, batch missing (or leave bands out to "
        "order them by ttft_slo_s)",
    ]
    with pytest.raises(ValueError, match="'bulk' is not a class"):
        plan_bands(config, SLOS)
