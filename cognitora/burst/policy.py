"""The burst decision: given the local placement of a request, does it go to a cloud target instead, and why.

``BurstPolicy.consider`` runs after ``cognitora.placement.place`` on every decision of ``Router.admit``. It reads
the local decision's candidates (the best local predicted TTFT), feeds the class's hysteresis
(``saturation``), and bursts only when every rule allows it:

- the class is in burst and this request's best local endpoint is over the threshold: its predicted TTFT against
  the class's TTFT SLO or, when the class sets ``itl_slo_s``, its predicted inter-token latency against that,
  whichever is further (``LocalLoad``), or no local endpoint is eligible at all;
- its team (from the gateway's authentication) is in ``burst.teams`` and its class in ``burst.priorities``;
- a target serves the model, has room (``max_concurrency``), has not answered 429 with a Retry-After still
  running and is not unreachable (``cloud_state``);
- the team's spend gate allows it (``spend``);
- the request is not a retry of one the cloud already failed before its first token (it is retried locally).

Anything else leaves the local decision exactly as it was (placed on the fastest engine, or shed with 429), with
the reason it did not burst added to its explanation and counted.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from cognitora.attempt import Outcome
from cognitora.budgets.plan import Identity
from cognitora.burst.cloud_state import CloudState
from cognitora.burst.config import ANY_TEAM, BurstConfig, CloudTargetConfig
from cognitora.burst.ledger_spend import LedgerSpend
from cognitora.burst.saturation import SaturationDetector
from cognitora.burst.spend import CloudSpend, InProcessSpend, SpendGate
from cognitora.config import DEFAULT_PRIORITY, CognitoraConfig, PriorityClass
from cognitora.decision import CandidateScore, CloudPick, Decision
from cognitora.request import RouteRequest

CLOUD_ENDPOINT_PREFIX = "cloud:"
"""``Decision.endpoint`` of a burst decision: ``cloud:<target>`` (never a local engine's ``host:port``)."""
OTHER_TEAM = "(other)"
"""The ``team`` label of a team not named in ``burst.teams`` (allowed by ``"*"``): labels stay bounded."""
FAILED_GROUPS_KEPT = 4096


class BurstReason(StrEnum):
    """Why a request burst: the ``reason`` label of ``cognitora_burst_decisions_total``."""

    SATURATED = "saturated"
    """The best local predicted TTFT missed the class's burst threshold (``enter_ratio``/``exit_ratio`` x SLO)."""
    ITL_SATURATED = "itl_saturated"
    """The best local predicted inter-token latency missed the burst threshold of the class's ITL SLO."""
    NO_LOCAL_ENDPOINT = "no_local_endpoint"
    """No local endpoint was eligible (all unhealthy or full)."""


class Denied(StrEnum):
    """Why a request that would have burst stayed local: the ``why`` label of ``cognitora_burst_denied_total``."""

    TEAM = "team_not_allowed"
    NO_TARGET = "no_target_for_model"
    RETRY = "cloud_failed_this_request"
    SPEND = "spend_exhausted"
    UNHEALTHY = "cloud_unhealthy"
    RATE_LIMITED = "cloud_rate_limited"
    AT_CAPACITY = "cloud_at_capacity"


def cloud_endpoint(target: str) -> str:
    return CLOUD_ENDPOINT_PREFIX + target


def is_cloud_endpoint(endpoint: str) -> bool:
    return endpoint.startswith(CLOUD_ENDPOINT_PREFIX)


class BurstPolicy:
    """The burst rules over one Router's decisions. Called on the router's loop."""

    def __init__(
        self, config: CognitoraConfig, spend: SpendGate | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self.config = config
        self.settings: BurstConfig = config.burst
        self._clock = clock or time.monotonic
        self.detector = SaturationDetector(
            self.settings.enter_ratio, self.settings.exit_ratio, self.settings.min_dwell_s
        )
        self.cloud = CloudState(self.settings.retry_after_s, self.settings.unhealthy_s)
        self.ledger = InProcessSpend(self.settings.spend_limit_usd)
        self.spend: SpendGate = spend if spend is not None else self.ledger
        self._last_burst: tuple[str, str, str, str] | None = None
        self._failed_groups: OrderedDict[str, None] = OrderedDict()
        self.decisions: dict[tuple[str, str, str, str], int] = {}
        """(model, priority, target, BurstReason) -> requests sent to the cloud."""
        self.denied: dict[tuple[str, str, str], int] = {}
        """(model, priority, Denied) -> requests that would have burst and stayed local."""

    @property
    def enabled(self) -> bool:
        return bool(self.settings.targets) and bool(self.settings.priorities)

    def team_label(self, team: str) -> str:
        return team if team in self.settings.teams and team != ANY_TEAM else OTHER_TEAM

    # -- the decision ----------------------------------------------------------------------------------------
    def consider(self, req: RouteRequest, decision: Decision, group: str | None = None) -> Decision:
        """``decision`` (the local placement of ``req``), or the burst decision that replaces it."""
        if not self.enabled or decision.cloud is not None:
            return decision
        priority = req.priority or DEFAULT_PRIORITY
        pclass = self.config.placement.priorities.get(priority)
        model = self.config.model(req.model)
        if pclass is None or model is None or priority not in self.settings.priorities:
            return decision
        best = best_local_load(decision, pclass)
        if best is None:
            return decision  # refused for a reason of its own (bad prompt, unknown model): not the fleet's load
        verdict = self.detector.observe(model.name, priority, best.ratio, self._clock())
        if not verdict.burst:
            return decision
        why, detail = best.why(priority, pclass, verdict.threshold)
        target, denied = self._target_for(req, decision, group)
        if target is None:
            assert denied is not None
            key = (model.name, priority, denied.value)
            self.denied[key] = self.denied.get(key, 0) + 1
            note = f"would burst ({detail}) but stays local: {denied.value.replace('_', ' ')}"
            return replace(decision, reason=f"{decision.reason}; {note}" if decision.reason else note)
        assert req.team is not None
        key4 = (model.name, priority, target.name, why.value)
        self.decisions[key4] = self.decisions.get(key4, 0) + 1
        self._last_burst = key4
        local = _local_order(decision)
        pick = CloudPick(
            target=target.name,
            model=target.models[decision.model],
            url=target.base_url,
            reason=f"{why.value}: {detail}",
            team=req.team,
            local_fallbacks=local,
        )
        return replace(
            decision,
            endpoint=cloud_endpoint(target.name),
            url=target.base_url,
            rejection=None,
            cloud=pick,
            saturated=True,
            predicted_cached_tokens=0.0,
            predicted_ttft_s=0.0,
            fallbacks=(),
            reason=f"burst to {target.name}: {pick.reason}; local placement: {decision.reason}",
        )

    def _target_for(
        self, req: RouteRequest, decision: Decision, group: str | None
    ) -> tuple[CloudTargetConfig | None, Denied | None]:
        if not self.settings.team_may_burst(req.team):
            return None, Denied.TEAM
        if group is not None and group in self._failed_groups:
            return None, Denied.RETRY
        assert req.team is not None
        allowed = None if req.burst_targets is None else set(req.burst_targets)
        serving = [
            t for t in self.settings.targets if decision.model in t.models and (allowed is None or t.name in allowed)
        ]
        if not serving:
            return None, Denied.NO_TARGET
        if not self.spend.may_burst(req.team):
            return None, Denied.SPEND
        now = self._clock()
        first_problem: str | None = None
        for t in serving:
            problem = self.cloud.unavailable(t.name, t.max_concurrency, now)
            if problem is None:
                return t, None
            first_problem = first_problem or problem
        return None, Denied(first_problem or Denied.AT_CAPACITY)

    async def spend_checked(self, local: Decision, burst: Decision) -> Decision:
        """``burst`` (just returned by ``consider`` for ``local``), or ``local`` when the shared ledger says the
        team's cloud spend reached its limit. Reads the ledger (``LedgerSpend.refresh``, cached briefly) only here:
        for a request that would burst, never for a local decision."""
        key4, self._last_burst = self._last_burst, None
        pick = burst.cloud
        if pick is None or key4 is None or not isinstance(self.spend, LedgerSpend):
            return burst
        await self.spend.refresh(pick.team)
        if self.spend.may_burst(pick.team):
            return burst
        self.decisions[key4] -= 1
        denied = (key4[0], key4[1], Denied.SPEND.value)
        self.denied[denied] = self.denied.get(denied, 0) + 1
        note = f"would burst ({pick.reason}) but stays local: {Denied.SPEND.value.replace('_', ' ')}"
        return replace(local, reason=f"{local.reason}; {note}" if local.reason else note)

    @property
    def charges_budgets(self) -> bool:
        """Cloud attempts are charged to the budgets ledger (their budget hold is given back, not settled)."""
        return isinstance(self.spend, LedgerSpend)

    def charged(self, decision: Decision, outcome: Outcome) -> bool:
        """Whether ``finished`` records spend for this cloud attempt (it reported its usage)."""
        pick = decision.cloud
        known = pick is not None and self.settings.target(pick.target) is not None
        return known and outcome.completion_tokens is not None

    # -- the attempt's life ----------------------------------------------------------------------------------
    def dispatched(self, decision: Decision) -> None:
        assert decision.cloud is not None
        self.cloud.dispatched(decision.cloud.target)

    def finished(
        self,
        decision: Decision,
        outcome: Outcome,
        *,
        first_token_seen: bool,
        group: str | None,
        identity: Identity | None = None,
    ) -> None:
        """A cloud attempt ended: learn the target's state, record the spend, and remember a request the cloud
        failed before its first token (its retry goes local). ``identity``: the key and user of its budget
        reservation, for the spend records."""
        pick = decision.cloud
        assert pick is not None
        self.cloud.finished(pick.target, outcome, self._clock())
        target = self.settings.target(pick.target)
        if target is not None and outcome.completion_tokens is not None:
            prompt, completion = outcome.prompt_tokens or 0, outcome.completion_tokens
            spend = CloudSpend(
                request_id=decision.request_id,
                team=pick.team,
                target=pick.target,
                model=decision.model,
                input_tokens=prompt,
                output_tokens=completion,
                cost_usd=target.cost_usd(prompt, completion),
                key=None if identity is None else identity.key,
                user=None if identity is None else identity.user,
            )
            self.ledger.record(spend)  # the exporter's figures
            if self.spend is not self.ledger:
                self.spend.record(spend)
        if not outcome.ok and not first_token_seen and group is not None:
            self._failed_groups[group] = None
            while len(self._failed_groups) > FAILED_GROUPS_KEPT:
                self._failed_groups.popitem(last=False)


@dataclass(frozen=True)
class LocalLoad:
    """How far the best local endpoint is from a request's class objectives."""

    ratio: float
    """Its predicted TTFT over the TTFT SLO, or its predicted ITL over the ITL SLO when the class sets one and that
    is larger; ``inf`` when no local endpoint is eligible."""
    ttft_s: float
    itl_s: float | None = None
    """Its predicted inter-token latency, when the ITL objective is the one that sets ``ratio``."""

    def why(self, priority: str, pclass: PriorityClass, threshold: float) -> tuple[BurstReason, str]:
        """The burst reason and the explanation's words, for a request over ``threshold``."""
        if math.isinf(self.ratio):
            return BurstReason.NO_LOCAL_ENDPOINT, "no local endpoint is eligible"
        if self.itl_s is not None and pclass.itl_slo_s is not None:
            return BurstReason.ITL_SATURATED, (
                f"best local predicted inter-token latency {self.itl_s * 1000:.0f} ms over the burst threshold "
                f"{threshold * pclass.itl_slo_s * 1000:.0f} ms (class {priority!r}, ITL SLO "
                f"{pclass.itl_slo_s * 1000:g} ms)"
            )
        return BurstReason.SATURATED, (
            f"best local predicted TTFT {self.ttft_s:.2f} s over the burst threshold "
            f"{threshold * pclass.ttft_slo_s:.2f} s (class {priority!r}, SLO {pclass.ttft_slo_s:g} s)"
        )


def best_local_load(decision: Decision, pclass: PriorityClass) -> LocalLoad | None:
    """The load of ``decision``'s best local candidate (``inf`` when every local endpoint was excluded); None when
    the decision was refused for a reason other than the fleet's load (nothing to burst for)."""
    ranked = [c for c in decision.candidates if c.excluded is None]
    if ranked:
        if decision.rejection is not None and not decision.saturated:
            return None
        return min((_load(c, pclass) for c in ranked), key=lambda load: load.ratio)
    if decision.rejection is not None and decision.rejection.status == 503 and decision.candidates:
        return LocalLoad(math.inf, math.inf)
    return None


def _load(c: CandidateScore, pclass: PriorityClass) -> LocalLoad:
    ttft_ratio = c.predicted_ttft_s / pclass.ttft_slo_s
    if pclass.itl_slo_s is None or c.predicted_itl_s is None:
        return LocalLoad(ttft_ratio, c.predicted_ttft_s)
    itl_ratio = c.predicted_itl_s / pclass.itl_slo_s
    if itl_ratio > ttft_ratio:
        return LocalLoad(itl_ratio, c.predicted_ttft_s, c.predicted_itl_s)
    return LocalLoad(ttft_ratio, c.predicted_ttft_s)


def _local_order(decision: Decision) -> tuple[str, ...]:
    if decision.endpoint is not None:
        return (decision.endpoint, *decision.fallbacks)
    ranked = sorted((c for c in decision.candidates if c.excluded is None), key=lambda c: c.predicted_ttft_s)
    return tuple(c.endpoint for c in ranked)
