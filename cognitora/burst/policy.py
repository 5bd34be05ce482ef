"""The burst decision: given the local placement of a request, does it go to a cloud target instead, and why.

``BurstPolicy.consider`` runs after ``cognitora.placement.place`` on every decision of ``Router.admit``. It is
the ONE way to a cloud target, whatever asked for it (the saturation rule, a client naming the target, an intent
rewrite's model, a gateway's retry): a decision is a cloud decision only if it returns one. It reads the local
decision's candidates (the best local predicted TTFT), feeds the class's hysteresis (``saturation``), and bursts
only when every rule allows it:

- the class is in burst and this request's best local endpoint is over the threshold: its predicted TTFT against
  the class's TTFT SLO or, when the class sets ``itl_slo_s``, its predicted inter-token latency against that,
  whichever is further (``LocalLoad``), or no local endpoint is eligible at all;
- unless that endpoint is measured idle and a local probe is due (``probes``): then it is placed there, to learn
  whether the fleet serves the class again;
- its team (from the gateway's authentication) is in ``burst.teams`` and its class in ``burst.priorities``;
- a target serves the model, has room (``max_concurrency``) and its breaker is closed or lets this request probe
  it (``cloud_state``);
- the team's spend, plus the estimated cost of its cloud requests in flight, plus this one's, stays within its
  limit (``spend``);
- the request is not a retry of one the cloud already failed before its first token (it is retried locally).

A request that *names* a target (``RouteRequest.named_cloud``) goes there only when its team is in that target's
``named_teams`` (and the target, spend and capacity rules allow it); otherwise it is placed like any request of its
model, the saturation rule included.

Anything else leaves the local decision exactly as it was (placed on the fastest engine, or shed with 429), with
the reason it did not burst added to its explanation and counted. A cloud decision holds its target slot and its
spend estimate from the moment it is made (nothing awaits between the check and the hold); ``withdraw`` gives
them back when the decision is not carried out, ``finished`` at every end of the attempt.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from cognitora.burst.cloud_state import BreakerSettings, CloudState
from cognitora.burst.config import ANY_TEAM, BurstConfig, CloudTargetConfig
from cognitora.burst.ledger_spend import LedgerSpend
from cognitora.burst.local_load import LocalLoad, best_local_load
from cognitora.burst.probes import LocalProbes
from cognitora.burst.reasons import BurstReason, Denied
from cognitora.burst.saturation import SaturationDetector
from cognitora.burst.spend import CloudSpend, InProcessSpend, SpendGate
from cognitora.config import DEFAULT_PRIORITY, CognitoraConfig, PriorityClass
from cognitora.core.outcome import Outcome
from cognitora.decision import CloudPick, Decision
from cognitora.identity import Identity
from cognitora.request import RouteRequest

__all__ = ["CLOUD_ENDPOINT_PREFIX", "BurstPolicy", "BurstReason", "Denied", "cloud_endpoint", "is_cloud_endpoint"]

CLOUD_ENDPOINT_PREFIX = "cloud:"
"""``Decision.endpoint`` of a burst decision: ``cloud:<target>`` (never a local engine's ``host:port``)."""
OTHER_TEAM = "(other)"
"""The ``team`` label of a team not named in ``burst.teams`` (allowed by ``"*"``): labels stay bounded."""
FAILED_GROUPS_KEPT = 4096


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
        s = self.settings
        self.detector = SaturationDetector(s.enter_ratio, s.exit_ratio, s.min_dwell_s)
        self.cloud = CloudState(BreakerSettings(s.breaker_failures, s.unhealthy_s, s.unhealthy_max_s, s.retry_after_s))
        self.probes = LocalProbes(s.probe_interval_s)
        self.ledger = InProcessSpend(s.spend_limit_usd)
        self.spend: SpendGate = spend if spend is not None else self.ledger
        self._last_burst: tuple[str, str, str, str] | None = None
        self._failed_groups: OrderedDict[str, None] = OrderedDict()
        self.decisions: dict[tuple[str, str, str, str], int] = {}
        """(model, priority, target, BurstReason) -> requests sent to the cloud."""
        self.denied: dict[tuple[str, str, str], int] = {}
        """(model, priority, Denied) -> requests that would have gone out and stayed local."""

    def now(self) -> float:
        """The policy's clock (monotonic): the time the breakers and probes are on."""
        return self._clock()

    @property
    def enabled(self) -> bool:
        return bool(self.settings.targets) and bool(self.settings.priorities)

    def team_label(self, team: str) -> str:
        return team if team in self.settings.teams and team != ANY_TEAM else OTHER_TEAM

    # -- the decision ----------------------------------------------------------------------------------------
    def consider(self, req: RouteRequest, decision: Decision, group: str | None = None) -> Decision:
        """``decision`` (the local placement of ``req``), or the cloud decision that replaces it."""
        if decision.cloud is not None or not self.settings.targets:
            return decision
        priority = req.identity.priority or DEFAULT_PRIORITY
        if req.named_cloud is not None:
            named = self._named(req, decision, priority)
            if named.cloud is not None or not self.enabled:
                return named
            decision = named  # placed like any request of its model, from here on
        pclass = self.config.placement.priorities.get(priority)
        model = self.config.model(decision.model)  # the model that serves it: after an intent rewrite too
        if pclass is None or model is None or priority not in self.settings.priorities:
            return decision
        best = best_local_load(decision, pclass)
        if best is None:
            return decision  # refused for a reason of its own (bad prompt, unknown model): not the fleet's load
        now = self._clock()
        verdict = self.detector.observe(model.name, priority, best.ratio, now, idle=best.idle)
        if not verdict.burst:
            return decision
        why, detail = best.why(priority, pclass, verdict.threshold)
        probe = self._probe(decision, (model.name, priority), pclass, best, now)
        if probe is not None:
            return probe
        target, denied = self._target_for(req, decision, group, now)
        if target is None:
            assert denied is not None
            self._deny(model.name, priority, denied)
            note = f"would burst ({detail}) but stays local: {denied.value.replace('_', ' ')}"
            return _noted(decision, note)
        return self._to_cloud(req, decision, priority, target, why, detail)

    def _to_cloud(
        self,
        req: RouteRequest,
        decision: Decision,
        priority: str,
        target: CloudTargetConfig,
        why: BurstReason,
        detail: str,
    ) -> Decision:
        assert req.identity.team is not None
        key4 = (self._model_name(decision), priority, target.name, why.value)
        self.decisions[key4] = self.decisions.get(key4, 0) + 1
        self._last_burst = key4
        pick = CloudPick(
            target=target.name,
            model=target.models[decision.model],
            url=target.base_url,
            reason=f"{why.value}: {detail}",
            team=req.identity.team,
            local_fallbacks=_local_order(decision),
        )
        return replace(
            decision,
            endpoint=cloud_endpoint(target.name),
            url=target.base_url,
            rejection=None,
            cloud=pick,
            saturated=why is not BurstReason.NAMED or decision.saturated,
            predicted_cached_tokens=0.0,
            predicted_ttft_s=0.0,
            fallbacks=(),
            reason=f"{'named' if why is BurstReason.NAMED else 'burst'} to {target.name}: {pick.reason}; "
            f"local placement: {decision.reason}",
        )

    def _model_name(self, decision: Decision) -> str:
        model = self.config.model(decision.model)
        return decision.model if model is None else model.name

    def _named(self, req: RouteRequest, decision: Decision, priority: str) -> Decision:
        """The cloud decision of a request that named a target, or ``decision`` with a note saying why not."""
        name = req.named_cloud
        assert name is not None
        target = self.settings.target(name)
        model = self._model_name(decision)
        denied: Denied | None = None
        if target is None or not target.may_be_named_by(req.identity.team):
            denied = Denied.NAMED
        elif decision.model not in target.models or (req.burst_targets is not None and name not in req.burst_targets):
            denied = Denied.NO_TARGET
        elif decision.rejection is not None and not decision.saturated and decision.rejection.status not in (503,):
            return decision  # refused for the request's own fault (a bad prompt): the cloud would refuse it too
        else:
            denied = self._reserve(req, decision, target, self._clock())
        if denied is None:
            assert target is not None
            detail = f"the request named it and team {req.identity.team!r} may (burst.targets[].named_teams)"
            return self._to_cloud(req, decision, priority, target, BurstReason.NAMED, detail)
        self._deny(model, priority, denied)
        who = "no team" if req.identity.team is None else f"team {req.identity.team!r}"
        return _noted(
            decision,
            f"the request named cloud target {name!r}: placed like its model ({who}: {denied.value.replace('_', ' ')})",
        )

    def _probe(
        self, decision: Decision, key: tuple[str, str], pclass: PriorityClass, best: LocalLoad, now: float
    ) -> Decision | None:
        """``decision`` placed locally as a probe, when its best local endpoint is measured idle and one is due."""
        threshold_s = self.settings.exit_ratio * pclass.ttft_slo_s
        if best.endpoint is None or not best.idle or best.own_prefill_s > threshold_s:
            return None
        if not self.probes.may_probe(key, now):
            return None
        if decision.endpoint is None:
            candidate = next(c for c in decision.candidates if c.endpoint == best.endpoint)
            endpoint = self.config.endpoint(best.endpoint)
            decision = replace(
                decision,
                endpoint=best.endpoint,
                url=None if endpoint is None else endpoint.url,
                rejection=None,
                predicted_cached_tokens=candidate.cached_tokens,
                predicted_ttft_s=candidate.predicted_ttft_s,
            )
        self.probes.start(key, decision.request_id, now, threshold_s)
        return _noted(
            decision,
            f"burst probe: {best.endpoint} is idle (nothing running or queued) although predicted at "
            f"{best.ttft_s:.2f} s: placed there to measure it (an answer within {threshold_s:.2f} s ends the burst)",
        )

    def _target_for(
        self, req: RouteRequest, decision: Decision, group: str | None, now: float
    ) -> tuple[CloudTargetConfig | None, Denied | None]:
        if not self.settings.team_may_burst(req.identity.team):
            return None, Denied.TEAM
        if group is not None and group in self._failed_groups:
            return None, Denied.RETRY
        allowed = None if req.burst_targets is None else set(req.burst_targets)
        serving = [
            t for t in self.settings.targets if decision.model in t.models and (allowed is None or t.name in allowed)
        ]
        if not serving:
            return None, Denied.NO_TARGET
        first: Denied | None = None
        for t in serving:
            denied = self._reserve(req, decision, t, now)
            if denied is None:
                return t, None
            first = first or denied
        return None, first

    def _reserve(self, req: RouteRequest, decision: Decision, target: CloudTargetConfig, now: float) -> Denied | None:
        """Take ``target``'s slot and the team's spend hold for this request, or say why not (nothing taken)."""
        problem = self.cloud.unavailable(target.name, target.max_concurrency, now)
        if problem is not None:
            return Denied(problem)
        assert req.identity.team is not None
        output = req.max_tokens if req.max_tokens is not None else target.estimate_output_tokens
        if not self.spend.hold(decision.request_id, req.identity.team, target.cost_usd(decision.prompt_tokens, output)):
            return Denied.SPEND
        self.cloud.reserve(target.name, decision.request_id, now)
        return None

    def _deny(self, model: str, priority: str, denied: Denied) -> None:
        key = (model, priority, denied.value)
        self.denied[key] = self.denied.get(key, 0) + 1

    async def spend_checked(self, local: Decision, burst: Decision) -> Decision:
        """``burst`` (just returned by ``consider`` for ``local``), or ``local`` when the shared ledger says the
        team's cloud spend (with its holds) passed its limit. Reads the ledger (``LedgerSpend.refresh``, cached
        briefly) only here: for a request that would burst, never for a local decision."""
        key4, self._last_burst = self._last_burst, None
        pick = burst.cloud
        if pick is None or key4 is None or not isinstance(self.spend, LedgerSpend):
            return burst
        await self.spend.refresh(pick.team)
        if self.spend.within_limit(pick.team):
            return burst
        self.withdraw(burst)
        self.decisions[key4] -= 1
        self._deny(key4[0], key4[1], Denied.SPEND)
        note = f"would burst ({pick.reason}) but stays local: {Denied.SPEND.value.replace('_', ' ')}"
        return _noted(local, note)

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
    def withdraw(self, decision: Decision) -> None:
        """``decision`` (cloud, or a probe) is not carried out (the budget refused it): what it held is given back."""
        self.probes.withdraw(decision.request_id)
        if decision.cloud is not None:
            self.cloud.withdraw(decision.cloud.target, decision.request_id)
            self.spend.release(decision.request_id)

    def dispatched(self, decision: Decision) -> float:
        """A cloud decision is being sent; the seconds after which the Router ends it itself
        (``burst.targets[].timeout_s``)."""
        pick = decision.cloud
        assert pick is not None
        self.cloud.reserve(pick.target, decision.request_id, self._clock())  # (a decision ``dispatch``ed directly)
        target = self.settings.target(pick.target)
        return target.timeout_s if target is not None else 120.0

    def local_finished(self, request_id: str, achieved_s: float | None) -> None:
        """A local attempt ended (the Router calls only while ``probes.active``); ``achieved_s``: its first token, or
        its whole answer, after dispatch; None when it failed."""
        released = self.probes.finished(request_id, achieved_s)
        if released is not None:
            self.detector.release(*released, self._clock())

    def finished(
        self,
        decision: Decision,
        outcome: Outcome,
        *,
        first_token_s: float | None,
        group: str | None,
        identity: Identity | None = None,
    ) -> None:
        """A cloud attempt ended, however: its slot and spend hold are given back, the target's breaker learns,
        the spend is recorded, and a request the cloud failed before its first token is remembered (its retry goes
        local). ``first_token_s``: when its first token came, after dispatch (None: not seen). ``identity``: the
        key and user of its budget reservation, for the spend records."""
        pick = decision.cloud
        assert pick is not None
        self.cloud.finished(pick.target, decision.request_id, outcome, self._clock())
        self.spend.release(decision.request_id)
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
        if not outcome.ok and first_token_s is None and group is not None:
            self._failed_groups[group] = None
            while len(self._failed_groups) > FAILED_GROUPS_KEPT:
                self._failed_groups.popitem(last=False)


def _noted(decision: Decision, note: str) -> Decision:
    return replace(decision, reason=f"{decision.reason}; {note}" if decision.reason else note)


def _local_order(decision: Decision) -> tuple[str, ...]:
    if decision.endpoint is not None:
        return (decision.endpoint, *decision.fallbacks)
    ranked = sorted((c for c in decision.candidates if c.excluded is None), key=lambda c: c.predicted_ttft_s)
    return tuple(c.endpoint for c in ranked)
