"""Prometheus text exposition -> a flat, lookup-friendly index of samples.

Engines disagree on small things a scraper must not trip over, so lookups here are lenient:

- counters: ``prometheus_client`` declares ``vllm:prompt_tokens`` and exposes ``vllm:prompt_tokens_total``; other
  exporters write ``_total`` themselves, some omit it. ``counter(name)`` accepts the name with or without the suffix
  (engines.md 4.1, "suffix rule");
- several series per name (vLLM's ``engine`` label per data-parallel rank, one DCGM series per GPU): gauges and
  counters are summed, or the maximum taken where that is the meaning (``gauge_max``);
- NaN and infinite values are ignored, as if the series were absent.

A body that is not Prometheus text raises ``MetricsParseError``; absent names return ``None``, never 0, so callers
can tell "the engine does not expose this" from "it is zero".
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["HistogramTotals", "Labels", "MetricSamples", "MetricsParseError", "parse_prometheus_text"]

Labels = dict[str, str]

COUNTER_SUFFIX = "_total"


class MetricsParseError(ValueError):
    """A /metrics body that is not Prometheus text exposition."""


@dataclass(frozen=True)
class HistogramTotals:
    """The ``_sum`` and ``_count`` of a histogram (or summary), summed over all its series."""

    sum: float
    count: float


class MetricSamples:
    """Every sample of one scrape, indexed by sample name (``foo_total``, ``foo_sum``, ``foo_bucket``...)."""

    def __init__(self, samples: dict[str, list[tuple[Labels, float]]] | None = None) -> None:
        self._samples: dict[str, list[tuple[Labels, float]]] = samples or {}

    def __len__(self) -> int:
        return sum(len(series) for series in self._samples.values())

    def names(self) -> set[str]:
        return set(self._samples)

    def series(self, name: str) -> list[tuple[Labels, float]]:
        """All (labels, value) pairs of one exact sample name."""
        return self._samples.get(name, [])

    def _values(self, name: str) -> list[float]:
        return [value for _, value in self.series(name)]

    def gauge_sum(self, *names: str) -> float | None:
        """Sum over the series of the first of ``names`` that is present (later names are fallbacks)."""
        for name in names:
            values = self._values(name)
            if values:
                return math.fsum(values)
        return None

    def gauge_max(self, *names: str) -> float | None:
        """Maximum over the series of the first of ``names`` that is present."""
        for name in names:
            values = self._values(name)
            if values:
                return max(values)
        return None

    def counter(self, *names: str) -> float | None:
        """Sum over the series of the first counter of ``names`` present, with or without the ``_total`` suffix."""
        for name in names:
            base = name.removesuffix(COUNTER_SUFFIX)
            total = self.gauge_sum(base + COUNTER_SUFFIX, base)
            if total is not None:
                return total
        return None

    def histogram(self, *names: str) -> HistogramTotals | None:
        """``_sum`` and ``_count`` of the first histogram of ``names`` present, summed over its series."""
        for name in names:
            total = self.gauge_sum(name + "_sum")
            count = self.gauge_sum(name + "_count")
            if total is not None and count is not None:
                return HistogramTotals(sum=total, count=count)
        return None

    def label(self, name: str, label: str) -> str | None:
        """The value of ``label`` on the first series of ``name`` that carries it (info-style gauges)."""
        for labels, _ in self.series(name):
            if label in labels:
                return labels[label]
        return None


def _unread(line: str) -> bool:
    """What no engine module reads: histogram buckets, ``_created`` timestamps, HELP/TYPE comments.

    Buckets are most of a vLLM page; skipping them makes a scrape about 7x cheaper to parse. Sample names do not
    depend on the comments: lookups are by sample name, and ``counter()`` accepts both spellings.
    """
    return line.startswith("#") or "_bucket{" in line or "_created{" in line


# One plain sample line: ``name{labels} value [timestamp]``. Label values with a backslash (escapes) are left to
# prometheus_client, as is every line this does not match.
_LABEL_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"'
_SAMPLE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"
    rf"(?:\{{((?:{_LABEL_PAIR}(?:,{_LABEL_PAIR})*,?)?)\}})?"
    r"[ \t]+([^\s_]+)(?:[ \t]+-?[0-9]+)?[ \t]*"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def _parse_plain(lines: list[str]) -> dict[str, list[tuple[Labels, float]]] | None:
    """The lean parse of plain sample lines, or None at the first line it does not handle (the caller then
    parses the whole body with prometheus_client, so both give the same samples or the same error).

    Why: the embedded collector parses every engine's page every second on a thread of the gateway's process
    (LiteLLM's proxy), where its CPU is the proxy's; prometheus_client's parser costs ~3 us per line in Python
    string handling, this ~1 us (a C regex per line and per label set).
    """
    index: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
    match_sample = _SAMPLE.fullmatch
    find_labels = _LABEL.findall
    isfinite = math.isfinite
    for line in lines:
        m = match_sample(line)
        if m is None:
            return None
        name, label_text, raw = m.groups()
        try:
            value = float(raw)
        except ValueError:
            return None
        if isfinite(value):
            index[name].append((dict(find_labels(label_text)) if label_text else {}, value))
    return index


def _parse_full(body: str, text: str) -> dict[str, list[tuple[Labels, float]]]:
    index: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                value = float(sample.value)
                if math.isfinite(value):
                    index[sample.name].append((dict(sample.labels), value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        snippet = text[:80].replace("\n", "\\n")
        raise MetricsParseError(f"not Prometheus text exposition ({exc}); body starts {snippet!r}") from exc
    return index


def parse_prometheus_text(text: str, *, keep_buckets: bool = False) -> MetricSamples:
    """Parse a /metrics body. Raises ``MetricsParseError`` (with the parser's reason) when it is not Prometheus text.

    Histogram buckets, ``_created`` samples and comments are skipped unless ``keep_buckets``. Plain sample lines
    (every line of the engines' pages) take a lean path; anything else, the whole body through prometheus_client.
    """
    if keep_buckets:
        return MetricSamples(dict(_parse_full(text, text)))
    lines = [line for line in text.splitlines() if line and not line.isspace() and not _unread(line)]
    index = _parse_plain(lines)
    if index is None:
        index = _parse_full("\n".join(lines), text)
    return MetricSamples(dict(index))
