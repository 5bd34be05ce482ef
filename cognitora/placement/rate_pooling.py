"""Prefill rates and energy per token pooled within a hardware class: engines that are alike are priced alike.

Each engine's prefill rate is learned from its own counters (``kvstate.rates``), over whatever requests it happened
to serve. That figure carries the workload as well as the hardware: prefill time includes attention, which grows
with context, and the steps shared with other requests. So identical engines are learned apart. On the Mooncake
trace eight identical simulated engines were learned at 7.9k to 14k tokens/s, and the one that looked fastest drew
most of the 30-90k-token prompts.

An endpoint's **class** is everything the config says about its hardware: its engine kind, its ``hardware``
label, its configured prior rate and its long-context priors. Within a class, the learned rates are grouped by
single linkage: sorted, a new group starts where one rate is more than ``placement.rate_pooling_band`` times the
one before. Each endpoint whose rate lies within that band of its group's median is priced at the median.

- A fleet of identical engines has one group (their spread stays well inside the band between neighbours), and
  every engine gets the same rate.
- An unlabeled mixed fleet whose GPUs differ by more than the band, say 10k and 20k tokens/s, splits into two
  groups, and each keeps its own rate.
- An engine that slowed down far (a fault, throttling past the band) is a group of one, and keeps the rate it
  shows. A smaller, steady difference is what the TTFT feedback (``cognitora.ttft_feedback``) corrects.

An endpoint with no learned rate and no prior takes the median learned rate of its class, as before it took that
of the model's endpoints.

A rate learned from short prompts only (``EndpointSnapshot.prefill_rate_from_short_prompts``) is mostly the fixed
cost of a scheduler step, not the engine's prefill rate. When its class has engines measured on long prompts, the
endpoint is priced at their median, like an endpoint with no rate: otherwise an engine that happened to draw short
prompts looks slow, draws no long one, and never learns better. In a class with no such measurement the short-prompt
rates are grouped as above.

Given the cost model (``cost_model``: placement's long-context terms), the rates pooled are attention-free
(``long_context.attention_free_rate``): each engine's learned rate holds the attention of the contexts it happened
to serve, so two identical engines, one serving 4k-token prompts and one 30k, were learned ~1.5x apart with the
shipped prior, for the workload, not the hardware.

The learned marginal energy per token (``kvstate.energy``) is pooled the same way (``pooled_joules_per_token``),
within a class that also shares the configured ``joules_per_token`` prior: it too carries what each engine happened
to serve, and the power rule would otherwise send requests from one identical engine to another for noise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Hashable, Sequence

from cognitora.config import CostModelConfig, EndpointConfig, PlacementConfig
from cognitora.placement.cost import fresh_snapshot
from cognitora.placement.long_context import attention_free_rate, engine_priors
from cognitora.placement.state import FleetState

__all__ = ["pooled_joules_per_token", "pooled_prefill_rates"]


def hardware_class(endpoint: EndpointConfig) -> Hashable:
    """What endpoints must share to be assumed to prefill alike."""
    return (
        endpoint.engine,
        endpoint.hardware,
        endpoint.prefill_tokens_per_s,
        endpoint.cost,  # a frozen model: hashable, equal when every prior is
    )


def pooled_prefill_rates(
    endpoints: Sequence[EndpointConfig],
    state: FleetState,
    params: PlacementConfig,
    cost_model: CostModelConfig | None = None,
) -> dict[str, float]:
    """Endpoint id -> the rate it is priced at instead of its own: its group's median (learned ones within the band)
    or its class's median (ones with neither a learned rate nor a prior). Absent: the endpoint's own figure. With
    ``cost_model``, every rate here is attention-free (``score_endpoint`` takes it so with the same model)."""
    learned: dict[Hashable, list[tuple[float, str]]] = defaultdict(list)
    short_only: dict[Hashable, list[tuple[float, str]]] = defaultdict(list)
    unlearned: dict[Hashable, list[str]] = defaultdict(list)
    for e in endpoints:
        snap = fresh_snapshot(e.id, state, params)
        if snap is not None and snap.prefill_tokens_per_s > 0:
            kind = short_only if snap.prefill_rate_from_short_prompts else learned
            rate = snap.prefill_tokens_per_s
            if cost_model is not None:
                context = engine_priors(e, snap, cost_model).attention_context_tokens
                rate = attention_free_rate(rate, snap.prefill_rate_prompt_tokens, context)
            kind[hardware_class(e)].append((rate, e.id))
        elif e.prefill_tokens_per_s is None:
            unlearned[hardware_class(e)].append(e.id)
    for cls, members in short_only.items():
        if cls in learned:
            unlearned[cls].extend(endpoint for _, endpoint in members)
        else:
            learned[cls] = members
    return _pooled(learned, unlearned, params.rate_pooling_band)


def energy_class(endpoint: EndpointConfig) -> Hashable:
    """What endpoints must share to be assumed to spend alike per token: the hardware class and the energy prior."""
    return (hardware_class(endpoint), endpoint.joules_per_token)


def pooled_joules_per_token(
    endpoints: Sequence[EndpointConfig], state: FleetState, params: PlacementConfig
) -> dict[str, float]:
    """Endpoint id -> the J/token it is priced at instead of its own (``cost.joules_per_token``), pooled as prefill
    rates are: its group's median, or its class's median for an endpoint with neither a learned figure nor a prior.

    Why: on identical engines what each learns from its meter differs by the prompts it happened to serve and by
    when their counts landed in a window; the power rule would then move requests between identical engines for
    energy that is noise. Pooled, identical engines are priced alike and only a cache hit (fewer tokens to compute)
    saves energy among them. The energy figure is a property of the hardware, so a snapshot of any age counts."""
    learned: dict[Hashable, list[tuple[float, str]]] = defaultdict(list)
    unlearned: dict[Hashable, list[str]] = defaultdict(list)
    for e in endpoints:
        snap = state.snapshots.get(e.id)
        if snap is not None and snap.joules_per_token is not None and snap.joules_per_token > 0:
            learned[energy_class(e)].append((snap.joules_per_token, e.id))
        elif e.joules_per_token is None:
            unlearned[energy_class(e)].append(e.id)
    return _pooled(learned, unlearned, params.rate_pooling_band)


def _pooled(
    learned: dict[Hashable, list[tuple[float, str]]], unlearned: dict[Hashable, list[str]], band: float
) -> dict[str, float]:
    """Within each class, every member within ``band`` of its group's median gets the median; the class's
    unlearned endpoints get the median of all its learned figures."""
    pooled: dict[str, float] = {}
    for cls, members in learned.items():
        members.sort()
        for group in _groups(members, band):
            if len(group) < 2:
                continue
            center = statistics.median(value for value, _ in group)
            for value, endpoint in group:
                if center / band <= value <= center * band:
                    pooled[endpoint] = center
        if cls in unlearned:
            class_median = statistics.median(value for value, _ in members)
            pooled.update(dict.fromkeys(unlearned[cls], class_median))
    return pooled


def _groups(members: list[tuple[float, str]], band: float) -> list[list[tuple[float, str]]]:
    """``members`` (sorted by rate) split where one rate exceeds the one before by more than ``band`` times."""
    groups: list[list[tuple[float, str]]] = []
    for member in members:
        if groups and member[0] <= groups[-1][-1][0] * band:
            groups[-1].append(member)
        else:
            groups.append([member])
    return groups
