"""Does the router count a prompt's tokens as the engine does? Checked on every answer that reports usage.

Block keys are token-exact only if the router tokenizes a prompt exactly as the engine: the same ``tokenizer.json``
and the same chat template. When they differ, the engine's KV events never match the router's keys, placement falls
back to routing history, and nothing fails. This is the loud part: each finished attempt with the engine's own
``usage.prompt_tokens`` is compared with the router's count from the same decision (only when the router's count was
token-exact), and a disagreement is

- logged as a warning naming the likely cause, at most once a minute per model and endpoint;
- counted for ``/metrics`` (``cognitora_prompt_token_checks_total`` and ``cognitora_prompt_token_mismatches_total``
  by model and endpoint, ``cognitora_prompt_token_mismatch_last`` with the last engine-minus-router difference), which
  the dashboard turns into a visible warning.

``cognitora explain`` asks the engines the same question directly (vLLM's and SGLang's ``POST /tokenize``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cognitora.failsafe import RateLimitedLog

log = logging.getLogger("cognitora.tokens")

__all__ = ["TokenAgreement", "TokenTally", "mismatch_message"]


def mismatch_message(model: str, endpoint: str, router_tokens: int, engine_tokens: int) -> str:
    """The sentence every report uses: what disagrees, and what to check."""
    return (
        f"router counts {router_tokens} prompt tokens, engine {engine_tokens} (model {model}, endpoint {endpoint}): "
        f"is models[].tokenizer the engine's tokenizer and chat template? Until they agree, block keys never match "
        "the engine's KV events and placement ignores its cache"
    )


@dataclass
class TokenTally:
    """One (model, endpoint)'s comparisons."""

    checks: int = 0
    mismatches: int = 0
    last_difference: int = 0
    """Engine minus router, at the last comparison (0 when they agreed)."""
    last_router_tokens: int = 0
    last_engine_tokens: int = 0


@dataclass
class TokenAgreement:
    """The comparisons of one process's router, by (model, endpoint)."""

    clock: Callable[[], float] = time.monotonic
    tallies: dict[tuple[str, str], TokenTally] = field(default_factory=dict)
    _logs: dict[tuple[str, str], RateLimitedLog] = field(default_factory=dict)

    def observe(self, model: str, endpoint: str, router_tokens: int, engine_tokens: int) -> bool:
        """Record one answer; True when the counts agree."""
        key = (model, endpoint)
        tally = self.tallies.setdefault(key, TokenTally())
        tally.checks += 1
        tally.last_difference = engine_tokens - router_tokens
        tally.last_router_tokens, tally.last_engine_tokens = router_tokens, engine_tokens
        if engine_tokens == router_tokens:
            return True
        tally.mismatches += 1
        rate_limited = self._logs.setdefault(key, RateLimitedLog(log, clock=self.clock))
        rate_limited.warning(mismatch_message(model, endpoint, router_tokens, engine_tokens))
        return False

    def mismatched(self) -> dict[tuple[str, str], TokenTally]:
        """The (model, endpoint) pairs whose last comparison disagreed."""
        return {k: t for k, t in self.tallies.items() if t.last_difference != 0}
