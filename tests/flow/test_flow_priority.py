"""Strict priority at admission (``cognitora.flow.priority``): which higher band's objective caps a lower band, for
how long after its last request, and when a lower band's request would leave that band's next one no room. A fake
clock: no sleeps."""

from __future__ import annotations

from cognitora.decision import CandidateScore, Decision, Rejection
from cognitora.flow.config import HoldReason
from cognitora.flow.priority import MIN_GAPS, BandActivity, Ceiling, depth_hold, poisson_quantile, priority_hold

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


def test_the_room_kept_is_the_most_of_the_higher_bands_recent_own_ttfts() -> None:
    """After another team's short prompts (0.05 s each), the band's 1.2 s prompt is what its next request needs
    room for, not their average (~0.5 s): `batch` took both engines ahead of `default` on it. Past the 10 s
    window, the moving average of its last requests."""
    clock = Clock()
    activity = BandActivity(BANDS, window_s=60.0, clock=clock)
    activity.saw("default", 1.0)
    assert activity.ceiling("batch", {}) == Ceiling("default", 2.0, 1.0)
    for _ in range(5):
        activity.saw("default", 0.05)
    activity.saw("default", 1.2)
    activity.saw("default", None)  # unknown: not counted
    ceiling = activity.ceiling("batch", {})
    assert ceiling is not None and ceiling.own_ttft_s == 1.2
    clock.now += 11.0
    assert 0.2 < activity.room_s("default") < 0.6  # the moving average of the last ones (0.53)


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


def test_a_few_short_gaps_do_not_end_a_bands_activity_between_two_ordinary_requests() -> None:
    """`default` at ~1 request a second whose first gaps happen to be short (0.1 s, 0.2 s): their mean is no
    estimate of its rate, and 5 of it (0.75 s) lapsed before its next ordinary request, when `batch` filled the
    engines with 28 s of its work (the flow bench's `default` shed for the rest of the stage). Until it has
    MIN_GAPS gaps, a band stays active the whole window; after that, 5 of the mean of its last gaps."""
    clock = Clock()
    activity = BandActivity(BANDS, window_s=60.0, clock=clock)
    for gap in (0.0, 0.1, 0.2):
        clock.now += gap
        activity.saw("default", 1.2)
    clock.now += 1.5  # an ordinary gap for a stream of 1 a second
    ceiling = activity.ceiling("batch", {})
    assert ceiling is not None and ceiling.band == "default"
    for _ in range(MIN_GAPS):  # now its gaps say ~1 a second
        activity.saw("default", 1.2)
        clock.now += 1.0
    ceiling = activity.ceiling("batch", {})
    assert ceiling is not None and ceiling.rate_per_s is not None and 0.8 < ceiling.rate_per_s < 1.2
    clock.now += 10  # 5 of its ~1 s gaps: quiet, batch has the engines again
    assert activity.ceiling("batch", {}) is None


def test_the_rate_room_is_kept_for_is_the_bands_recent_one() -> None:
    """The rate counts the band's requests of the last 10 s over the span they cover: another team's 5 a second a
    minute ago, or the quiet spell before this stream, does not make a stream of 1 a second look like 5 or 0.3."""
    clock = Clock()
    activity = BandActivity(BANDS, window_s=60.0, clock=clock)
    assert activity.rate_per_s("default") is None
    for _ in range(50):  # 5 a second for 10 s
        activity.saw("default")
        clock.now += 0.2
    rate = activity.rate_per_s("default")
    assert rate is not None and 4.5 < rate < 5.5
    clock.now += 45.0
    assert activity.rate_per_s("default") is None
    for _ in range(4):  # 1 a second, starting now
        activity.saw("default")
        clock.now += 1.0
    rate = activity.rate_per_s("default")
    assert rate is not None and 0.8 < rate <= 1.0


def test_room_is_kept_for_the_higher_bands_arrivals_while_a_lower_prefill_holds_its_engine() -> None:
    """The flow bench's overload stage: `default` at 1 request a second of ~1.2 s each (2 s objective), `batch`
    prompts of ~2 s, two engines both idle. Room for default's *next* request alone let batch take an engine each
    time the other had 0.8 s of load or less, so default had one engine for 1.2 engines of work and was the class
    shed (29%). During batch's 2 s on a, default expects 2 requests (2.4 s of prefill), which b alone cannot serve
    within 2 s each (it has 2 s + the 0.8 s default may wait): batch waits. A default at 1 request in 10 s
    expects 0.2: batch goes."""
    both_idle = decision(cand("a", 0, own_s=1.96), cand("b", 0))
    busy = Ceiling("default", 2.0, own_ttft_s=1.2, rate_per_s=1.0)
    assert priority_hold(both_idle, busy) is None  # room for its next request alone: the rule before
    held = priority_hold(both_idle, busy, arrivals_quantile=0.9)
    assert held is not None and held.kind == "priority" and held.reason is HoldReason.SLO
    assert held.detail == (
        "held for band 'default': placed on a, it takes that engine for 1.96 s, in which that band sends 2.0 "
        "requests on average (4 at the 0.9 quantile); they need 4.80 s of the other engines within its 2 s "
        "objective and those have 2.76 s"
    )
    light = Ceiling("default", 2.0, own_ttft_s=1.2, rate_per_s=0.1)
    assert priority_hold(both_idle, light, arrivals_quantile=0.9) is None
    unknown = Ceiling("default", 2.0, own_ttft_s=1.2)  # no rate yet: room for its next request only
    assert priority_hold(both_idle, unknown, arrivals_quantile=0.9) is None
    # three engines: the other two absorb 1 request a second (5.5 s of room against 4 x 1.2 s)
    three = decision(cand("a", 0, own_s=1.96), cand("b", 0), cand("c", 0))
    assert priority_hold(three, busy, arrivals_quantile=0.9) is None


def test_the_arrivals_counted_are_a_quantile_of_a_poisson_count() -> None:
    """n such that no more arrive 9 times in 10: none at 0.1 expected (0.905 of the time none comes), about twice
    the mean for a few expected, closer to it for many."""
    assert [poisson_quantile(m, 0.9) for m in (0.0, 0.1, 0.5, 1.0, 2.0, 3.0, 20.0)] == [0, 0, 1, 2, 4, 5, 26]
    assert poisson_quantile(2.0, 0.5) == 2 and poisson_quantile(2.0, 0.99) == 6


def test_the_prediction_margin_scales_the_room() -> None:
    """b holds 0.7 s: 0.7 + 1.2 = 1.9 s meets 2 s as predicted, but not once predictions are known to run 10%
    late (2.09 s)."""
    d = decision(cand("a", 5_000, own_s=1.1), cand("b", 7_000))
    ceiling = Ceiling("default", 2.0, own_ttft_s=1.2)
    assert priority_hold(d, ceiling) is None
    held = priority_hold(d, ceiling, margin=1.1)
    assert held is not None and "(the best, b, 2.09 s)" in held.detail


def test_a_quiet_higher_band_still_caps_how_deep_a_lower_band_is_committed() -> None:
    """`default` went quiet (past 5 of its mean gaps) but was seen within the window: `batch` is no longer held for
    its room, but it is committed only where it would queue behind no more than `default`'s 2 s objective of work.
    Before, it was committed up to its own 30 s, and `default`'s next request found 28 s of batch in every engine."""
    clock = Clock()
    activity = BandActivity(BANDS, window_s=60.0, clock=clock)
    for _ in range(MIN_GAPS + 1):
        activity.saw("default", 1.2)
        clock.now += 1.0
    clock.now += 10.0
    assert activity.ceiling("batch", {}) is None  # quiet: no room kept
    recent = activity.recent("batch")
    assert recent is not None and recent.band == "default" and recent.slo_s == 2.0
    assert activity.recent("default") is None  # nothing stricter above it
    shallow = decision(cand("a", 15_000, own_s=1.96), cand("b", 25_000))  # a holds 1.5 s of queued prefill
    assert depth_hold(shallow, recent) is None
    deep = decision(cand("a", 80_000, own_s=1.96), cand("b", 90_000))  # 8 s
    held = depth_hold(deep, recent)
    assert held is not None and held.kind == "priority"
    assert held.detail == (
        "held for band 'default' (quiet now, seen lately): placed on a, it would queue behind 8.00 s of work, more "
        "than that band's 2 s objective; it waits here until an engine drains"
    )
    clock.now += 61.0
    assert activity.recent("batch") is None  # the window closed: batch uses its own objective
