"""Strict priority at admission (``cognitora.flow.priority``): which higher band's objective caps a lower band, for
how long after its last request, and when a lower band's request would leave that band's next one no room. A fake
clock: no sleeps."""

from __future__ import annotations

from cognitora.decision import CandidateScore, Decision, Rejection
from cognitora.flow.config import HoldReason
from cognitora.flow.priority import BandActivity, Ceiling, priority_hold

BANDS = [("interactive", 0.5), ("default", 2.0), ("batch", 30.0)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_strictest_active_band_above_is_the_ceiling_for_the_window() -> None:
    clock = Clock()
    activity = BandActivity(BANDS, window_s=60.0, clock=clock)
    assert activity.ceiling("batch", {}) is None  # nothing above has been seen
    activity.saw("default")
    assert activity.ceiling("batch", {}) == Ceiling("default", 2.0)
    assert activity.ceiling("default", {}) is None  # its own band is no ceiling
    assert activity.ceiling("batch", {"interactive": 1}) == Ceiling("interactive", 0.5)  # waiters: active
    clock.now += 61
    assert activity.ceiling("batch", {}) is None  # the window closed
    assert activity.ceiling("interactive", {}) is None and activity.ceiling("unknown", {"default": 3}) is None


def test_a_zero_window_means_only_waiters_hold_lower_bands() -> None:
    activity = BandActivity(BANDS, window_s=0.0, clock=lambda: 5.0)
    activity.saw("default")
    assert activity.ceiling("batch", {}) == Ceiling("default", 2.0)  # the same instant
    later = BandActivity(BANDS, window_s=0.0, clock=iter([5.0, 5.1]).__next__)
    later.saw("default")
    assert later.ceiling("batch", {}) is None and BandActivity(BANDS, 0.0).ceiling("batch", {"default": 1})


def cand(endpoint: str, queued_tokens: float, own_s: float = 0.1) -> CandidateScore:
    """An engine holding ``queued_tokens`` of prefill (10k tokens/s), where the request's own prefill is ``own_s``."""
    return CandidateScore(
        endpoint=endpoint,
        cached_tokens=0.0,
        queued_prefill_tokens=queued_tokens,
        prefill_tokens_per_s=10_000.0,
        predicted_ttft_s=queued_tokens / 10_000 + own_s,
    )


def decision(*candidates: CandidateScore, rejection: Rejection | None = None) -> Decision:
    return Decision(
        request_id="r",
        model="m",
        endpoint=None if rejection else candidates[0].endpoint,
        url=None,
        prompt_tokens=1000,
        candidates=candidates,
        rejection=rejection,
    )


def test_held_unless_an_engine_keeps_room_for_the_higher_bands_next_request() -> None:
    """`default` (2 s) sends ~1.2 s prompts: a `batch` request goes only where, once it is there, some engine still
    has the 0.8 s of load that leaves a `default` request its 2 s."""
    ceiling = Ceiling("default", 2.0, own_ttft_s=1.2)
    # a holds 0.5 s of queued prefill; this batch request (1.1 s there) would take it to 1.6 s, b holds 1.5 s
    held = priority_hold(decision(cand("a", 5_000, own_s=1.1), cand("b", 15_000)), ceiling)
    assert held is not None and held.reason is HoldReason.SLO and held.kind == "priority"
    assert held.detail == (
        "held for band 'default': placed on a, it would leave no engine where that band's next request (~1.20 s of "
        "its own) meets its 2 s objective (the best, b, 2.70 s)"
    )
    # b holds only 0.7 s: once batch is on a, b still leaves default 1.9 s, so it goes
    assert priority_hold(decision(cand("a", 5_000, own_s=1.1), cand("b", 7_000)), ceiling) is None
    # the old rule (an engine under 2 s of load) let it go here: a had room under 2 s, default's next one did not
    assert priority_hold(decision(cand("a", 19_000), cand("b", 19_000)), Ceiling("default", 2.0, 1.2)) is not None
    refused = decision(cand("a", 50_000), rejection=Rejection(404, "unknown model"))
    assert priority_hold(refused, ceiling) is None  # not saturation: never waits


def test_an_idle_engine_waits_for_the_higher_band_only_where_room_is_possible() -> None:
    """Two engines, a idle and b busy: batch on a would leave no room for default's next request, so a stays idle
    for it. Where no engine could keep room anyway (one engine; or default's own TTFT alone is over 2 s), the idle
    engine takes it: the rule would only starve batch."""
    ceiling = Ceiling("default", 2.0, own_ttft_s=1.2)
    held = priority_hold(decision(cand("a", 0, own_s=1.96), cand("b", 15_000)), ceiling)
    assert held is not None and held.kind == "priority"
    assert priority_hold(decision(cand("a", 0, own_s=1.96), cand("b", 0)), ceiling) is None  # b keeps the room
    assert priority_hold(decision(cand("a", 0, own_s=1.96)), ceiling) is None  # one engine: not starved
    assert priority_hold(decision(cand("a", 2_000, own_s=1.96)), ceiling) is not None  # busy: waits for its prefill
    too_long = Ceiling("default", 2.0, own_ttft_s=2.5)
    assert priority_hold(decision(cand("a", 0, own_s=1.96), cand("b", 15_000)), too_long) is None


def test_the_room_kept_is_the_higher_bands_average_own_ttft() -> None:
    clock = Clock()
    activity = BandActivity(BANDS, window_s=60.0, clock=clock)
    activity.saw("default", 1.0)
    assert activity.ceiling("batch", {}) == Ceiling("default", 2.0, 1.0)
    activity.saw("default", 2.0)
    activity.saw("default", None)  # unknown: not averaged in
    ceiling = activity.ceiling("batch", {})
    assert ceiling is not None and abs(ceiling.own_ttft_s - 1.2) < 1e-9


def test_a_steady_band_stays_active_for_five_of_its_gaps_then_lets_the_lower_band_go() -> None:
    """`default` at one request a second: `batch` is capped until ~5 s after its last request, not for the whole
    60 s window (a band seen once keeps the window: its rate is unknown)."""
    clock = Clock()
    activity = BandActivity(BANDS, window_s=60.0, clock=clock)
    activity.saw("default", 1.0)
    clock.now += 30
    assert activity.ceiling("batch", {}) is not None  # one request: the window
    for _ in range(20):
        clock.now += 1.0
        activity.saw("default", 1.0)
    clock.now += 4.0
    assert activity.ceiling("batch", {}) is not None
    clock.now += 4.0  # 8 s: past 5 mean gaps (~1.3 s: the first 30 s gap still weighs a little)
    assert activity.ceiling("batch", {}) is None
    assert activity.ceiling("batch", {"default": 1}) is not None  # waiters: active whatever the gap
