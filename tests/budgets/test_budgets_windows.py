"""Budget windows: calendar months and days in a configured time zone (DST included), rolling windows, and the
per-window cache that must agree with computing each time."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

from cognitora.budgets.config import LimitConfig, WindowKind
from cognitora.budgets.windows import WindowCache, current_window

PARIS = ZoneInfo("Europe/Paris")


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def limit(window: str, **extra: float) -> LimitConfig:
    return LimitConfig(window=WindowKind(window), total_tokens=1, **extra)  # type: ignore[arg-type]


def test_a_month_in_paris_starts_and_ends_at_paris_midnight() -> None:
    span = current_window(limit("month"), ts("2026-11-30T23:30:00+00:00"), PARIS)  # already December in Paris
    assert span.id == "m2026-12"
    assert span.resets_at == ts("2026-12-31T23:00:00+00:00")
    utc = current_window(limit("month"), ts("2026-11-30T23:30:00+00:00"), ZoneInfo("UTC"))
    assert utc.id == "m2026-11" and utc.resets_at == ts("2026-12-01T00:00:00+00:00")


def test_a_dst_day_is_23_hours_long() -> None:
    span = current_window(limit("day"), ts("2026-03-29T12:00:00+02:00"), PARIS)
    assert span.id == "d2026-03-29" and span.starts_at is not None
    assert span.resets_at - span.starts_at == 23 * 3600


def test_rolling_buckets_and_the_cache_agree_with_computing_each_time() -> None:
    rolling = limit("rolling", rolling_s=3600)
    span = current_window(rolling, 1_000_000.0, PARIS)
    assert span.bucket_s == 60 and span.bucket == 1_000_000 // 60
    assert span.min_bucket == span.bucket - 59
    cache = WindowCache(PARIS)
    for kind in ("minute", "hour", "day", "month"):
        for now in (
            ts("2026-12-31T22:59:59.5+00:00"),
            ts("2026-12-31T23:00:00+00:00"),
            ts("2027-01-01T00:00:01+00:00"),
        ):
            assert cache.span(limit(kind), now) == current_window(limit(kind), now, PARIS), (kind, now)
    assert cache.day(ts("2026-12-31T23:00:00+00:00")) == "2027-01-01"
    assert cache.day(ts("2026-12-31T22:59:59+00:00")) == "2026-12-31"
