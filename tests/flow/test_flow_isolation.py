"""Team isolation within a band (``cognitora.flow.isolation``): per engine, per team in-flight prefill and its
expiry, which other team counts as active, and the hold on one decision. A fake clock: no sleeps."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cognitora.decision import CandidateScore, CloudPick, Decision, PrefillLeg
from cognitora.flow.config import FlowControlConfig, HoldReason
from cognitora.flow.isolation import Busy, Rival, TeamActivity, TeamPrefill, isolation_hold
from cognitora.flow.snapshot import wait_explanation


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_prefill_counts_on_its_engine_for_its_team_until_done_or_its_estimate() -> None:
    clock = Clock()
    prefill = TeamPrefill(clock)
    prefill.add("a1", "team:a", "e1", 2.0)
    prefill.add("a2", "team:a", "e1", 3.0)
    prefill.add("b1", "team:b", "e2", 0.5)
    assert prefill.busy("team:a") == {"e1": Busy(2, 103.0)}
    assert prefill.busy("team:b") == {"e2": Busy(1, 100.5)}
    assert prefill.busy("team:c") == {}
    prefill.done("a2")  # its first token: the estimate no longer matters
    assert prefill.busy("team:a") == {"e1": Busy(1, 102.0)}
    clock.now = 100.6  # b1's estimate passed without a report
    assert prefill.busy("team:b") == {} and len(prefill) == 1
    clock.now = 102.0
    assert prefill.busy("team:a") == {} and len(prefill) == 0
    prefill.done("a1")  # a late report of an expired one: ignored
    prefill.done("never-added")


def test_a_request_added_again_keeps_only_its_latest_estimate() -> None:
    clock = Clock()
    prefill = TeamPrefill(clock)
    prefill.add("r", "team:a", "e1", 1.0)
    prefill.add("r", "team:a", "e2", 5.0)  # the same request id counted again (a retry placed elsewhere)
    clock.now = 101.5  # the first estimate's expiry must not remove the second
    assert prefill.busy("team:a") == {"e2": Busy(1, 105.0)}
    assert len(prefill) == 1


def test_another_team_is_active_in_the_same_band_within_the_window_or_while_it_waits() -> None:
    clock = Clock()
    teams = TeamActivity(["interactive", "default", "batch"], window_s=10.0, clock=clock)
    teams.saw("default", "team:a")
    assert teams.rivals("default", "team:a", []) == []  # its own requests do not count
    teams.saw("batch", "team:b")
    assert teams.rivals("default", "team:a", []) == []  # a lower band does not count
    assert teams.rivals("batch", "team:b", []) == []  # nor a higher one: the priority hold is the rule across bands
    teams.saw("default", "team:b")
    teams.saw("default", "team:a")  # a's newer request does not hide b's
    assert teams.rivals("default", "team:a", []) == [Rival("default", "team:b", waiting=False)]
    clock.now += 10.5
    assert teams.rivals("default", "team:a", []) == []  # b went quiet longer than the window
    assert teams.rivals("interactive", "team:a", ["team:a", "team:c"]) == [Rival("interactive", "team:c", True)]
    teams.saw("default", "team:c")
    teams.saw("default", "team:d")
    # waiters first; a team that waits is listed once, as waiting
    assert teams.rivals("default", "team:a", ["team:c", "team:a"]) == [
        Rival("default", "team:c", waiting=True),
        Rival("default", "team:d", waiting=False),
    ]
    teams.saw("unknown-band", "team:z")  # a class that is not a band: ignored
    assert teams.rivals("unknown-band", "team:a", ["team:z"]) == [Rival("unknown-band", "team:z", True)]


def test_a_zero_window_counts_only_waiters() -> None:
    clock = Clock()
    teams = TeamActivity(["default"], window_s=0.0, clock=clock)
    teams.saw("default", "team:b")
    clock.now += 0.001
    assert teams.rivals("default", "team:a", []) == []
    assert teams.rivals("default", "team:a", ["team:b"]) == [Rival("default", "team:b", waiting=True)]


def cand(endpoint: str, excluded: str | None = None) -> CandidateScore:
    return CandidateScore(
        endpoint=endpoint,
        cached_tokens=0.0,
        queued_prefill_tokens=0.0,
        prefill_tokens_per_s=10_000.0,
        predicted_ttft_s=0.1,
        excluded=excluded,
    )


def decision(
    chosen: str, *candidates: CandidateScore, cloud: CloudPick | None = None, prefill: PrefillLeg | None = None
) -> Decision:
    return Decision(
        request_id="r",
        model="m",
        endpoint=chosen,
        url=None,
        prompt_tokens=22_000,
        candidates=candidates,
        cloud=cloud,
        prefill=prefill,
    )


RIVAL = (Rival("default", "team:b", waiting=False),)


def nobody(flow: str) -> dict[str, Busy]:
    return {}


def test_held_when_it_would_take_the_last_engine_free_of_its_teams_prefill() -> None:
    busy = {"e1": Busy(2, 101.2)}
    held = isolation_hold(decision("e2", cand("e1"), cand("e2")), "team:a", busy, RIVAL, 100.0, nobody)
    assert held is not None and held.reason is HoldReason.SLO and held.kind == "isolation"
    assert held.detail == (
        "held for team isolation: team:b sent a request lately in band 'default', and placing this on e2 would "
        "leave no engine free of team:a's in-flight prefill (e1: 2 in flight, done in ~1.20 s)"
    )
    # on the engine that already holds its prefill, the free one stays free: placed
    assert isolation_hold(decision("e1", cand("e1"), cand("e2")), "team:a", busy, RIVAL, 100.0, nobody) is None
    # a third engine is free besides the chosen one: placed
    assert (
        isolation_hold(decision("e2", cand("e1"), cand("e2"), cand("e3")), "team:a", busy, RIVAL, 100.0, nobody) is None
    )
    # nothing of the team in flight: placed
    assert isolation_hold(decision("e2", cand("e1"), cand("e2")), "team:a", {}, RIVAL, 100.0, nobody) is None


def test_every_engine_busy_with_the_team_holds_it_until_one_is_free() -> None:
    """Its prefills took every engine before the other team became active: nothing more of it until one frees."""
    busy = {"e1": Busy(1, 101.0), "e2": Busy(1, 100.5)}
    held = isolation_hold(
        decision("e1", cand("e1"), cand("e2")), "team:a", busy, (Rival("batch", "key:k", True),), 100.0, nobody
    )
    assert held is not None
    assert "key:k has requests waiting in band 'batch'" in held.detail
    assert "(e2: 1 in flight, done in ~0.50 s; e1: 1 in flight, done in ~1.00 s)" in held.detail


def test_no_rival_in_its_band_is_no_hold() -> None:
    """A batch team's request beside an active default team (another band): ``TeamActivity.rivals`` lists none, so
    isolation does not hold it; the priority hold is what caps a lower band for a higher one."""
    teams = TeamActivity(["default", "batch"], window_s=10.0, clock=Clock())
    teams.saw("default", "team:c")
    rivals = teams.rivals("batch", "team:d", [])
    busy = {"e1": Busy(1, 101.0)}
    assert isolation_hold(decision("e2", cand("e1"), cand("e2")), "team:d", busy, rivals, 100.0, nobody) is None


def test_not_held_for_backlogged_teams_that_would_be_held_from_that_engine_too() -> None:
    """Work conservation: a and b both wait here, both have a prefill on e1, e2 is idle. Each keeping e2 free for
    the other leaves it idle while both wait; neither is held, the fair queue's order decides who takes it."""
    both = {"team:a": {"e1": Busy(1, 101.0)}, "team:b": {"e1": Busy(1, 101.5)}}

    def busy_of(flow: str) -> dict[str, Busy]:
        return both.get(flow, {})

    on_e2 = decision("e2", cand("e1"), cand("e2"))
    b_waits = (Rival("default", "team:b", waiting=True),)
    assert isolation_hold(on_e2, "team:a", both["team:a"], b_waits, 100.0, busy_of) is None
    a_waits = (Rival("default", "team:a", waiting=True),)
    assert isolation_hold(on_e2, "team:b", both["team:b"], a_waits, 100.0, busy_of) is None
    # b waits but has nothing in flight: its request would go to e2, so e2 stays free of a for it
    held = isolation_hold(on_e2, "team:a", both["team:a"], b_waits, 100.0, nobody)
    assert held is not None and "team:b has requests waiting in band 'default'" in held.detail
    # a light team c (active, not waiting) besides backlogged b: its next request is what e2 is kept for
    c_lately = (*b_waits, Rival("default", "team:c", waiting=False))
    held = isolation_hold(on_e2, "team:a", both["team:a"], c_lately, 100.0, busy_of)
    assert held is not None and "team:c sent a request lately" in held.detail
    # three engines: b's request would take e2 or e3 without being held, so a keeps one free (as before)
    three = decision("e2", cand("e1"), cand("e2"), cand("e3"))
    both["team:a"]["e3"] = Busy(1, 102.0)
    assert isolation_hold(three, "team:a", both["team:a"], b_waits, 100.0, busy_of) is not None


def test_a_fleet_of_one_eligible_engine_is_never_held() -> None:
    busy = {"e1": Busy(3, 105.0)}
    assert isolation_hold(decision("e1", cand("e1")), "team:a", busy, RIVAL, 100.0, nobody) is None
    # the other engine is excluded by a filter (another model, unhealthy): one eligible engine, nothing to keep free
    one = decision("e1", cand("e1"), cand("e2", excluded="unhealthy"))
    assert isolation_hold(one, "team:a", busy, RIVAL, 100.0, nobody) is None


def test_refused_clouded_and_split_decisions() -> None:
    busy = {"e1": Busy(1, 101.0)}
    refused = Decision(request_id="r", model="m", endpoint=None, url=None, prompt_tokens=10, candidates=(cand("e1"),))
    assert isolation_hold(refused, "team:a", busy, RIVAL, 100.0, nobody) is None
    pick = CloudPick(target="x", model="m", url=None, reason="burst", team="a")
    cloud = decision("cloud:x", cand("e1"), cand("e2"), cloud=pick)
    assert isolation_hold(cloud, "team:a", busy, RIVAL, 100.0, nobody) is None
    # a split request's prefill runs on its prefill leg's engine: that is the one it would take
    leg = PrefillLeg(endpoint="e1", url="http://e1", cached_tokens=0.0, prefill_s=1.0, transfer_s=0.1, admission_s=0.0)
    assert (
        isolation_hold(decision("e2", cand("e1"), cand("e2"), prefill=leg), "team:a", busy, RIVAL, 100.0, nobody)
        is None
    )


def test_the_explanation_says_why_it_would_wait() -> None:
    busy = {"e1": Busy(1, 101.0)}
    held = isolation_hold(decision("e2", cand("e1"), cand("e2")), "team:a", busy, RIVAL, 100.0, nobody)
    line = wait_explanation("default", 2, 0, held, 5.0)
    assert line.startswith("would wait: 2 ahead in band 'default'; held for team isolation: team:b sent a request")


def test_on_by_default_with_flow_control_and_bounded() -> None:
    config = FlowControlConfig()
    assert config.isolation.enabled and config.isolation.window_s == 10.0 and config.isolation.prefill_margin == 1.5
    assert not FlowControlConfig.model_validate({"isolation": {"enabled": False}}).isolation.enabled
    with pytest.raises(ValidationError, match="prefill_margin"):
        FlowControlConfig.model_validate({"isolation": {"prefill_margin": 0.5}})
    with pytest.raises(ValidationError, match="window"):
        FlowControlConfig.model_validate({"isolation": {"window": 3}})
