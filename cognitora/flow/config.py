"""The ``flow_control:`` section of ``cognitora.yaml``: how long each priority class may wait at the gateway when
the fleet is saturated, how bands and teams share the capacity that frees, and how gateway replicas share it.

Kept apart from ``cognitora.config`` (which will import it, docs/flow_control.md "Configuration"), like
``cognitora.budgets.config``: one section, one module, the same strictness (an unknown key is an error naming it).
Names of priority classes are checked against ``placement.priorities`` by ``FlowControlConfig.problems``, which
the config loader calls with the rest of its reference checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "FairnessCost",
    "FlowClassConfig",
    "FlowControlConfig",
    "HoldReason",
    "IsolationConfig",
    "LeaseConfig",
    "MarginConfig",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class HoldReason(StrEnum):
    """What makes a request wait at the gateway instead of being committed to an engine's queue."""

    SEATS = "seats"
    """Every eligible engine is at capacity: the request would wait for a seat there (``slot_wait_s`` > 0)."""
    KV = "kv"
    """Every eligible engine would have to wait for KV room for this request (``kv_pressure_s`` > 0)."""
    SLO = "slo"
    """No eligible engine meets the class's TTFT (or ITL) objective *because of load*: one of them would meet it
    with its queue, seat and KV waits taken away. A prompt too long for the objective on an idle engine does not
    wait for that (waiting cannot make it faster)."""


class FairnessCost(StrEnum):
    """What a request costs its flow in the fair share within a band."""

    UNCACHED_TOKENS = "uncached_tokens"
    """Its prompt tokens that no eligible engine holds (at least ``min_cost_tokens``): the prefill it really adds."""
    PROMPT_TOKENS = "prompt_tokens"
    """Its whole prompt, cached or not (what a router that cannot see caches would charge)."""
    REQUESTS = "requests"
    """1 per request: round robin across flows."""
    FIFO = "fifo"
    """No fairness: one queue per band, first come first served."""


class FlowClassConfig(_Strict):
    """One priority class's limits in the gateway queue."""

    max_wait_s: float | None = Field(default=None, gt=0, le=3600)
    """The longest a request of this class waits in the queue: an operator's fixed bound. Past it: 429 with
    Retry-After, unless the burst policy sends it to a cloud target. None (the default): the wait follows the
    class's TTFT objective, per request: it waits while leaving the queue could still meet ``ttft_slo_s``, that
    is ``ttft_slo_s`` less its own predicted TTFT on an unloaded engine (a request that misses the objective even
    there waits at most ``ttft_slo_s``). Envoy's ext_proc ``message_timeout`` must cover the longest wait
    (docs/flow_control.md, "Leaving the queue" and "Envoy")."""
    aged_after_s: float | None = Field(default=None, gt=0)
    """Anti-starvation: once this class's oldest waiter has waited this long, its band may take one dispatch in
    every ``1 / aged_share`` ahead of busier higher bands. None: strictly below the bands above it. Must be shorter
    than ``max_wait_s`` (else the bound never applies), or, with a wait that follows the objective, than what that
    leaves."""

    @model_validator(mode="after")
    def _aged_before_timeout(self) -> FlowClassConfig:
        if self.aged_after_s is not None and self.max_wait_s is not None and self.aged_after_s >= self.max_wait_s:
            raise ValueError(
                f"aged_after_s ({self.aged_after_s:g} s) must be shorter than max_wait_s ({self.max_wait_s:g} s): "
                "a request times out before it would age"
            )
        return self


class LeaseConfig(_Strict):
    """Leases per engine in Redis, shared by gateway replicas (``cognitora.flow.redis_leases``)."""

    enabled: bool = False
    """Dispatch from the queue only with a lease on the chosen engine: at most ``max_num_seqs x overcommit``
    leases per engine across every replica. Needs ``redis_url`` and ``max_num_seqs`` on the engines it applies to
    (an engine without it is not lease-gated)."""
    overcommit: float = Field(default=1.0, ge=1.0, le=16.0)
    """Leases per engine seat: above 1 lets a short queue form inside the engine, so a seat that frees is refilled
    without waiting for a gateway's round trip."""
    replica_ttl_s: float = Field(default=10.0, ge=1.0, le=300.0)
    """A replica that stops renewing its heartbeat for this long is dead: its leases are released. It renews every
    third of it."""
    max_lease_s: float = Field(default=3600.0, ge=10.0, le=86400.0)
    """A lease never lives longer than this, even on a live replica (a release that a bug lost)."""


class IsolationConfig(_Strict):
    """Team isolation within a band (``cognitora.flow.isolation``): while another team is active in the same band,
    a team's request is held if committing it would leave no eligible engine free of that team's in-flight prefill
    (unless every other active team is backlogged here and would be held from that engine too). One team's long
    prompts then occupy every engine but one, and the other teams' short ones land on the one left (inside an
    engine a long prefill runs before a short request that arrives during it, so no queue order gives them that).
    Across bands the priority hold applies instead. Costs the busy team throughput (docs/flow_control.md, "Team
    isolation")."""

    enabled: bool = True
    """On by default whenever ``flow_control`` is."""
    window_s: float = Field(default=10.0, ge=0, le=3600)
    """Another team counts as active while it has waiters in the same band, or for this long after its last
    request there (0: only while it has waiters). 10 s covers the gaps of a team sending 0.5 requests a second
    or more (Poisson: a gap over 10 s once in 150), and bounds what a team that went quiet costs the busy one."""
    prefill_margin: float = Field(default=1.5, ge=1.0, le=10.0)
    """A request's prefill counts as in flight on its engine from its placement until its first token or its end,
    and at most this many times its predicted TTFT there (a gateway that never reports a first token, a lost
    report). Above 1: a prediction somewhat short does not free the engine for the team too early."""


class MarginConfig(_Strict):
    """The prediction margin (``cognitora.flow.margin``): flow control multiplies the TTFT predictions it admits
    by (its objective checks, each class's wait bound, the room kept for a higher band) by a quantile of how late
    this process's requests really were against their predictions, so a prediction error is not an admission
    error (docs/flow_control.md, "The prediction margin")."""

    quantile: float = Field(default=0.9, ge=0, lt=1)
    """Of the recent achieved / predicted TTFT ratios: 0.9 means nine requests in ten are no later than their
    prediction x the margin. 0: no margin (predictions taken as they are)."""
    samples: int = Field(default=200, ge=10, le=100_000)
    """The window: the last this many requests' ratios."""
    min_samples: int = Field(default=10, ge=1)
    """Below this many ratios the margin is 1. 10: the flow bench's overload stage (1 request a second of the top
    class) had its margin from 10 s on; at 20 it was still 1 for most of the stage, and the requests placed at
    the end of their wait were served at 2.04-2.15 s against 2 s."""
    min_predicted_s: float = Field(default=0.5, ge=0)
    """Only requests predicted at least this long count: a short prompt's ratio (network and step overhead) says
    nothing about whether a long one meets its objective."""
    max_factor: float = Field(default=1.5, ge=1.0, le=10.0)
    """The margin never exceeds this (an engine that stalled for a while must not make the gateway refuse
    everything); it is never below 1 (an over-prediction stays a margin)."""

    @model_validator(mode="after")
    def _window(self) -> MarginConfig:
        if self.min_samples > self.samples:
            raise ValueError(f"min_samples ({self.min_samples}) is more than samples ({self.samples})")
        return self


class FlowControlConfig(_Strict):
    """Hold requests at the gateway while the fleet is saturated, by priority band and fair across teams. Absent:
    no queue (a saturated request is placed anyway, or shed if its class is sheddable)."""

    bands: list[str] | None = None
    """Priority classes (``placement.priorities``), highest band first; each class exactly once. None: by the
    classes' ``ttft_slo_s``, tightest first."""
    classes: dict[str, FlowClassConfig] = Field(default_factory=dict)
    """Per class limits; a class not listed waits up to ``default_max_wait_s``, strictly below the bands above."""
    default_max_wait_s: float | None = Field(default=None, gt=0, le=3600)
    """``max_wait_s`` of a class without an entry in ``classes``. None (the default): its wait follows its TTFT
    objective (see ``FlowClassConfig.max_wait_s``)."""
    hold_on: list[HoldReason] = Field(default_factory=lambda: [HoldReason.SEATS, HoldReason.KV, HoldReason.SLO])
    """Which saturation signals make a request wait (``seats``, ``kv``, ``slo``)."""
    fairness: FairnessCost = FairnessCost.UNCACHED_TOKENS
    """What a request costs its team's share within a band (bench/results/flow_fairness.md compares them)."""
    min_cost_tokens: int = Field(default=16, ge=1)
    """The least a request costs under ``uncached_tokens``: a fully cached prompt still takes a seat and a step."""
    team_weights: dict[str, float] = Field(default_factory=dict)
    """Share weights by flow (``team:<name>``, ``key:<id>``); 1 for any other. A flow of weight 2 gets twice the
    tokens of a flow of weight 1 when both wait."""
    aged_share: float = Field(default=0.1, gt=0, le=0.5)
    """The most of the dispatches that aged lower bands may take from higher ones (see ``aged_after_s``)."""
    max_queued: int = Field(default=10_000, ge=1, le=1_000_000)
    """Waiters per gateway process; past it a request that would wait gets 429 at once."""
    max_queued_per_flow: int | None = Field(default=None, ge=1)
    """Waiters per flow (team, else key) per process; None: ``max_queued``. Keeps one team from filling the queue."""
    recheck_interval_s: float = Field(default=0.25, gt=0, le=10)
    """While requests wait, the fleet is re-checked at least this often: capacity freed by another replica, a
    scrape that shows a drained engine, an expired lease. Finishes and first tokens in this process wake the
    queue at once."""
    retry_spacing_s: float = Field(default=0.02, ge=0, le=1)
    """After a try that finds the fleet still saturated, the queue waits this long before the next: wake-ups that
    come faster (a storm of finishes) are merged. A try is one placement (about 1.3 ms of CPU on Redis,
    bench/results/budget_overhead.md), so tries that fail cost at most that over this: 7% of a core at 0.02 s
    while every seat is taken (per waiting flow of the top band while heads are held for ``kv`` or ``slo``: each
    flow is tried once per wake-up), while a freed seat waits at most this long for its next request."""
    priority_window_s: float = Field(default=60.0, ge=0, le=3600)
    """Strict priority at admission: while a band has waiters, and after its last request for 5 of its mean gaps
    between requests but at most this long (this long until it has a mean gap), a lower band's request is held,
    not placed, where committing it would leave no engine with room for that band's next request within its TTFT
    objective (so a lax class cannot fill the engines ahead of a strict one; ``cognitora.flow.priority``). 0: only
    while the higher band has waiters. The anti-starvation rule (``aged_after_s``) still dispatches aged
    requests."""
    priority_arrivals_quantile: float = Field(default=0.9, ge=0, le=0.999)
    """Strict priority at admission, while a higher band is active: a lower band's request is committed only if
    the other engines could also take the higher band's arrivals during its prefill, each within that band's
    objective: as many as a Poisson stream at the band's recent rate sends in that time at this quantile (0.9:
    nine times in ten no more arrive). 0: room for the higher band's next request only."""
    margin: MarginConfig = Field(default_factory=MarginConfig)
    """The prediction margin: a measured quantile of how late requests were against their predicted TTFT, which
    every prediction flow control admits by is multiplied by."""
    isolation: IsolationConfig = Field(default_factory=IsolationConfig)
    """Team isolation within a band: while another team is active, no team's prefill takes every engine (on by
    default; docs/flow_control.md, "Team isolation")."""
    leases: LeaseConfig = Field(default_factory=LeaseConfig)
    """Leases per engine in Redis, so gateway replicas sharing it admit no more than an engine's seats between
    them (docs/flow_control.md, "Across gateway replicas"). Off by default."""

    @model_validator(mode="after")
    def _check(self) -> FlowControlConfig:
        if self.bands is not None:
            twice = sorted(name for name, n in Counter(self.bands).items() if n > 1)
            if twice:
                raise ValueError(f"bands: {', '.join(twice)} listed more than once")
            if not self.bands:
                raise ValueError("bands: give at least one priority class, or leave bands out")
        if not self.hold_on:
            raise ValueError("hold_on: give at least one of seats, kv, slo (or remove the flow_control section)")
        if self.max_queued_per_flow is not None and self.max_queued_per_flow > self.max_queued:
            raise ValueError(
                f"max_queued_per_flow ({self.max_queued_per_flow}) is more than max_queued ({self.max_queued})"
            )
        bad = {flow: w for flow, w in self.team_weights.items() if not w > 0}
        if bad:
            raise ValueError(f"team_weights must be positive, got {bad}")
        return self

    def problems(self, priorities: Mapping[str, object]) -> list[str]:
        """What names a class ``placement.priorities`` does not define (``priorities``: its classes), or leaves
        one out of ``bands``; each a sentence with its key path, for the loader's reference checks."""
        known = ", ".join(priorities)
        out = [
            f"flow_control.classes.{name}: {name!r} is not a class of placement.priorities ({known})"
            for name in self.classes
            if name not in priorities
        ]
        if self.bands is not None:
            out += [
                f"flow_control.bands: {name!r} is not a class of placement.priorities ({known})"
                for name in self.bands
                if name not in priorities
            ]
            missing = [name for name in priorities if name not in self.bands]
            if missing:
                out.append(
                    f"flow_control.bands: every priority class needs a band; {', '.join(missing)} "
                    "missing (or leave bands out to order them by ttft_slo_s)"
                )
        return out

    def class_config(self, name: str) -> FlowClassConfig:
        """The limits of class ``name``: its entry, its ``max_wait_s`` else ``default_max_wait_s`` (None: the wait
        follows the class's objective)."""
        entry = self.classes.get(name)
        if entry is None:
            return FlowClassConfig(max_wait_s=self.default_max_wait_s)
        if entry.max_wait_s is None and self.default_max_wait_s is not None:
            return entry.model_copy(update={"max_wait_s": self.default_max_wait_s})
        return entry

    def longest_wait_s(self, ttft_slo_s: Mapping[str, float]) -> float:
        """The longest any class may wait (``ttft_slo_s``: class -> its TTFT objective, ``placement.priorities``):
        its ``max_wait_s``, else its objective (the most a wait that follows it lasts). What Envoy's ext_proc
        ``max_message_timeout`` must exceed."""
        return max(_or(self.class_config(name).max_wait_s, slo) for name, slo in ttft_slo_s.items())

    def weight(self, flow: str) -> float:
        return self.team_weights.get(flow, 1.0)


def _or(value: float | None, fallback: float) -> float:
    return fallback if value is None else value
