"""Placing a request as a prefill/decode pair, or whole, whichever is predicted faster. Pure, like ``placement``.

Whole placement is the ordinary pipeline run over the endpoints that can take a request whole: ``role: both``
engines, and ``role: decode`` ones, whose sidecar prefills locally when it is sent no prefill endpoint (as llm-d's
does). A pair (p, d) is priced in the same seconds:

    pair_ttft(p, d) = prefill_ttft(p) + transfer(d) + admission(d)
    prefill_ttft(p) = cost.score_endpoint(p): p's queued prefill and the prompt tokens p has not cached
    transfer(d)     = link_latency_s + (prompt_tokens - cached_tokens(d)) x kv_bytes_per_token x 8 / link_gbps
    admission(d)    = cost.score_endpoint(d) for a request with no prompt: d's queued prefill, decode load and
                      slot wait (a request holds prompt + output tokens of KV on d for its whole decode)

Both legs are priced as whole placement prices a candidate (``placement.place``): KV tiers, the long-context cost
model and its TTFT feedback, pooled prefill rates. Otherwise a pair's prefill was linear in tokens while the whole
placement it competes with paid attention and KV pressure, and long prompts looked cheaper split than they are.
The prefill leg decodes nothing (its engine stops at the first token), so its decode charges are 0. The decode
leg's KV-pressure term does not see the KV arriving by transfer, only the output tokens.

``p`` ranges over the ``role: prefill`` endpoints, ``d`` over the ``role: decode`` ones; both go through the same
filters (health, candidates, KV headroom: a decode endpoint near KV exhaustion is out like any other). Prefill
endpoints whose predicted TTFTs tie are broken as whole placement breaks ties (``placement.picker``, rule 3): the
prompt's prefix key by rendezvous hashing, among those whose prefix cache is within ``placement.tie_cache_bound`` of
the emptiest's (``affinity.within_cache_bound``). With
``disaggregation.whole_on_decode: false`` only ``role: both`` endpoints compete whole (classic P/D). The two
halves are independent, so the best pair is the best prefill with the best decode. The pair is placed when it
beats the best whole placement by more than ``disaggregation.min_gain_s``; a short prompt, or one mostly cached on
a decode endpoint, is placed whole because its predicted cost says so (llm-d's ``prefix-based-pd-decider`` splits
on a fixed count of uncached tokens instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from cognitora.config import DEFAULT_PRIORITY, CognitoraConfig, EndpointConfig, ModelConfig, Role
from cognitora.decision import CandidateScore, Decision, PrefillLeg
from cognitora.placement import FleetState, place
from cognitora.placement.affinity import affinity_key, rendezvous_pick, within_cache_bound
from cognitora.placement.cost import by_ranking_cost, fewest_uncached_tokens, ranking_cost_s, score_endpoint
from cognitora.placement.filters import FilterContext, run_filters
from cognitora.placement.picker import tie_band_s
from cognitora.placement.rate_pooling import pooled_prefill_rates
from cognitora.request import RouteRequest
from kvstate.prompt import PromptKeys

__all__ = ["PairCost", "best_pair", "place_with_pairs", "transfer_s", "uses_pairs"]


def uses_pairs(model: ModelConfig) -> bool:
    """Whether the model is served disaggregated: it lists at least one ``role: prefill`` endpoint."""
    return any(e.role is Role.PREFILL for e in model.endpoints)


def transfer_s(config: CognitoraConfig, model: ModelConfig, tokens: float) -> float:
    """Seconds to move ``tokens`` tokens of KV from a prefill endpoint to a decode endpoint."""
    link = config.disaggregation
    per_token = model.kv_bytes_per_token or link.kv_bytes_per_token
    return link.link_latency_s + max(0.0, tokens) * per_token * 8.0 / (link.link_gbps * 1e9)


@dataclass(frozen=True)
class PairCost:
    """The best pair for a request, in seconds."""

    prefill: CandidateScore
    decode: EndpointConfig
    decode_cached_tokens: float
    transfer_s: float
    admission_s: float

    @property
    def ttft_s(self) -> float:
        return self.prefill.predicted_ttft_s + self.transfer_s + self.admission_s


def _pool(
    model: ModelConfig, role: Role, req: RouteRequest, state: FleetState, config: CognitoraConfig
) -> list[EndpointConfig]:
    kept = run_filters(model.endpoints, FilterContext(req, role, state, config.placement, config.cost_model)).kept
    return [e for e in kept if e.role is role]


def best_pair(
    req: RouteRequest, prompt: PromptKeys, config: CognitoraConfig, model: ModelConfig, state: FleetState
) -> PairCost | None:
    """The cheapest (prefill, decode) pair for ``req``, or None when either pool has no eligible endpoint."""
    params = config.placement
    prefills = _pool(model, Role.PREFILL, req, state, config)
    decodes = _pool(model, Role.DECODE, req, state, config)
    if not prefills or not decodes:
        return None
    n, per_key = prompt.prompt_tokens, prompt.tokens_per_key
    tiers, cost_model = config.kv_tiers, config.cost_model
    pooled = pooled_prefill_rates(model.endpoints, state, params, config.cost_model)
    fewest = fewest_uncached_tokens(prefills, n, per_key, state, tiers)
    scored = sorted(
        (
            score_endpoint(
                e,
                n,
                per_key,
                state,
                params,
                0,
                tiers,
                cost_model=cost_model,
                pooled_rate=pooled.get(e.id),
                fewest_uncached_tokens=fewest,
            )
            for e in prefills
        ),
        key=by_ranking_cost,
    )
    best = scored[0]
    tied = [c for c in scored if ranking_cost_s(c) <= ranking_cost_s(best) + tie_band_s(best, params)]
    # Equal prefill endpoints: the prompt's prefix picks, so requests sharing it converge where it is cached; as in
    # whole placement, not on one whose prefix cache is much fuller than the emptiest's (bounded loads), or cold
    # prefixes that happen to hash alike pile onto one prefill engine and evict each other while another idles.
    hashed = within_cache_bound(tied, params.tie_cache_bound)
    key = affinity_key(prompt, req.request_id, params.affinity_prefix_tokens, cost_model.affinity_prompt_share)
    prefill = rendezvous_pick(hashed, key)
    decode_tokens = req.max_tokens or 0
    options: list[tuple[float, str, EndpointConfig, float, float, float]] = []
    for d in decodes:
        cached = score_endpoint(d, n, per_key, state, params, tiers=tiers).cached_tokens
        admission = score_endpoint(
            d, 0, per_key, state, params, decode_tokens, tiers, cost_model=cost_model, pooled_rate=pooled.get(d.id)
        ).predicted_ttft_s
        move = transfer_s(config, model, n - cached)
        options.append((move + admission, d.id, d, cached, move, admission))
    _, _, decode, cached, move, admission = min(options, key=lambda o: (o[0], o[1]))
    return PairCost(prefill, decode, cached, move, admission)


def place_with_pairs(req: RouteRequest, prompt: PromptKeys, config: CognitoraConfig, state: FleetState) -> Decision:
    """``placement.place`` for a model with prefill endpoints: the best whole placement, or the best pair when it is
    predicted faster by more than ``disaggregation.min_gain_s`` (or when it alone meets the priority's SLO)."""
    model = config.model(req.model)
    assert model is not None and uses_pairs(model), "only for a model served disaggregated"
    whole_role = Role.DECODE if config.disaggregation.whole_on_decode else Role.BOTH
    whole = place(req, prompt, config, state, role=whole_role)
    if whole.rejection is not None and whole.rejection.status not in (429, 503):
        return whole  # the request itself is wrong (unknown priority class): a pair will not fix it
    pair = best_pair(req, prompt, config, model, state)
    if pair is None:
        # No pair possible: whole, on a decode endpoint too (its sidecar prefills locally) rather than refused.
        return whole if whole_role is Role.DECODE else place(req, prompt, config, state, role=Role.DECODE)
    whole_ttft = None if whole.endpoint is None else whole.predicted_ttft_s
    pclass = config.placement.priorities.get(req.identity.priority or DEFAULT_PRIORITY)
    slo = float("inf") if pclass is None else pclass.ttft_slo_s
    if whole_ttft is not None:
        if pair.ttft_s + config.disaggregation.min_gain_s >= whole_ttft:
            return whole
    elif pair.ttft_s > slo and whole.rejection is not None and whole.rejection.status == 429:
        return whole  # shed either way: the pair misses the SLO too
    return _pair_decision(whole, pair, whole_ttft, model)


def _pair_decision(whole: Decision, pair: PairCost, whole_ttft: float | None, model: ModelConfig) -> Decision:
    decode = pair.decode
    leg = PrefillLeg(
        endpoint=pair.prefill.endpoint,
        url=next(e.url for e in model.endpoints if e.id == pair.prefill.endpoint),
        cached_tokens=pair.prefill.cached_tokens,
        prefill_s=pair.prefill.predicted_ttft_s,
        transfer_s=pair.transfer_s,
        admission_s=pair.admission_s,
        whole_ttft_s=whole_ttft,
    )
    runner_up = _score_of(whole.candidates, whole.endpoint)
    uncached = whole.prompt_tokens - pair.prefill.cached_tokens
    reason = (
        f"split: prefill on {leg.endpoint} ({uncached:.0f} uncached tokens) + KV transfer "
        f"{pair.transfer_s * 1000:.1f} ms to {decode.id}: predicted TTFT {pair.ttft_s * 1000:.1f} ms"
        + ("" if whole_ttft is None else f" vs {whole_ttft * 1000:.1f} ms whole on {whole.endpoint}")
    )
    return replace(
        whole,
        endpoint=decode.id,
        url=decode.url,
        predicted_cached_tokens=pair.prefill.cached_tokens,
        predicted_ttft_s=pair.ttft_s,
        runner_up=runner_up,
        fallbacks=tuple(e for e in (whole.endpoint, *whole.fallbacks) if e is not None and e != decode.id),
        reason=reason,
        rejection=None,
        saturated=False,
        prefill=leg,
    )


def _score_of(candidates: Sequence[CandidateScore], endpoint: str | None) -> CandidateScore | None:
    return next((c for c in candidates if c.endpoint == endpoint), None)
