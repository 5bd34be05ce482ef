"""Strict priority at admission (``cognitora.flow.priority``): which higher band's objective caps a lower band, for
how long after its last request, and when every engine's load is over it. A fake clock: no sleeps."""

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


def cand(endpoint: str, queued_tokens: float) -> CandidateScore:
    return CandidateScore(
        endpoint=endpoint,
        cached_tokens=0.0,
        queued_prefill_tokens=queued_tokens,
        prefill_tokens_per_s=10_000.0,
        predicted_ttft_s=queued_tokens / 10_000 + 0.1,
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


def test_held_only_while_every_engine_is_loaded_past_the_ceiling() -> None:
    ceiling = Ceiling("default", 2.0)
    held = priority_hold(decision(cand("a", 50_000), cand("b", 30_000)), ceiling)
    assert held is not None and held.reason is HoldReason.SLO
    assert held.detail == (
        "held for band 'default': every engine holds more queued work than its 2 s objective (the least, b, 3.00 s)"
    )
    assert priority_hold(decision(cand("a", 50_000), cand("b", 10_000)), ceiling) is None  # b has room under 2 s
    refused = decision(cand("a", 50_000), rejection=Rejection(404, "unknown model"))
    assert priority_hold(refused, ceiling) is None  # not saturation: never waits
