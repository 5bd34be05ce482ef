"""A picture of what each router did to each request's wait for its first token (``make demo``'s PNG).

Two panels, one colour per router, over the same requests:

- left, the TTFT distribution: the share of requests that had their first token within x seconds (a curve further
  left and higher is better), with the SLO marked;
- right, the timeline: every request as a dot at its arrival time and its TTFT, so a queue building up shows as a
  rising band.

A request still waiting when the run's deadline came has no TTFT: it is drawn at its wait so far (a lower bound;
an ``x`` on the timeline), so an overloaded router never looks faster than it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.loadgen import RequestResult


@dataclass(frozen=True)
class Series:
    """One router's requests: ``(arrival_s, ttft_s, served)`` each; served means a first token arrived."""

    label: str
    points: tuple[tuple[float, float, bool], ...]

    @property
    def served(self) -> int:
        return sum(1 for _, _, served in self.points if served)

    def cdf(self) -> tuple[list[float], list[float]]:
        """Sorted TTFTs and the share of requests at or below each."""
        ttfts = sorted(t for _, t, _ in self.points)
        n = len(ttfts)
        return ttfts, [(i + 1) / n for i in range(n)]


def series(label: str, results: Sequence[RequestResult], stage: str) -> Series:
    """The requests of ``stage`` that have a TTFT or a wait so far (errors without either are not drawn)."""
    points = [
        (r.arrival_s, r.ttft_s, r.ok or r.tokens_received > 0)
        for r in results
        if r.stage == stage and r.ttft_s is not None and (r.ok or r.censored)
    ]
    start = min((a for a, _, _ in points), default=0.0)
    return Series(label, tuple(sorted((a - start, t, s) for a, t, s in points)))


def plot_ttft(
    results: Mapping[str, Sequence[RequestResult]],
    labels: Mapping[str, str],
    stage: str,
    slo_ttft_s: float,
    title: str,
    path: Path,
) -> list[Series]:
    """Draw ``results`` (per target name) of ``stage`` into ``path`` (PNG); return what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [series(labels.get(name, name), rs, stage) for name, rs in results.items()]
    drawn = [s for s in drawn if s.points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for i, s in enumerate(drawn):
        colour = f"C{i}"
        x, y = s.cdf()
        left.step(x, y, where="post", color=colour, lw=2, label=f"{s.label}: {s.served} of {len(s.points)} served")
        for served, marker in ((True, "o"), (False, "x")):
            pts = [(a, t) for a, t, ok in s.points if ok is served]
            if pts:
                right.scatter(
                    [a for a, _ in pts],
                    [t for _, t in pts],
                    s=14 if served else 30,
                    marker=marker,
                    color=colour,
                    alpha=0.7,
                    label=s.label if served else f"{s.label}: no first token by the deadline",
                )
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
    objective = f"TTFT objective ({slo_ttft_s:g} s)"
    left.axvline(slo_ttft_s, color="grey", ls="--", lw=1, label=objective)
    right.axhline(slo_ttft_s, color="grey", ls="--", lw=1, label=objective)
    left.set_xscale("log")
    left.set_xlabel("time to first token (s, log scale)")
    left.set_ylabel("share of requests with their first token by then")
    left.set_ylim(0, 1.02)
    left.set_title("TTFT distribution (further left and higher is better)", fontsize=10)
    left.legend(fontsize=8, loc="lower right")
    right.set_yscale("log")
    right.set_xlabel("request arrival (s since the measured stage began)")
    right.set_ylabel("time to first token (s, log scale)")
    right.set_title("Every request: when it arrived, how long it waited", fontsize=10)
    right.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn
