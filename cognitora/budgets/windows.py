"""Budget windows: where the current window of each kind starts and ends, in the configured time zone.

Calendar windows (minute, hour, day, month) have an id (part of the counter's key: a new window is a new
counter, so nothing has to be reset) and an end (the reset time a refusal reports). A rolling window is a ring of
``ROLLING_BUCKETS`` buckets in one hash: usage leaves it one bucket at a time, so it is counted up to one bucket
(1/60 of the window) longer than the window itself: late, never early, so a limit is never overshot.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from cognitora.budgets.config import LimitConfig, WindowKind

__all__ = ["ROLLING_BUCKETS", "WindowCache", "WindowSpan", "current_window", "day_of", "window_label"]

ROLLING_BUCKETS = 60


@dataclass(frozen=True)
class WindowSpan:
    id: str
    """Part of the counter key: ``m2026-12``, ``d2026-12-01``, ``h2026-12-01T13``, ``n2026-12-01T13:05``, ``r3600``."""
    resets_at: float
    """Unix time the window ends (calendar), or when the current bucket leaves a rolling window."""
    expire_at: float
    """Unix time after which the counter is of no use (its key's TTL)."""
    bucket: int | None = None
    """Rolling only: the bucket this instant counts into."""
    min_bucket: int | None = None
    """Rolling only: the oldest bucket still inside the window."""
    bucket_s: float | None = None
    starts_at: float | None = None
    """Calendar only: the window's start (with ``resets_at``, the span a cached window is good for)."""


def current_window(limit: LimitConfig, now: float, zone: ZoneInfo) -> WindowSpan:
    kind = limit.window
    if kind is WindowKind.ROLLING:
        assert limit.rolling_s is not None
        bucket_s = limit.rolling_s / ROLLING_BUCKETS
        bucket = math.floor(now / bucket_s)
        return WindowSpan(
            id=f"r{limit.rolling_s:g}",
            resets_at=(bucket + 1) * bucket_s,
            expire_at=now + limit.rolling_s + 2 * bucket_s,
            bucket=bucket,
            min_bucket=bucket - ROLLING_BUCKETS + 1,
            bucket_s=bucket_s,
        )
    local = dt.datetime.fromtimestamp(now, zone)
    if kind is WindowKind.MINUTE:
        start = local.replace(second=0, microsecond=0)
        ident, end = f"n{start:%Y-%m-%dT%H:%M}", start.timestamp() + 60
    elif kind is WindowKind.HOUR:
        start = local.replace(minute=0, second=0, microsecond=0)
        ident, end = f"h{start:%Y-%m-%dT%H}", start.timestamp() + 3600
    elif kind is WindowKind.DAY:
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        next_day = start.date() + dt.timedelta(days=1)
        ident, end = f"d{start:%Y-%m-%d}", _midnight(next_day, zone)
    else:
        first = local.date().replace(day=1)
        start = dt.datetime(first.year, first.month, 1, tzinfo=zone)
        following = (first + dt.timedelta(days=32)).replace(day=1)
        ident, end = f"m{first:%Y-%m}", _midnight(following, zone)
    # A day past the end: a settle of a request that started in this window still finds its counter.
    return WindowSpan(id=ident, resets_at=end, expire_at=end + 86400, starts_at=start.timestamp())


def _midnight(day: dt.date, zone: ZoneInfo) -> float:
    return dt.datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


def day_of(now: float, zone: ZoneInfo) -> str:
    """The report day (``YYYY-MM-DD`` in ``zone``) of an instant."""
    return f"{dt.datetime.fromtimestamp(now, zone):%Y-%m-%d}"


def window_label(limit: LimitConfig, zone: ZoneInfo) -> str:
    """How a refusal names the window: ``month (Europe/Paris)``, ``rolling 3600 s``."""
    if limit.window is WindowKind.ROLLING:
        return f"rolling {limit.rolling_s:g} s"
    return f"{limit.window.value} ({zone.key})"


class WindowCache:
    """``current_window`` for calendar windows, computed once per window (time-zone arithmetic is most of a
    reservation's planning cost); rolling windows are plain arithmetic and computed each time."""

    def __init__(self, zone: ZoneInfo) -> None:
        self.zone = zone
        self._spans: dict[WindowKind, WindowSpan] = {}
        self._day: tuple[float, float, str] | None = None

    def span(self, limit: LimitConfig, now: float) -> WindowSpan:
        if limit.window is WindowKind.ROLLING:
            return current_window(limit, now, self.zone)
        known = self._spans.get(limit.window)
        if known is not None and known.starts_at is not None and known.starts_at <= now < known.resets_at:
            return known
        span = self._spans[limit.window] = current_window(limit, now, self.zone)
        return span

    def day(self, now: float) -> str:
        if self._day is not None and self._day[0] <= now < self._day[1]:
            return self._day[2]
        span = current_window(LimitConfig(window=WindowKind.DAY, total_tokens=0), now, self.zone)
        assert span.starts_at is not None
        self._day = (span.starts_at, span.resets_at, span.id[1:])
        return self._day[2]
