"""What long contexts cost an engine, in seconds: attention, decode interference by resident context, KV capacity.

The base cost model (``cost``) prices prefill as linear in tokens and the engine's running requests by their count.
Engines pay more than that for long contexts (sim/cognitora_sim/profiles.py models the same step arithmetic, and
docs/sim.md cites where it comes from):

- **Attention.** Prefilling the tokens from offset ``c`` to ``p`` computes ``(p^2 - c^2) / 2`` query-key pairs
  beside ``p - c`` tokens of linear layers. With ``L`` the context length at which a token's attention costs as
  much as its linear layers (``attention_context_tokens``, a property of the model's shape):

      attention_s = (p^2 - c^2) / (2 L) / prefill_rate

  ``prefill_rate`` here is the linear-layer rate, free of attention. A rate learned from an engine's counters is
  not: its prefill times included the attention of the contexts it served (``m = p + c`` per request,
  ``EndpointSnapshot.prefill_rate_prompt_tokens``), so it is ``rate_0 / (1 + m / (2 L))``. Adding the term above
  to it counted the attention twice: a 22k-token prompt on an engine learned on 22k-token prompts was predicted
  1.46x its prefill with the shipped ``L``. ``attention_free_rate`` divides that factor back out, so the term
  prices only the difference between the request's context and the one the rate was learned at.

- **Decode interference.** Every scheduler step reads the KV of every running request's context, so a step on an
  engine holding ``R`` resident context tokens takes ``R x kv_read_s_per_token`` longer. A prefill of ``N`` tokens
  (the queue ahead plus this request's uncached part) runs ``ceil(N / (step_tokens - running))`` steps:

      interference_s = prefill_steps x R x kv_read_s_per_token            (part of the predicted TTFT)

  After its first token the request decodes ``d`` tokens (its ``max_tokens``): its own steps read ``R``, and its
  context ``x`` slows each of the ``running`` requests' steps as long as it decodes. Ranking charges both:

      decode_interference_s = d x kv_read_s_per_token x (R + running x x)   (ranking only, like the recompute charge)

- **Prefill stall.** An engine runs a prefill in the same steps as its decodes (chunked prefill), and a step with
  a prefill chunk is compute bound: every decoding request there waits for the chunk. The prefill of the tokens no
  engine holds (``u_min``, the fewest uncached tokens any candidate offers) stalls someone wherever it runs; what
  a placement chooses is the rest, the prefix it recomputes although another engine holds it. That part slows each
  of the ``running`` requests by its duration:

      prefill_stall_s = running x ((u - u_min) / prefill_rate + its attention)   (ranking only)

  Without it, ranking priced what a request's decode costs its neighbours but not what its recomputed prefix costs
  them, and a cache miss looked cheap next to a few more running requests: on B2B SaaS a 6,000-token miss stalls
  the engine's 30-90 running requests ~0.45 s each, against the ~2.7 s the decode charge put on 4 more running
  requests. Ranking moved groups off their cached engines until every KV cache was full. Charging the whole
  prefill instead (``u``, not ``u - u_min``) also drew long, uncached prompts to the engines with the fewest
  decoders over those with the shortest queue: TTFT p90 +1.1-1.7 s on long context at 6 rps.

- **KV capacity.** The request's new blocks (uncached prompt plus ``d``) must fit beside ``R`` in the engine's
  ``kv_capacity_tokens`` (up to ``placement.saturated_kv_usage`` of it). What does not fit waits for resident
  context to leave (at ``R / mean_service_s`` tokens a second), or, with no service time known, is recomputed
  after a preemption (``overflow / prefill_rate``):

      kv_pressure_s = overflow x mean_service_s / R    or    overflow / prefill_rate

For the steps' reads (interference, decode) ``R`` is the context resident there: the engine's fresh
``kv_usage x kv_capacity_tokens`` plus the context the routers dispatched there since that snapshot, or the
routers' own count (each in-flight request's prompt plus half its ``max_tokens``) when that is larger. Every
request reads its whole context, shared prefix included. For the KV capacity, ``R`` is the KV *held*: the same
reading, but the routers count each request's uncached prompt plus half its ``max_tokens``, since a prefix the
running requests share is one copy of its blocks. (Counting it per request, 140 requests of one 2,048-token
system prompt read as 340k tokens on an engine a third full, and flow control held every request of the 32 x 32
ladder's 150-rps stage "for KV room" until it was shed: docs/flow_control.md.) Everything here is a pure
function of its arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cognitora.config import CostModelConfig, EndpointConfig
from kvstate.store import EndpointSnapshot

__all__ = [
    "EngineCostPriors",
    "LongContextCost",
    "attention_factor",
    "attention_free_rate",
    "engine_priors",
    "kv_capacity_tokens",
    "long_context_cost",
]


@dataclass(frozen=True)
class EngineCostPriors:
    """An engine's long-context coefficients, resolved: its own setting, else learned, else the fleet prior."""

    step_tokens: int
    attention_context_tokens: float
    kv_read_s_per_token: float
    kv_capacity_tokens: int | None
    seats: int | None = None
    """Requests it runs at once (``max_num_seqs``); None: not known."""


@dataclass(frozen=True)
class LongContextCost:
    """The long-context terms for one request on one engine (seconds; tokens for ``resident_tokens``)."""

    resident_tokens: float = 0.0
    attention_s: float = 0.0
    interference_s: float = 0.0
    kv_pressure_s: float = 0.0
    decode_interference_s: float = 0.0
    prefill_stall_s: float = 0.0

    @property
    def ttft_s(self) -> float:
        """The part of the predicted TTFT: attention, step interference and the wait for KV room."""
        return self.attention_s + self.interference_s + self.kv_pressure_s


def engine_priors(endpoint: EndpointConfig, snap: EndpointSnapshot | None, model: CostModelConfig) -> EngineCostPriors:
    """The endpoint's coefficients: its ``cost`` setting, else (capacity and seats only) what the scraper learned,
    else the fleet's ``cost_model.priors``."""
    own, fleet = endpoint.cost, model.priors
    capacity = kv_capacity_tokens(endpoint, snap, model)
    seats = own.max_num_seqs
    if seats is None and snap is not None and snap.seats > 0:
        seats = snap.seats
    if seats is None:
        seats = fleet.max_num_seqs
    return EngineCostPriors(
        step_tokens=own.max_num_batched_tokens or fleet.max_num_batched_tokens or 8192,
        attention_context_tokens=own.attention_context_tokens or fleet.attention_context_tokens or math.inf,
        kv_read_s_per_token=_first(own.kv_read_s_per_token, fleet.kv_read_s_per_token, 0.0),
        kv_capacity_tokens=capacity,
        seats=seats,
    )


def kv_capacity_tokens(
    endpoint: EndpointConfig, snap: EndpointSnapshot | None, model: CostModelConfig | None
) -> int | None:
    """Tokens the endpoint's KV cache holds: its ``cost`` setting, else what the scraper read, else the fleet's
    prior (``model``'s; None: no prior); None when none says."""
    capacity = endpoint.cost.kv_capacity_tokens
    if capacity is None and snap is not None and snap.kv_capacity_tokens > 0:
        capacity = snap.kv_capacity_tokens
    if capacity is None and model is not None:
        capacity = model.priors.kv_capacity_tokens
    return capacity


def _first(*values: float | None) -> float:
    for v in values:
        if v is not None:
            return v
    return 0.0


def attention_factor(context_tokens: float, attention_context_tokens: float) -> float:
    """How much longer than its linear layers alone a prefill takes at ``context_tokens`` (``p + c`` per
    request): ``1 + m / (2 L)``."""
    if context_tokens <= 0 or math.isinf(attention_context_tokens):
        return 1.0
    return 1.0 + context_tokens / (2.0 * attention_context_tokens)


def attention_free_rate(rate: float, learned_context_tokens: float, attention_context_tokens: float) -> float:
    """The linear-layer rate behind ``rate``, learned on prefills at ``learned_context_tokens`` (``p + c``) whose
    times included their attention (0: not known, taken as free of it)."""
    return rate * attention_factor(learned_context_tokens, attention_context_tokens)


def attention_s(cached_tokens: float, prompt_tokens: float, rate: float, context_tokens: float) -> float:
    """Seconds of causal attention for prefilling tokens ``cached_tokens`` .. ``prompt_tokens``."""
    if prompt_tokens <= cached_tokens or math.isinf(context_tokens):
        return 0.0
    return (prompt_tokens * prompt_tokens - cached_tokens * cached_tokens) / (2.0 * context_tokens) / rate


def prefill_steps(tokens: float, step_tokens: int, running: int) -> int:
    """Scheduler steps a prefill of ``tokens`` takes when ``running`` decoding requests take one token each."""
    if tokens <= 0:
        return 0
    return math.ceil(tokens / max(step_tokens // 8, step_tokens - running))


def resident_tokens(
    counted: float, snap: EndpointSnapshot | None, capacity: int | None, since_snapshot: float = 0.0
) -> float:
    """Context tokens resident in the engine's running requests: the engine's KV usage times its capacity plus
    what the routers dispatched there since that snapshot, or the routers' whole count when that is more.

    Without the dispatches since the snapshot, every request placed between two scrapes (a second: several
    long prompts) saw the same figure and went to the engine that looked emptiest at the last scrape."""
    if snap is None or capacity is None:
        return counted
    return max(counted, snap.kv_usage * capacity + since_snapshot)


def long_context_cost(
    priors: EngineCostPriors,
    *,
    prompt_tokens: int,
    cached_tokens: float,
    queued_tokens: float,
    running: int,
    counted_resident: float,
    resident_since_snapshot: float,
    counted_kv: float,
    kv_since_snapshot: float,
    decode_tokens: int,
    fewest_uncached_tokens: float,
    rate: float,
    snap: EndpointSnapshot | None,
    mean_service_s: float,
    saturated_kv_usage: float,
    model: CostModelConfig,
) -> LongContextCost:
    """The long-context terms of placing this request here (see the module docstring)."""
    resident = resident_tokens(counted_resident, snap, priors.kv_capacity_tokens, resident_since_snapshot)
    uncached = max(0.0, prompt_tokens - cached_tokens)
    attention = attention_s(cached_tokens, prompt_tokens, rate, priors.attention_context_tokens)
    k = priors.kv_read_s_per_token
    steps = prefill_steps(queued_tokens + uncached, priors.step_tokens, running)
    interference = steps * resident * k
    decode = decode_tokens * k * (resident + running * prompt_tokens) if decode_tokens > 0 else 0.0
    # The recomputed prefix runs from what this engine holds to what the best-cached candidate holds.
    best_cached = prompt_tokens - fewest_uncached_tokens
    recomputed = max(0.0, best_cached - cached_tokens)
    stall = running * (
        recomputed / rate + attention_s(cached_tokens, best_cached, rate, priors.attention_context_tokens)
    )
    pressure = 0.0
    if priors.kv_capacity_tokens is not None and model.kv_pressure_weight > 0:
        # The KV held, not the context read: a prefix the running requests share is one copy of its blocks.
        held = resident_tokens(counted_kv, snap, priors.kv_capacity_tokens, kv_since_snapshot)
        room = priors.kv_capacity_tokens * saturated_kv_usage - held
        overflow = uncached + decode_tokens - max(0.0, room)
        if overflow > 0:
            # Held KV leaves at held / mean_service_s tokens a second; else recompute after preemption.
            waits = mean_service_s > 0 and held > 0
            pressure = overflow * mean_service_s / held if waits else overflow / rate
            pressure *= model.kv_pressure_weight
    return LongContextCost(
        resident_tokens=resident,
        attention_s=attention,
        interference_s=interference,
        kv_pressure_s=pressure,
        decode_interference_s=model.decode_interference_weight * decode,
        prefill_stall_s=model.prefill_stall_weight * stall,
    )
