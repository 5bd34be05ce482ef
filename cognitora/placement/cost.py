"""The cost stage: predicted time to first token, in seconds, per endpoint.

    predicted_ttft(e) = queued_prefill_tokens(e) / prefill_rate(e)
                        + max((prompt_tokens - cached_tokens(e)) / prefill_rate(e), short_prompt_prefill_s(e))
                        + decode_penalty_s_per_running * running(e)
                        + slot_wait(e)                 (with ``cost_model``: the larger of it and seat_wait(e))

- ``cached_tokens(e)``: the tier-weighted longest held prefix (speculative entries included) x tokens per key,
  at most the prompt; with ``kv_tiers``, blocks held only in CPU memory or on disk count whole and their reload
  time is added to the TTFT instead (``cognitora.placement.tier_reload``).
- ``queued_prefill_tokens(e)``: prefill tokens the routers dispatched to ``e`` and have not seen a first token for
  (shared across gateway replicas through the store), or, when the engine reports more requests waiting than
  that explains, ``waiting x waiting_request_tokens`` (traffic that bypassed the router). The max, not the sum:
  ``waiting`` includes the routers' own requests. The per-request figure is a prior: the snapshot has no request
  counter to learn the engine's mean uncached prompt from. ``waiting`` is the scraped count less the requests this
  router has seen leave that queue since the scrape (``core.local_inflight.LocalInflight.unqueued``).
- ``prefill_rate(e)``: learned from the engine's metrics and pooled with the engines of its hardware class
  (``rate_pooling``), else the endpoint's configured prior, else its class's median learned rate, else the
  default.
- ``short_prompt_prefill_s(e)``: the prefill seconds a short or mostly cached request took there lately
  (``EndpointSnapshot.short_prompt_prefill_s``), the least its own prefill takes: a step has a floor the rate,
  learned on long prompts, does not show, and an engine slowed down (a fault, throttling) while serving cached
  prompts shows it here first. 0 without a fresh snapshot.
- ``running(e)``: requests running on ``e``, scraped or router-counted, whichever is larger: decode steps share
  the batch with prefill, so each one slows the first token a little.

- ``slot_wait(e)``: on an engine at capacity, the wait for a free slot (docs/placement.md, "Saturation"). At
  capacity means its fresh snapshot shows requests waiting, or KV usage at least ``saturated_kv_usage``. Then

      slot_wait(e) = (requests_ahead + 1) / departure_rate
      requests_ahead = max(waiting, router in-flight requests - running)
      departure_rate = running / mean_service_s                    (Little's law)

  ``mean_service_s`` is what the scraper learned (``EndpointSnapshot.mean_service_s``), else the in-flight
  requests' mean ``max_tokens`` over the learned per-sequence decode speed. With neither, or no fresh snapshot,
  the term is 0: a fleet without metrics is placed as before.

Beside the TTFT, each candidate gets the request's marginal energy there, for the picker's power rule:

    request_joules(e) = joules_per_token(e) x (prompt_tokens - cached_tokens(e) + expected_decode_tokens)

and the request's predicted decode time, for the power rule's E2E bound:

    predicted_decode_s(e) = expected_decode_tokens x (1 / decode_speed(e) + decode_itl_s_per_running)

``decode_speed(e)`` is the per-sequence decode speed the scraper learned from the engine's inter-token latency
(so it is the pace at the engine's recent load: a busier engine decodes each sequence slower), else the
endpoint's ``decode_tokens_per_s`` prior, plus ``decode_itl_s_per_running`` per token for the request's own share
of the batch. An engine with neither gets a stand-in (``estimate_unknown_decode``) for the fastest-E2E figure only.

A cache hit saves the prefill's energy as well as its time. Engines report one energy counter and the scraper
learns one J/token over the tokens computed, uncached prompt and generated together (``kvstate.energy``), so both
kinds of token are charged at that rate, pooled within the hardware class (``rate_pooling``).
``expected_decode_tokens`` is the request's ``max_tokens`` (0 when unset: then only the prefill, which is where
candidates differ most, is compared).

Scraped load figures older than ``snapshot_max_age_s`` are ignored (the learned energy per token is not a load
figure: it is used however old); router counts never are.

With ``cost_model`` (``CognitoraConfig.cost_model``; every placement through ``placement.place``), the slot wait is
at least the seat wait (``placement.seat_wait``: an engine whose seats the requests in flight there fill, whatever
its gauges said at the last scrape), and the prediction also carries what long contexts cost
(``placement.long_context``: attention, the prefill's steps slowed by the context resident there, the wait for KV
room), and then the endpoint's learned feedback factor (``cognitora.ttft_feedback``): ``(ttft + floor) x factor -
floor``. The request's own prefill is then priced at the attention-free rate (``long_context.attention_free_rate``:
the learned rate with the attention of the contexts it was learned at divided back out), its attention added by
``long_context``; the queue ahead stays at the learned rate, which is what the engine's mix of prompts runs at.

Candidates are ranked by ``predicted_ttft(e) + recompute_weight x (prompt_tokens - cached_tokens(e)) / prefill_rate(e)``
(``request_cost_s``: this request's own seconds) + the decode-interference and prefill-stall charges
(``externality_s``: seconds of the other requests there, summed), together ``ranking_cost_s``. A positive recompute
weight charges the capacity a recomputed prefix takes from later requests, which the request's own TTFT does not
see; the decode-interference charge is the decode slowdown the placement causes, its own and the running
requests'; the prefill-stall charge is the running requests' wait for its uncached prefill. Rules that take a share
of a cost (the tie band) take it of ``request_cost_s`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cognitora.config import CostModelConfig, EndpointConfig, KvTiersConfig, PlacementConfig
from cognitora.decision import CandidateScore
from cognitora.placement.estimate_basis import estimate_basis
from cognitora.placement.long_context import (
    LongContextCost,
    attention_factor,
    engine_priors,
    kv_capacity_tokens,
    long_context_cost,
)
from cognitora.placement.seat_wait import departure_wait_s, engine_clock_rate, seat_wait_s
from cognitora.placement.state import FleetState, SeatProgress
from cognitora.placement.tier_reload import priced_prefix
from cognitora.ttft_feedback import corrected_ttft_s
from kvstate.store import EndpointSnapshot, InFlight

__all__ = [
    "by_ranking_cost",
    "estimate_unknown_decode",
    "excluded_score",
    "externality_s",
    "fewest_uncached_tokens",
    "fresh_snapshot",
    "ranking_cost_s",
    "request_cost_s",
    "score_endpoint",
]


def fresh_snapshot(endpoint_id: str, state: FleetState, params: PlacementConfig) -> EndpointSnapshot | None:
    """The endpoint's snapshot if it is recent enough to trust its load figures."""
    snap = state.snapshots.get(endpoint_id)
    if snap is None or state.now - snap.last_seen > params.snapshot_max_age_s:
        return None
    return snap


def prefill_rate(
    endpoint: EndpointConfig,
    snap: EndpointSnapshot | None,
    params: PlacementConfig,
    pooled_rate: float | None = None,
) -> float:
    """``pooled_rate`` (its hardware class's, ``rate_pooling.pooled_prefill_rates``), else learned, else the
    endpoint's prior, else the default."""
    if pooled_rate is not None:
        return pooled_rate
    if snap is not None and snap.prefill_tokens_per_s > 0:
        return snap.prefill_tokens_per_s
    if endpoint.prefill_tokens_per_s is not None:
        return endpoint.prefill_tokens_per_s
    return params.default_prefill_tokens_per_s


def joules_per_token(
    endpoint: EndpointConfig, snap: EndpointSnapshot | None, pooled: float | None = None
) -> float | None:
    """``pooled`` (its hardware class's, ``rate_pooling.pooled_joules_per_token``), else learned by the scraper from
    the power meter, else the configured prior, else unknown.

    ``snap`` is the endpoint's latest snapshot however old: energy per token is a property of the hardware, not
    a load figure, so what was learned stays true while the scraper is away."""
    if pooled is not None:
        return pooled
    if snap is not None and snap.joules_per_token is not None and snap.joules_per_token > 0:
        return snap.joules_per_token
    return endpoint.joules_per_token


def decode_speed(endpoint: EndpointConfig, snap: EndpointSnapshot | None) -> float | None:
    """Per-sequence decode speed (tokens/s): learned from the engine's inter-token latency at its recent load, else
    the configured prior, else unknown."""
    if snap is not None and snap.decode_tokens_per_s > 0:
        return snap.decode_tokens_per_s
    return endpoint.decode_tokens_per_s


def predicted_decode_s(
    endpoint: EndpointConfig, snap: EndpointSnapshot | None, decode_tokens: int, params: PlacementConfig
) -> float | None:
    """Seconds to decode ``decode_tokens`` here at the engine's current pace, slowed by this request's own share of
    the batch (``decode_itl_s_per_running``); 0 for none, None when the pace is unknown."""
    if decode_tokens <= 0:
        return 0.0
    speed = decode_speed(endpoint, snap)
    return None if speed is None else decode_tokens * (1.0 / speed + params.decode_itl_s_per_running)


def predicted_itl_s(
    snap: EndpointSnapshot | None, added_context_tokens: float, kv_read_s_per_token: float
) -> float | None:
    """The inter-token latency a request placed here would see: the engine's as it measures it now (prefill
    chunks sharing its steps included), plus what the context sent there since that measurement and this request's
    own add to every step (``kv_read_s_per_token`` a token). None when it is not measured, or nothing runs there
    (an idle engine decodes at its floor, and the last busy window's figure no longer says anything)."""
    if snap is None or snap.itl_s is None or snap.running <= 0:
        return None
    return snap.itl_s + added_context_tokens * kv_read_s_per_token


def estimate_unknown_decode(ranked: list[CandidateScore], decode_tokens: int, params: PlacementConfig) -> None:
    """Give candidates with no known decode pace a stand-in, in place: the fastest known engine's inter-token
    latency with its running sequences taken out, plus this one's (``decode_itl_s_per_running`` each).

    Without it, a power rule packing onto one engine compares that engine's E2E with itself only: the idle engines
    it packs away from never decode, so their pace is never learned."""
    if decode_tokens <= 0:
        return
    k = params.decode_itl_s_per_running
    known = [c for c in ranked if c.predicted_decode_s is not None]
    if not known or len(known) == len(ranked):
        return
    base = min(
        max(0.0, c.predicted_decode_s / decode_tokens - k * (c.running + 1)) for c in known if c.predicted_decode_s
    )
    for i, c in enumerate(ranked):
        if c.predicted_decode_s is None:
            ranked[i] = replace(
                c, predicted_decode_s=decode_tokens * (base + k * (c.running + 1)), decode_estimated=True
            )


def mean_service_s(snap: EndpointSnapshot, flight: InFlight) -> float:
    """Seconds a request holds a slot on this engine: learned by the scraper, else the routers' in-flight requests'
    mean ``max_tokens`` at the learned per-sequence decode speed, else 0 (unknown)."""
    if snap.mean_service_s is not None and snap.mean_service_s > 0:
        return snap.mean_service_s
    if snap.decode_tokens_per_s > 0 and flight.requests > 0 and flight.decode_tokens > 0:
        return flight.decode_tokens / flight.requests / snap.decode_tokens_per_s
    return 0.0


def slot_wait_s(
    snap: EndpointSnapshot | None, flight: InFlight, params: PlacementConfig, progress: SeatProgress | None = None
) -> float:
    """How long a new request waits for a free slot (seconds): 0 unless the engine is at capacity.

    At capacity (requests waiting, or KV usage at least ``saturated_kv_usage``) it is admitted only after the
    requests ahead of it and then one more leave the batch, at the times ``seat_wait.departure_wait_s`` reads from
    the seat holders' ages (``progress``), or at ``running / mean_service_s`` a second (Little's law) without them.
    Requests ahead: the engine's waiting count, or the routers' in-flight requests beyond what the engine runs when
    that is more (dispatched since the scrape, not yet visible in ``waiting``).
    """
    if snap is None:
        return 0.0
    if snap.waiting <= 0 and snap.kv_usage < params.saturated_kv_usage:
        return 0.0
    service = mean_service_s(snap, flight)
    if service <= 0:
        return 0.0
    ahead = max(snap.waiting, flight.requests - snap.running)
    return departure_wait_s(ahead + 1, snap.running, service, progress, engine_clock_rate(snap))


def fewest_uncached_tokens(
    endpoints: Sequence[EndpointConfig],
    prompt_tokens: int,
    tokens_per_key: int,
    state: FleetState,
    tiers: KvTiersConfig | None,
) -> float:
    """The fewest prompt tokens any of ``endpoints`` would prefill (its cached prefix priced as ``score_endpoint``
    prices it): that prefill runs wherever the request goes."""
    cached = (priced_prefix(state.matches.get(e.id), prompt_tokens, tokens_per_key, tiers)[0] for e in endpoints)
    return max(0.0, prompt_tokens - max(cached, default=0.0))


def score_endpoint(
    endpoint: EndpointConfig,
    prompt_tokens: int,
    tokens_per_key: int,
    state: FleetState,
    params: PlacementConfig,
    decode_tokens: int = 0,
    tiers: KvTiersConfig | None = None,
    cost_model: CostModelConfig | None = None,
    pooled_rate: float | None = None,
    fewest_uncached_tokens: float = 0.0,
    pooled_joules_per_token: float | None = None,
) -> CandidateScore:
    """``cost_model``: the long-context terms and feedback (``CognitoraConfig.cost_model``); None leaves them out,
    which is the linear model above. ``pooled_rate``: the rate of the endpoint's hardware class, when it is priced
    at that (``rate_pooling.pooled_prefill_rates``, given the same ``cost_model``: then free of attention);
    ``pooled_joules_per_token`` likewise for energy
    (``rate_pooling.pooled_joules_per_token``). ``fewest_uncached_tokens``: the fewest prompt tokens any
    candidate would prefill (``fewest_uncached_tokens``); the prefill-stall charge counts only what this endpoint
    recomputes beyond that."""
    snap = fresh_snapshot(endpoint.id, state, params)
    flight = state.inflight.get(endpoint.id, InFlight())
    match = state.matches.get(endpoint.id)

    cached, reload_s = priced_prefix(match, prompt_tokens, tokens_per_key, tiers)
    queued = float(flight.prefill_tokens)
    running = flight.requests
    if snap is not None:
        queued = max(queued, float(snap.waiting * params.waiting_request_tokens))
        running = max(running, snap.running)
    rate = prefill_rate(endpoint, snap, params, pooled_rate)
    decode_penalty = params.decode_penalty_s_per_running * running
    progress = state.seat_progress.get(endpoint.id)
    slot_wait = 0.0
    if params.slot_wait_weight:
        slot_wait = params.slot_wait_weight * slot_wait_s(snap, flight, params, progress)
    priors = engine_priors(endpoint, snap, cost_model) if cost_model is not None else None
    if priors is not None and cost_model is not None and cost_model.seat_wait_weight > 0:
        service = mean_service_s(snap, flight) if snap is not None else 0.0
        seat_wait = cost_model.seat_wait_weight * seat_wait_s(priors.seats, flight, snap, service, progress)
        slot_wait = max(slot_wait, seat_wait)  # the same wait, seen two ways: the larger is the better-informed
    # With the long-context terms, the request's own prefill is its linear part at the attention-free rate plus its
    # attention (long_context_cost): the learned rate already holds the attention of the contexts it was learned at.
    free_rate = rate
    if priors is not None:
        learned_at = snap.prefill_rate_prompt_tokens if snap is not None and snap.prefill_tokens_per_s > 0 else 0.0
        factor = attention_factor(learned_at, priors.attention_context_tokens)
        if pooled_rate is not None:  # pooled free of attention (rate_pooling, given the cost model)
            free_rate, rate = rate, rate / factor
        else:
            free_rate = rate * factor
    uncached_prefill_s = (prompt_tokens - cached) / free_rate
    short_floor_s = snap.short_prompt_prefill_s if snap is not None else 0.0
    floor_binds = short_floor_s > uncached_prefill_s
    own_prefill_s = short_floor_s if floor_binds else uncached_prefill_s
    ttft = queued / rate + own_prefill_s + reload_s + decode_penalty + slot_wait
    extra = LongContextCost()
    bias = 1.0
    kv_read_s_per_token = 0.0
    if cost_model is not None and priors is not None:
        kv_read_s_per_token = priors.kv_read_s_per_token
        extra = long_context_cost(
            priors,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            queued_tokens=queued,
            running=running,
            counted_resident=state.context_tokens.get(endpoint.id, 0.0),
            resident_since_snapshot=state.context_since_snapshot.get(endpoint.id, 0.0),
            counted_kv=state.kv_tokens.get(endpoint.id, state.context_tokens.get(endpoint.id, 0.0)),
            kv_since_snapshot=state.kv_since_snapshot.get(
                endpoint.id, state.context_since_snapshot.get(endpoint.id, 0.0)
            ),
            decode_tokens=decode_tokens,
            fewest_uncached_tokens=fewest_uncached_tokens,
            rate=free_rate,
            snap=snap,
            mean_service_s=mean_service_s(snap, flight) if snap is not None else 0.0,
            saturated_kv_usage=params.saturated_kv_usage,
            model=cost_model,
        )
        ttft += extra.ttft_s
        bias = state.ttft_bias.get(endpoint.id, 1.0)
        if bias != 1.0:
            ttft = corrected_ttft_s(ttft, bias, cost_model.feedback.floor_s)
    recompute_penalty = params.recompute_weight * (prompt_tokens - cached) / rate
    jpt = joules_per_token(endpoint, state.snapshots.get(endpoint.id), pooled_joules_per_token)
    request_joules = None if jpt is None else jpt * (prompt_tokens - cached + decode_tokens)
    return CandidateScore(
        endpoint=endpoint.id,
        cached_tokens=cached,
        queued_prefill_tokens=queued,
        prefill_tokens_per_s=rate,
        predicted_ttft_s=ttft,
        decode_penalty_s=decode_penalty,
        slot_wait_s=slot_wait,
        recompute_penalty_s=recompute_penalty,
        joules_per_token=jpt,
        request_joules=request_joules,
        predicted_decode_s=predicted_decode_s(endpoint, snap, decode_tokens, params),
        running=running,
        predicted_itl_s=predicted_itl_s(
            snap, state.context_since_snapshot.get(endpoint.id, 0.0) + prompt_tokens, kv_read_s_per_token
        ),
        basis=estimate_basis(endpoint, snap, params),
        reload_s=reload_s,
        short_prompt_floor_s=short_floor_s if floor_binds else 0.0,
        attention_s=extra.attention_s,
        interference_s=extra.interference_s,
        kv_pressure_s=extra.kv_pressure_s,
        decode_interference_s=extra.decode_interference_s,
        prefill_stall_s=extra.prefill_stall_s,
        resident_tokens=extra.resident_tokens,
        ttft_bias_factor=bias,
        cache_held_tokens=None if snap is None or snap.cached_blocks is None else snap.cached_blocks * tokens_per_key,
        kv_capacity_tokens=kv_capacity_tokens(endpoint, snap, cost_model),
        clock_rate=engine_clock_rate(snap) if snap is not None else 0.0,  # no snapshot: its clock is not known
    )


def excluded_score(endpoint: EndpointConfig, reason: str, state: FleetState, params: PlacementConfig) -> CandidateScore:
    """A filtered-out endpoint, shown in the explanation with what was known about it."""
    snap = fresh_snapshot(endpoint.id, state, params)
    return CandidateScore(
        endpoint=endpoint.id,
        cached_tokens=0.0,
        queued_prefill_tokens=float(state.inflight.get(endpoint.id, InFlight()).prefill_tokens),
        prefill_tokens_per_s=prefill_rate(endpoint, snap, params),
        predicted_ttft_s=float("inf"),
        excluded=reason,
    )


def request_cost_s(score: CandidateScore) -> float:
    """This request's own seconds: its predicted TTFT plus the recompute charge (its prefill over the same rate).

    Per-request seconds, so a *share* of it means something (the picker's tie band is one); ``externality_s`` is
    not, and keeping the two apart is what stops a relative rule from inheriting the externality's scale."""
    return score.predicted_ttft_s + score.recompute_penalty_s


def externality_s(score: CandidateScore) -> float:
    """Seconds this placement costs the *other* requests on the endpoint: the decode-interference and prefill-stall
    charges (``cost_model``). They sum over every running request, so under load they are tens to hundreds of
    seconds, nearly equal across candidates: compare them by difference, never by ratio."""
    return score.decode_interference_s + score.prefill_stall_s


def ranking_cost_s(score: CandidateScore) -> float:
    """What ranking minimizes: the request's own cost plus the externality it imposes."""
    return request_cost_s(score) + externality_s(score)


def by_ranking_cost(score: CandidateScore) -> tuple[float, str]:
    """Sort key: lowest ranking cost first, then by name (only for a stable listing: the picker breaks ties)."""
    return (ranking_cost_s(score), score.endpoint)
