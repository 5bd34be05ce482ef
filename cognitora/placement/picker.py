"""The picker: from ranked candidates to one endpoint, honouring the priority class's SLO and the power rule.

Candidates come ranked by ``cost.ranking_cost_s``: the predicted TTFT, plus the recompute charge when
``recompute_weight`` is set. "Best" below is the first feasible one.

Rules, in order:

1. **Feasible** candidates are those whose predicted TTFT meets the class's ``ttft_slo_s`` and, when the class
   sets ``itl_slo_s``, whose predicted inter-token latency meets that (``cost.predicted_itl_s``; an endpoint
   whose ITL is not measured meets it).
2. **Power**: among feasible candidates, the *close* ones are within ``min(power_ttft_slack_s,
   power_ttft_slack_ratio x best)`` of the best TTFT, and within as much of the best ranking cost: the rule may
   cost a request at most that fraction of its TTFT and never more than that many seconds, so a sub-100 ms
   decision is not swamped by a fixed window, and it may not undo the recompute charge or the externality. They
   compare the *request's* marginal energy (``CandidateScore.request_joules``: J/token x (uncached prompt +
   expected decode tokens)), so a cache hit saves prefill energy too. If the fastest endpoint's is known and a
   close one's is lower by more than ``power_energy_band_ratio``, the close ones within that band of the lowest
   are the pool rule 3 picks from. Close is never narrower than the tie band. Close also bounds the end-to-end
   cost: the candidate's predicted E2E (TTFT + expected decode tokens / its learned per-sequence decode speed) must
   be within ``min(power_e2e_slack_s, power_e2e_slack_ratio x fastest)`` of the fastest predicted E2E, so packing
   requests onto one low-energy engine stops once its slower decode costs more than that. Unknown energy never
   beats known, and never loses to it either: a fleet without power data ranks by TTFT alone.
3. **Ties**: candidates whose ranking cost is within ``max(tie_band_s, tie_band_ratio x best)`` of the best are
   equal (the prediction is not more precise than that), where ``best`` is the best's predicted TTFT plus its
   recompute charge (``tie_band_s``). Among them, or among the power rule's winners, the
   prompt's prefix key picks by rendezvous hashing (``affinity``): requests sharing a prefix converge, different
   prefixes spread, and a learned rate a few percent high does not draw every cold prompt to one endpoint. Before
   the hash, candidates whose prefix cache is fuller than the emptiest one's by more than ``tie_cache_bound`` of
   their KV capacity are left out (``affinity.within_cache_bound``: bounded loads).
4. **Saturated for the class** (nothing feasible): a sheddable class is rejected with 429 and a Retry-After of the
   predicted overshoot (1 s for an ITL overshoot: a decode step shortens as soon as requests finish); any other
   class takes the fastest endpoint anyway (ties broken as in rule 3: a 30k-token prompt is over a 2 s SLO on
   every idle engine, and without it every such prompt went to the first by name). Except a **probe**: when no
   endpoint meets the TTFT objective, a sheddable request goes to the best-ranked endpoint that may be probed
   (``shed_probe``: measured idle, none sent there within ``shed_probe_interval_s``) and where its own prefill at
   the endpoint's prior rate fits the objective; the learned figures alone made it miss, and only traffic there
   corrects them. Its reason starts with ``probe:``.

The runner-up is the best-ranked candidate other than the pick.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cognitora.config import PlacementConfig, PriorityClass
from cognitora.decision import CandidateScore, Rejection
from cognitora.placement.affinity import rendezvous_pick, within_cache_bound
from cognitora.placement.cost import externality_s, ranking_cost_s, request_cost_s

__all__ = ["Pick", "pick", "tie_band_s"]

MAX_RETRY_AFTER_S = 60


@dataclass(frozen=True)
class Pick:
    chosen: CandidateScore
    runner_up: CandidateScore | None
    reason: str
    saturated: bool = False
    """No candidate met the class's SLO; ``chosen`` is the fastest anyway (or, for a probe, an idle one)."""
    probe: bool = False
    """A sheddable class placed as a probe instead of shed (rule 4, ``shed_probe``)."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


def _joules(j: float | None) -> str:
    return "?" if j is None else (f"{j:.3g} J" if j < 100 else f"{j:.0f} J")


def pick(
    ranked: Sequence[CandidateScore],
    priority: str,
    pclass: PriorityClass,
    params: PlacementConfig,
    affinity_key: str,
    probes: Callable[[], Mapping[str, float]] | None = None,
) -> Pick | Rejection:
    """``ranked`` is non-empty and sorted best first (``cost.by_ranking_cost``); ``affinity_key`` breaks ties.
    ``probes``: the endpoints that may be probed instead of shedding, each with the request's own prefill there at
    its prior rate (``shed_probe.probe_prefills``); called only when a sheddable class misses its TTFT objective
    everywhere (None: no probes)."""
    fast_enough = [c for c in ranked if c.predicted_ttft_s <= pclass.ttft_slo_s]
    feasible = [c for c in fast_enough if meets_itl_slo(c, pclass)]
    if not feasible:
        # What is left to choose from: the candidates that meet the TTFT objective, when only the ITL one fails.
        pool = fast_enough or list(ranked)
        best = pool[0]
        if fast_enough:
            quickest = min(fast_enough, key=lambda c: c.predicted_itl_s or 0.0)
            overshoot = 1.0
            message = (
                f"fleet saturated for priority {priority!r}: best predicted inter-token latency "
                f"{_ms(quickest.predicted_itl_s or 0.0)} (on {quickest.endpoint}) exceeds its ITL SLO of "
                f"{_ms(pclass.itl_slo_s or 0.0)}"
            )
        else:
            overshoot = best.predicted_ttft_s - pclass.ttft_slo_s
            message = (
                f"fleet saturated for priority {priority!r}: best predicted TTFT {best.predicted_ttft_s:.2f} s "
                f"(on {best.endpoint}) exceeds its SLO of {pclass.ttft_slo_s:g} s"
            )
        if pclass.sheddable:
            probed = None if fast_enough or probes is None else _probe(ranked, probes(), pclass, message)
            if probed is not None:
                return probed
            retry = min(MAX_RETRY_AFTER_S, max(1, math.ceil(overshoot)))
            return Rejection(status=429, message=message + "; retry later", retry_after_s=retry)
        # Ties are broken as for feasible candidates: a long prompt predicted over the SLO everywhere on an idle
        # fleet would otherwise go to the first endpoint by name, every time.
        band = tie_band_s(best, params)
        tied = [c for c in pool if ranking_cost_s(c) <= ranking_cost_s(best) + band]
        hashed = within_cache_bound(tied, params.tie_cache_bound)
        chosen = rendezvous_pick(hashed, affinity_key)
        reason = message + "; not sheddable, so placed on the fastest endpoint"
        if chosen is not best:
            reason += f" (tied with {best.endpoint} within the {_ms(band)} band; the prompt's prefix hashes here)"
        reason += _bound_note(tied, hashed, params)
        return Pick(chosen, _runner_up(ranked, chosen), reason, saturated=True)

    best = feasible[0]
    band = tie_band_s(best, params)
    tied = [c for c in feasible if ranking_cost_s(c) <= ranking_cost_s(best) + band]
    close = _close(feasible, params, band)
    lowest = min((c.request_joules for c in close if c.request_joules is not None), default=None)
    if best.request_joules is None:
        lowest = None
    greener = False
    pool = tied
    if lowest is not None:
        energy_limit = lowest * (1.0 + params.power_energy_band_ratio)
        greener = best.request_joules is not None and energy_limit < best.request_joules
        if greener:
            pool = [c for c in close if c.request_joules is not None and c.request_joules <= energy_limit]
        else:
            # Equal in TTFT, but clearly more energy for this request: out. Unknown energy neither wins nor loses.
            pool = [c for c in tied if c.request_joules is None or c.request_joules <= energy_limit]
    hashed = within_cache_bound(pool, params.tie_cache_bound)
    chosen = rendezvous_pick(hashed, affinity_key)
    if greener:
        reason = (
            f"lower energy: {_joules(chosen.request_joules)} for this request vs {_joules(best.request_joules)} on the "
            f"fastest ({best.endpoint}; {chosen.joules_per_token:.3g} vs {best.joules_per_token:.3g} J/token), "
            f"predicted TTFT {_ms(chosen.predicted_ttft_s)} within {_ms(power_slack_s(best, params))} of its "
            f"{_ms(best.predicted_ttft_s)}"
        )
        fastest = _fastest_e2e_s(feasible)
        if fastest is not None and chosen.predicted_decode_s:
            reason += (
                f", predicted E2E {_ms(predicted_e2e_s(chosen) or 0.0)} within "
                f"{_ms(power_e2e_slack_s(fastest, params))} of the fastest {_ms(fastest)}"
            )
    elif len(pool) == 1:
        # Candidates ranked above the pick are out only for missing the class's SLO: say so (comparing the pick
        # with ranked[1] compared it with itself).
        ahead = list(itertools.takewhile(lambda c: c is not chosen, ranked))
        reason = _slo_misses(ahead, pclass) if ahead else _ttft_reason(chosen, ranked[1:])
    elif len(hashed) == 1:
        reason = (
            f"the emptiest prefix cache of the candidates tied within the {_ms(band)} band of the best "
            f"({_ms(ranking_cost_s(best))})"
        )
    else:
        reason = _tie_reason(chosen, best, hashed, band)
    reason += _bound_note(pool, hashed, params)
    return Pick(chosen, _runner_up(ranked, chosen), reason)


def _probe(
    ranked: Sequence[CandidateScore], prior_prefill_s: Mapping[str, float], pclass: PriorityClass, message: str
) -> Pick | None:
    """The best-ranked endpoint that may be probed and where the request's own prefill at its prior rate fits the
    objective, placed as a probe; None when there is none (the request is shed)."""
    chosen = next((c for c in ranked if prior_prefill_s.get(c.endpoint, math.inf) <= pclass.ttft_slo_s), None)
    if chosen is None:
        return None
    reason = (
        f"probe: {chosen.endpoint} is idle (nothing running, waiting or in flight) and this request's own prefill "
        f"at its prior rate takes {_ms(prior_prefill_s[chosen.endpoint])}, within the {pclass.ttft_slo_s:g} s "
        f"objective; predicted at {_ms(chosen.predicted_ttft_s)} on learned figures ({_learned_terms(chosen)}), "
        f"so placed to measure it instead of shed ({message})"
    )
    return Pick(chosen, _runner_up(ranked, chosen), reason, saturated=True, probe=True)


def _learned_terms(c: CandidateScore) -> str:
    """The learned figures in ``c``'s prediction, in words."""
    terms = []
    if c.short_prompt_floor_s > 0:
        terms.append(f"short-prompt floor {_ms(c.short_prompt_floor_s)}")
    terms.append(f"rate {c.prefill_tokens_per_s:.0f} tokens/s")
    if c.ttft_bias_factor != 1.0:
        terms.append(f"TTFT feedback x{c.ttft_bias_factor:.2f}")
    return ", ".join(terms)


def meets_itl_slo(c: CandidateScore, pclass: PriorityClass) -> bool:
    """The class sets no ITL objective, the endpoint's ITL is not measured, or its predicted ITL meets it."""
    return pclass.itl_slo_s is None or c.predicted_itl_s is None or c.predicted_itl_s <= pclass.itl_slo_s


def tie_band_s(best: CandidateScore, params: PlacementConfig) -> float:
    """Ranking costs this close to the best one's are equal: the larger of the absolute band and the relative one.

    The relative band is a fraction of the best's own cost (``cost.request_cost_s``: its predicted TTFT plus the
    recompute charge, both prefill over a learned rate, so both carry that rate's error), not of its whole ranking
    cost: the externality (``cost.externality_s``) sums seconds over every request running on an engine (tens to
    hundreds of seconds under load, nearly the same on every candidate), and 5% of them made a band of seconds that
    tied a cached endpoint with cold ones, so the prefix hash sent a group's requests off the engine holding it.
    """
    return max(params.tie_band_s, params.tie_band_ratio * request_cost_s(best))


def power_slack_s(best: CandidateScore, params: PlacementConfig) -> float:
    """How much predicted TTFT the power rule may trade for energy: the smaller of the absolute and relative slack."""
    return min(params.power_ttft_slack_s, params.power_ttft_slack_ratio * best.predicted_ttft_s)


def power_e2e_slack_s(fastest_e2e_s: float, params: PlacementConfig) -> float:
    """How much predicted E2E the power rule may trade for energy: the smaller of the absolute and relative slack."""
    return min(params.power_e2e_slack_s, params.power_e2e_slack_ratio * fastest_e2e_s)


def predicted_e2e_s(c: CandidateScore) -> float | None:
    """Predicted TTFT plus the predicted decode time; None when the decode speed is unknown."""
    return None if c.predicted_decode_s is None else c.predicted_ttft_s + c.predicted_decode_s


def _fastest_e2e_s(feasible: Sequence[CandidateScore]) -> float | None:
    return min((e for e in map(predicted_e2e_s, feasible) if e is not None), default=None)


def _close(feasible: Sequence[CandidateScore], params: PlacementConfig, band: float) -> list[CandidateScore]:
    """Candidates the power rule may pick for energy: close to the best in predicted TTFT and in ranking cost, and
    to the fastest in predicted E2E.

    TTFT: within the power slack of the best, never less than the tie band (tied candidates are equal in TTFT).
    Ranking cost: within the same slack of the best's. A cold engine can predict a *lower* TTFT than the one holding
    the prompt's prefix and still rank below it, by the recompute charge and the externality (``cost``); bounded by
    TTFT alone, the rule undid both on any engine whose learned J/token read low, and on identical engines that
    reading is noise (the 32 x 32 run at 100 rps: 0.014 against 0.11 J/token, and a group's requests recomputed
    their 2,048-token prompt on the "greener" engine).
    E2E: within ``power_e2e_slack_s`` of the fastest predicted E2E (never less than the tie band either); a candidate
    whose E2E cannot be predicted (decode tokens expected, decode speed unknown) is not close: the rule saves
    energy only where it can bound what it costs.
    """
    best = feasible[0]
    slack = max(band, power_slack_s(best, params))
    ttft_limit = best.predicted_ttft_s + slack
    cost_limit = ranking_cost_s(best) + slack
    fastest = _fastest_e2e_s(feasible)
    close = []
    for c in feasible:
        if c.predicted_ttft_s > ttft_limit or ranking_cost_s(c) > cost_limit:
            continue
        e2e = predicted_e2e_s(c)
        if c.decode_estimated or e2e is None or fastest is None:
            continue
        if e2e > fastest + max(band, power_e2e_slack_s(fastest, params)):
            continue
        close.append(c)
    return close


def _tie_reason(chosen: CandidateScore, best: CandidateScore, tied: Sequence[CandidateScore], band: float) -> str:
    others = ", ".join(c.endpoint for c in tied if c.endpoint != chosen.endpoint)
    return (
        f"prefix affinity: predicted TTFT {_ms(chosen.predicted_ttft_s)}, within the {_ms(band)} tie band of the "
        f"best ({_ms(ranking_cost_s(best))}) like {others}; the prompt's prefix hashes here, so requests sharing "
        "it converge"
    )


def _bound_note(pool: Sequence[CandidateScore], hashed: Sequence[CandidateScore], params: PlacementConfig) -> str:
    """What the load bound left out of the hash's pick, if anything (``affinity.within_cache_bound``)."""
    if len(hashed) == len(pool):
        return ""
    least = min(c.cache_held_tokens or 0.0 for c in hashed)
    kept = {c.endpoint for c in hashed}
    out = ", ".join(
        f"{c.endpoint} ({c.cache_held_tokens or 0.0:.0f} tokens cached of {c.kv_capacity_tokens})"
        for c in pool
        if c.endpoint not in kept
    )
    return (
        f"; left out of the tie for holding over {params.tie_cache_bound:g} of their KV capacity more than the "
        f"emptiest ({least:.0f} tokens cached): {out}"
    )


def _runner_up(ranked: Sequence[CandidateScore], chosen: CandidateScore) -> CandidateScore | None:
    for c in ranked:
        if c.endpoint != chosen.endpoint:
            return c
    return None


def _terms(c: CandidateScore) -> dict[str, float]:
    """A candidate's predicted TTFT split into its terms (seconds)."""
    queue = c.queued_prefill_tokens / c.prefill_tokens_per_s
    return {
        "queue wait": queue,
        "prefill": c.predicted_ttft_s - queue - c.decode_penalty_s - c.slot_wait_s - _long_context_s(c),
        "decode load": c.decode_penalty_s,
        "slot wait": c.slot_wait_s,
        "attention": c.attention_s,
        "resident-context steps": c.interference_s,
        "wait for KV room": c.kv_pressure_s,
        "recompute charge": c.recompute_penalty_s,
        "decode interference": c.decode_interference_s,
        "prefill stall of running requests": c.prefill_stall_s,
    }


def _long_context_s(c: CandidateScore) -> float:
    return c.attention_s + c.interference_s + c.kv_pressure_s


def _slo_misses(ahead: Sequence[CandidateScore], pclass: PriorityClass) -> str:
    """Why candidates ranked above the pick were not picked: each misses the class's TTFT or ITL objective."""
    misses = []
    for c in ahead:
        if c.predicted_ttft_s > pclass.ttft_slo_s:
            misses.append(f"{c.endpoint} (predicted TTFT {_ms(c.predicted_ttft_s)} over {pclass.ttft_slo_s:g} s)")
        else:
            misses.append(f"{c.endpoint} (predicted ITL {_ms(c.predicted_itl_s or 0.0)} over the ITL objective)")
    return "the best-ranked endpoint meeting the class's SLO; ranked above it: " + ", ".join(misses)


def _ttft_reason(best: CandidateScore, others: Sequence[CandidateScore]) -> str:
    """Why ``best``, ranked first, beat ``others[0]``, ranked second."""
    if not others:
        return "the only eligible endpoint"
    second = others[0]
    what = "predicted TTFT" if best.recompute_penalty_s == second.recompute_penalty_s == 0 else "TTFT + recompute"
    if externality_s(best) or externality_s(second):
        what = "ranking cost (TTFT + recompute + decode interference + prefill stall)"
    why = f"lowest {what} ({_ms(ranking_cost_s(best))} vs {_ms(ranking_cost_s(second))} on {second.endpoint})"
    mine, theirs = _terms(best), _terms(second)
    gains = sorted(((theirs[k] - mine[k], k) for k in mine), reverse=True)
    parts = []
    for gain, term in gains:
        if gain < 0.0005:
            break
        detail = ""
        if term == "prefill" and best.cached_tokens > second.cached_tokens:
            detail = f" ({best.cached_tokens:.0f} prompt tokens cached vs {second.cached_tokens:.0f})"
        elif term == "prefill" and best.prefill_tokens_per_s > second.prefill_tokens_per_s:
            detail = f" (faster: {best.prefill_tokens_per_s:.0f} vs {second.prefill_tokens_per_s:.0f} tokens/s)"
        elif term == "slot wait":
            detail = " (the other engine is at capacity: its running requests must finish first)"
        elif term in ("resident-context steps", "decode interference"):
            detail = f" ({best.resident_tokens:.0f} vs {second.resident_tokens:.0f} context tokens resident)"
        elif term == "prefill stall of running requests":
            detail = f" ({best.running} vs {second.running} running)"
        elif term == "queue wait":
            detail = f" ({best.queued_prefill_tokens:.0f} vs {second.queued_prefill_tokens:.0f} tokens queued)"
        parts.append(f"{_ms(gain)} less {term}{detail}")
    if parts:
        why += ": " + ", ".join(parts)
    return why
