"""What finished attempts teach: ``OutcomeLearning`` counts each end in ``RouterStats``, keeps its record (prediction
beside achievement) for ``cognitora explain`` and telemetry, and feeds the learners the placement reads back
(``cognitora.core.fleet_view``: the TTFT feedback, the outcome-learned rates of engines without metrics) and the
token agreement. The lifecycle (``cognitora.core.lifecycle``) hands it each attempt once, at its end.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from cognitora.config import CognitoraConfig
from cognitora.core.attempt import Attempt
from cognitora.core.fleet_view import FleetView
from cognitora.core.outcome import AttemptRecord, Outcome, OutcomeKind
from cognitora.telemetry import RouterStats, Telemetry
from cognitora.token_agreement import TokenAgreement
from cognitora.ttft_feedback import raw_ttft_s

__all__ = ["RECENT_OUTCOMES", "OutcomeLearning"]

log = logging.getLogger("cognitora.router")

RECENT_OUTCOMES = 256
"""How many finished attempts the lifecycle keeps for ``cognitora explain`` and metrics."""


class OutcomeLearning:
    """The learning side of the lifecycle. Call on the core's loop."""

    def __init__(
        self,
        config: CognitoraConfig,
        fleet: FleetView,
        *,
        clock: Callable[[], float],
        stats: RouterStats,
        telemetry: Telemetry,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self._clock = clock
        self.stats = stats
        self.telemetry = telemetry
        self.token_agreement = TokenAgreement()
        """The router's prompt-token counts against the engines' own (``usage.prompt_tokens``)."""
        self._outcomes: deque[AttemptRecord] = deque(maxlen=RECENT_OUTCOMES)

    def recent_outcomes(self) -> list[AttemptRecord]:
        """The last ``RECENT_OUTCOMES`` finished attempts, prediction beside achievement, oldest first."""
        return list(self._outcomes)

    def learn(self, attempt: Attempt, outcome: Outcome) -> None:
        """A finished attempt (the lifecycle's, once): count it, keep its record, and teach the learners."""
        decision = attempt.decision
        stats = self.stats
        if outcome.ok:
            stats.finished_ok += 1
        else:
            stats.finished_error += 1
        stats.finished_by_kind[outcome.kind.value] = stats.finished_by_kind.get(outcome.kind.value, 0) + 1
        if outcome.cached_tokens is not None:
            stats.hit_reports += 1
            stats.predicted_cached_tokens += decision.predicted_cached_tokens
            stats.achieved_cached_tokens += outcome.cached_tokens
        achieved_ttft = outcome.ttft_s
        if attempt.first_token_at is not None:
            achieved_ttft = attempt.first_token_at - attempt.dispatched_at
        if achieved_ttft is not None:
            stats.ttft_reports += 1
            stats.predicted_ttft_s += decision.predicted_ttft_s
            stats.achieved_ttft_s += achieved_ttft
            self._feed_back(attempt, achieved_ttft)
        if outcome.ok and attempt.endpoint in self.fleet.outcome_rates:
            self._learn_rates(attempt, outcome, achieved_ttft)
        engine_tokens, cloud = outcome.prompt_tokens, decision.cloud
        at_engine = cloud is None or cloud.target != attempt.endpoint  # a cloud's model counts its own way
        if engine_tokens is not None and decision.exact_keys and at_engine:
            self.token_agreement.observe(decision.model, attempt.endpoint, decision.prompt_tokens, engine_tokens)
        runner_up = decision.runner_up
        self._outcomes.append(
            AttemptRecord(
                request_id=decision.request_id,
                model=decision.model,
                endpoint=attempt.endpoint,
                kind=outcome.kind,
                status=outcome.status,
                prompt_tokens=outcome.prompt_tokens if outcome.prompt_tokens is not None else decision.prompt_tokens,
                completion_tokens=outcome.completion_tokens,
                predicted_cached_tokens=decision.predicted_cached_tokens,
                achieved_cached_tokens=outcome.cached_tokens,
                predicted_ttft_s=decision.predicted_ttft_s,
                achieved_ttft_s=achieved_ttft,
                runner_up=None if runner_up is None else runner_up.endpoint,
                runner_up_predicted_ttft_s=None if runner_up is None else runner_up.predicted_ttft_s,
                finished_at=self._clock(),
            )
        )
        self.telemetry.finished(self._outcomes[-1])
        if not outcome.ok and outcome.kind is not OutcomeKind.CLIENT_CANCELLED:
            log.info(
                "request %s on %s ended %s%s",
                decision.request_id,
                attempt.endpoint,
                outcome.kind.value,
                f": {outcome.detail}" if outcome.detail else "",
            )

    def _learn_rates(self, attempt: Attempt, outcome: Outcome, ttft_s: float | None) -> None:
        """An engine without metrics: its rates and cache reuse come from what its attempts achieved."""
        decision = attempt.decision
        score = next((c for c in decision.candidates if c.endpoint == attempt.endpoint), None)
        self.fleet.outcome_rates.observe(
            attempt.endpoint,
            queued_prefill_tokens=0.0 if score is None else score.queued_prefill_tokens,
            prompt_tokens=outcome.prompt_tokens if outcome.prompt_tokens is not None else decision.prompt_tokens,
            predicted_cached_tokens=decision.predicted_cached_tokens,
            cached_tokens=outcome.cached_tokens,
            ttft_s=ttft_s,
            completion_tokens=outcome.completion_tokens,
            e2e_s=time.monotonic() - attempt.dispatched_at,
        )

    def _feed_back(self, attempt: Attempt, achieved_ttft_s: float) -> None:
        """Teach the TTFT feedback what the model predicted for this endpoint before any correction."""
        decision = attempt.decision
        score = next((c for c in decision.candidates if c.endpoint == attempt.endpoint), None)
        factor = 1.0 if score is None else score.ttft_bias_factor
        raw = raw_ttft_s(decision.predicted_ttft_s, factor, self.config.cost_model.feedback.floor_s)
        self.fleet.feedback.observe(attempt.endpoint, raw, achieved_ttft_s, self._clock())
