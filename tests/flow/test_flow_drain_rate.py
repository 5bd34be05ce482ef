"""The queue's drain rate (``cognitora.flow.drain_rate``): what a Retry-After is computed from."""

from __future__ import annotations

import pytest

from cognitora.flow.drain_rate import MAX_RETRY_AFTER_S, TAU_S, DrainRate, retry_after_s


def test_the_drain_rate_follows_dispatches_up_and_fades_without_them() -> None:
    rate = DrainRate()
    assert rate.per_s(100.0) == 0.0
    now = 100.0
    for _ in range(600):  # 2 dispatches a second for a minute
        now += 0.5
        rate.tick(now)
    assert rate.per_s(now) == pytest.approx(2.0, rel=0.05)
    assert rate.per_s(now + TAU_S) == pytest.approx(2.0 / 2.718, rel=0.05)  # nothing drains: it fades
    assert rate.per_s(now + 10 * TAU_S) < 0.001
    later = now + 10 * TAU_S
    for _ in range(300):  # draining again, at 5 a second
        later += 0.2
        rate.tick(later)
    assert rate.per_s(later) == pytest.approx(5.0, rel=0.05)


def test_retry_after_is_the_wait_for_those_ahead_within_bounds() -> None:
    assert retry_after_s(9, 2.0, fallback_s=30.0) == 5
    assert retry_after_s(0, 100.0, fallback_s=30.0) == 1
    assert retry_after_s(1000, 1.0, fallback_s=30.0) == MAX_RETRY_AFTER_S
    assert retry_after_s(5, 0.0, fallback_s=30.0) == 30
