"""The ``placement`` section: the placement model's weights, filters and power rule, and the priority classes.

``DEFAULT_PRIORITY`` is the class a request gets when it names none (``cognitora.identity``'s); every config has it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cognitora.config.strict import StrictModel
from cognitora.identity import DEFAULT_PRIORITY as IDENTITY_DEFAULT_PRIORITY

__all__ = ["DEFAULT_PRIORITY", "PlacementConfig", "PriorityClass"]

DEFAULT_PRIORITY = IDENTITY_DEFAULT_PRIORITY
"""The priority class a request gets when it names none; every config has it."""


class PriorityClass(StrictModel):
    """A request class with a time-to-first-token objective."""

    ttft_slo_s: float = Field(gt=0)
    """Predicted TTFT (seconds) the class must meet; endpoints predicted slower are not 'feasible' for it."""
    itl_slo_s: float | None = Field(default=None, gt=0)
    """Inter-token latency (seconds) the class must meet: an endpoint whose decode step, as its engine measures it
    now plus the context this request and the ones sent since add to every step, is slower is not 'feasible' for
    it either. Overload then sheds (a sheddable class) instead of slowing every running request's stream past it
    (docs/placement.md, "Admission by ITL"). None: no ITL objective."""
    sheddable: bool = False
    """When no endpoint meets the SLO: true rejects with 429 and Retry-After; false takes the best endpoint."""


def _default_priorities() -> dict[str, PriorityClass]:
    return {
        DEFAULT_PRIORITY: PriorityClass(ttft_slo_s=2.0, sheddable=False),
        "batch": PriorityClass(ttft_slo_s=30.0, sheddable=True),
    }


class PlacementConfig(StrictModel):
    """The placement model's weights. Every term is in seconds or tokens; see docs/placement.md."""

    default_prefill_tokens_per_s: float = Field(default=10000.0, gt=0)
    """Prefill throughput (tokens/s) assumed for an endpoint with neither a learned rate nor a configured prior."""
    rate_pooling_band: float = Field(default=1.5, ge=1.0)
    """Learned prefill rates within one hardware class (``endpoints[].hardware``, engine kind, priors) that lie
    within this factor of each other are priced at their median: what an engine learns carries the prompts it
    happened to serve, and identical engines learned apart drew unequal shares. Rates further apart are kept
    (different hardware, or a slowed engine). Learned energy per token is pooled the same way, within a class that
    also shares the ``joules_per_token`` prior. 1 turns pooling off."""
    kv_usage_limit: float = Field(default=0.97, gt=0, le=1)
    """KV-cache usage (0..1) above which an endpoint is filtered out, unless no other endpoint is left."""
    decode_penalty_s_per_running: float = Field(default=0.0002, ge=0)
    """Seconds added to predicted TTFT per request running on the endpoint (decode steps share the batch)."""
    slot_wait_weight: float = Field(default=0.0, ge=0)
    """Multiplier of the slot-wait term (seconds a request waits for a free batch slot on an engine at capacity).
    0 (off) by default: on the B2B-SaaS benchmark it moved groups off the engine holding their prefix whenever
    engines queued, duplicating 6,000-token prefixes until every KV cache was full (top-stage TTFT p50 27.6 s vs
    0.18 s with it off; bench/results and docs/placement.md, "Saturation"). The term prices the wait but not the
    KV a cache miss costs; 1 turns it on as documented."""
    saturated_kv_usage: float = Field(default=0.97, gt=0, le=1)
    """KV-cache usage (0..1) at or above which an endpoint counts as at capacity even with nothing waiting: a new
    request then waits for running ones to finish (the slot-wait term; docs/placement.md)."""
    waiting_request_tokens: int = Field(default=512, ge=0)
    """Prefill tokens assumed per request the engine reports waiting, when that exceeds what routers counted: a
    prior (the snapshot has no request counter to learn a mean from; see docs/placement.md)."""
    speculative_ttl_s: float = Field(default=10.0, gt=0)
    """How long a routed prompt's blocks count as cached on its endpoint before the engine's events confirm them."""
    routing_history_ttl_s: float = Field(default=300.0, gt=0)
    """For endpoints without ``kv_events`` (llama.cpp, MLX, ...), how long a routed prompt counts as cached there:
    the router's own routing history is their only prefix index."""
    inflight_ttl_s: float = Field(default=900.0, gt=0)
    """A dispatched request stops counting as in flight after this long, even if its end is never reported."""
    prefill_report_factor: float = Field(default=4.0, gt=0)
    """A dispatched request whose first token is never reported stops counting as queued prefill after this many
    times its predicted TTFT (or ``prefill_report_min_s``, whichever is longer): some gateways (LiteLLM's SDK
    streams) have no first-token hook, and a prefill counted until the stream ends makes its engine look swamped."""
    prefill_report_min_s: float = Field(default=10.0, gt=0)
    """The shortest such deadline (seconds): a first token reported late must still arrive before it."""
    unhealthy_mark_ttl_s: float = Field(default=30.0, gt=0)
    """A gateway's "this endpoint failed" mark lasts this long (or until a newer healthy scrape): then the endpoint
    is tried again, so it comes back even where no scraper runs. The scraper's own health verdict still applies."""
    snapshot_max_age_s: float = Field(default=10.0, gt=0)
    """Scraped load older than this is ignored (router-counted in-flight work is still used)."""
    state_max_age_s: float = Field(default=10.0, gt=0)
    """The fleet state a decision reads is stale when the newest collector heartbeat in the store is older than
    this (the collector died, or cannot reach the store), or when none has arrived this long after the router
    started. A stale decision is still made, on what the store holds, and says so: ``Decision.stale_state``, a note
    in its reason and in ``cognitora explain``, ``RouterStats.stale_state``, and a warning logged at most once a
    minute. The collector beats every quarter of its own ``state_max_age_s`` (at least once a second)."""
    power_ttft_slack_s: float = Field(default=0.05, ge=0)
    """Power rule: a candidate counts as close when its predicted TTFT is within this many seconds of the best
    AND within ``power_ttft_slack_ratio`` of it (the smaller bound applies), and its ranking cost within as much of
    the best's; among close ones, the lowest energy for the request wins. The rule never costs a request more than
    this, nor more than that fraction, and never trades away more than that of the recompute and interference
    charges."""
    power_ttft_slack_ratio: float = Field(default=0.1, ge=0)
    """Power rule: the slack as a fraction of the best predicted TTFT; the slack is the smaller of the two."""
    power_e2e_slack_s: float = Field(default=0.3, ge=0)
    """Power rule, end to end: a greener candidate is taken only when its predicted E2E (TTFT + the request's
    expected decode tokens at the engine's learned per-sequence decode speed) is within this many seconds of the
    fastest predicted E2E AND within ``power_e2e_slack_ratio`` of it (the smaller bound applies). Packing onto one
    engine slows every sequence's decode there; this bound stops the rule once that costs more than it allows.
    A candidate whose decode speed is unknown is not taken for energy when the request expects decode tokens."""
    decode_itl_s_per_running: float = Field(default=0.0001, ge=0)
    """Power rule's E2E estimate: seconds each running sequence adds to an engine's inter-token latency (decode
    attention reads its KV every step: ~0.1 ms for a 2k-token context of an 8B or 32B model on H100s). Used to
    charge the request's own load, and to estimate the pace of an engine that has not decoded yet from the others'
    learned paces (docs/placement.md)."""
    power_e2e_slack_ratio: float = Field(default=0.1, ge=0)
    """Power rule: the E2E slack as a fraction of the fastest predicted E2E; the slack is the smaller of the two."""
    power_energy_band_ratio: float = Field(default=0.2, ge=0)
    """Power rule: request energies within this fraction of the lowest count as equal (marginal J/token is
    learned, noisy, and lower on a busier engine of the same hardware; a smaller gap would herd on noise)."""
    recompute_weight: float = Field(default=1.0, ge=0)
    """Ranking charges each candidate this many times its prefill time for the request, on top of the predicted
    TTFT: the capacity a recomputed prefix takes from later requests (and the KV it duplicates, evicting others'
    prefixes). 1 counts that cost once; 0 ranks by predicted TTFT alone, which on B2B SaaS scattered groups over
    engines until every KV cache was full (docs/placement.md, "Bursts of one prefix")."""
    tie_band_s: float = Field(default=0.005, ge=0)
    """Predicted TTFTs within this many seconds of the best are equal (or within ``tie_band_ratio`` of it, whichever
    is larger): the prompt's prefix hash picks among them, so a slightly higher learned rate does not herd."""
    tie_band_ratio: float = Field(default=0.05, ge=0)
    """The tie band as a fraction of the best predicted TTFT (the error of a learned prefill rate)."""
    affinity_prefix_tokens: int = Field(default=256, gt=0)
    """Depth (tokens) of the prefix whose key breaks ties: requests sharing this much of a prompt go to the same
    one of equally good endpoints. Shorter prompts use their last full block."""
    tie_cache_bound: float | None = Field(default=0.1, ge=0)
    """Bounded load for the tie-break: a tied candidate whose prefix cache holds more than this fraction of its KV
    capacity beyond the emptiest tied candidate's (the store's block counts, from KV events) is left out before the
    prefix hash picks, so that cold prefixes do not pile onto one engine by chance (docs/placement.md, "Ties").
    0: only the emptiest; null: off (the hash alone). Without a count or a KV capacity for every tied candidate the
    hash alone picks."""
    shed_probe_interval_s: float | None = Field(default=5.0, ge=0)
    """A sheddable class that every endpoint misses by learned figures alone is placed on a measured-idle one as a
    probe instead of shed, when its own prefill at the endpoint's prior rate fits the objective (docs/placement.md,
    "Probes instead of shedding"): at most one probe runs on an engine at a time (the probe makes it busy), and this
    router sends at most one there per this many seconds, so an engine that really is that slow serves a sheddable
    class at most one late request per interval. 0: only the one-at-a-time bound; null: no probes (shed on the
    learned figures, as before)."""
    store_timeout_s: float = Field(default=0.25, gt=0)
    """A store read slower than this counts as unavailable: the decision is made degraded, not late."""
    on_error: Literal["fallback", "reject"] = "fallback"
    """When placement itself fails (a bug, never a bad request or the store being down): ``fallback`` serves the
    request on the eligible endpoint with the least work in flight (still counted), ``reject`` answers 503. Either
    way the error is counted and logged at most once a minute."""
    priorities: dict[str, PriorityClass] = Field(default_factory=_default_priorities)
    """Priority classes by name; requests name one (default ``default``)."""

    @model_validator(mode="after")
    def _has_default_priority(self) -> PlacementConfig:
        if DEFAULT_PRIORITY not in self.priorities:
            raise ValueError(f"priorities must define {DEFAULT_PRIORITY!r} (used when a request names no class)")
        return self
