"""Placement: a request and the fleet's state in, a ``Decision`` out. Pure: no I/O, no clock, no side effects.

The pipeline (style.md habit 4): filters (``filters``) -> predicted TTFT in seconds (``cost``) -> picker with the
priority SLO and power rules (``picker``). docs/placement.md describes the model and every weight.
"""

from __future__ import annotations

from dataclasses import replace

from cognitora.config import DEFAULT_PRIORITY, CognitoraConfig, Role
from cognitora.decision import Decision, Rejection
from cognitora.placement.affinity import affinity_key
from cognitora.placement.cost import (
    by_ranking_cost,
    estimate_unknown_decode,
    excluded_score,
    fewest_uncached_tokens,
    score_endpoint,
)
from cognitora.placement.filters import FilterContext, run_filters
from cognitora.placement.picker import pick
from cognitora.placement.rate_pooling import pooled_joules_per_token, pooled_prefill_rates
from cognitora.placement.shed_probe import probe_prefills
from cognitora.placement.state import FleetState, HealthMark
from cognitora.request import RouteRequest
from kvstate.prompt import PromptKeys

__all__ = [
    "FleetState",
    "HealthMark",
    "place",
    "reject",
    "unknown_model",
]

NO_ENDPOINT_RETRY_AFTER_S = 5


def reject(req: RouteRequest, status: int, message: str, retry_after_s: int | None = None) -> Decision:
    """A Decision that refuses ``req``."""
    return Decision(
        request_id=req.request_id,
        model=req.model,
        endpoint=None,
        url=None,
        prompt_tokens=0,
        reason=message,
        rejection=Rejection(status=status, message=message, retry_after_s=retry_after_s),
    )


def unknown_model(req: RouteRequest, config: CognitoraConfig) -> Decision:
    names = ", ".join(config.model_names())
    return reject(req, 404, f"unknown model {req.model!r}; configured: {names}")


def place(
    req: RouteRequest,
    prompt: PromptKeys,
    config: CognitoraConfig,
    state: FleetState,
    *,
    role: Role = Role.BOTH,
) -> Decision:
    """Where ``req`` (whose block keys are ``prompt``) should go, given ``state``, and why."""
    model = config.model(req.model)
    if model is None:
        return unknown_model(req, config)
    params = config.placement
    priority = req.identity.priority or DEFAULT_PRIORITY
    pclass = params.priorities.get(priority)
    if pclass is None:
        known = ", ".join(params.priorities)
        return reject(req, 400, f"unknown priority class {priority!r}; configured: {known}")

    decode = req.max_tokens or 0
    filtered = run_filters(model.endpoints, FilterContext(req, role, state, params, config.cost_model))
    by_id = {e.id: e for e in model.endpoints}
    pooled = pooled_prefill_rates(model.endpoints, state, params, config.cost_model)
    pooled_energy = pooled_joules_per_token(model.endpoints, state, params)
    fewest = fewest_uncached_tokens(filtered.kept, prompt.prompt_tokens, prompt.tokens_per_key, state, config.kv_tiers)
    ranked = sorted(
        (
            score_endpoint(
                e,
                prompt.prompt_tokens,
                prompt.tokens_per_key,
                state,
                params,
                decode,
                config.kv_tiers,
                cost_model=config.cost_model,
                pooled_rate=pooled.get(e.id),
                fewest_uncached_tokens=fewest,
                pooled_joules_per_token=pooled_energy.get(e.id),
            )
            for e in filtered.kept
        ),
        key=by_ranking_cost,
    )
    estimate_unknown_decode(ranked, decode, params)
    excluded = [excluded_score(by_id[eid], why, state, params) for eid, why in filtered.excluded.items()]
    base = Decision(
        request_id=req.request_id,
        model=req.model,
        endpoint=None,
        url=None,
        prompt_tokens=prompt.prompt_tokens,
        candidates=(*ranked, *excluded),
        degraded=state.degraded,
        exact_keys=prompt.exact,
        keys=tuple(prompt.keys),
        expected_decode_tokens=decode,
    )
    if not ranked:
        why = "; ".join(f"{eid}: {reason}" for eid, reason in filtered.excluded.items())
        message = f"no eligible endpoint for model {req.model!r} ({why})"
        return replace(base, reason=message, rejection=Rejection(503, message, NO_ENDPOINT_RETRY_AFTER_S))

    tie_breaker = affinity_key(
        prompt, req.request_id, params.affinity_prefix_tokens, config.cost_model.affinity_prompt_share
    )
    outcome = pick(
        ranked,
        priority,
        pclass,
        params,
        tie_breaker,
        probes=lambda: probe_prefills(ranked, by_id, prompt.prompt_tokens, state, params),
    )
    if isinstance(outcome, Rejection):
        return replace(base, reason=outcome.message, rejection=outcome, runner_up=ranked[0], saturated=True)
    chosen = outcome.chosen
    return replace(
        base,
        endpoint=chosen.endpoint,
        url=by_id[chosen.endpoint].url,
        predicted_cached_tokens=chosen.cached_tokens,
        predicted_ttft_s=chosen.predicted_ttft_s,
        runner_up=outcome.runner_up,
        fallbacks=tuple(c.endpoint for c in ranked if c.endpoint != chosen.endpoint),
        reason="; ".join([outcome.reason, *filtered.notes]),
        saturated=outcome.saturated,
        shed_probe=outcome.probe,
    )
