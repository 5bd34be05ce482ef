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

``cognitora explain`` asks the engines the same question directly (``engine_token_counts``: vLLM's ``POST /tokenize``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from cognitora.failsafe import RateLimitedLog

log = logging.getLogger("cognitora.tokens")

__all__ = ["TOKENIZE_ENGINES", "TokenAgreement", "TokenTally", "engine_token_counts", "mismatch_message"]

TOKENIZE_ENGINES = frozenset({"vllm"})
"""Engine kinds that count a prompt's tokens on request (``POST /tokenize``, as their completions would)."""


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


async def engine_token_counts(
    servers: Mapping[str, str],
    model: str,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    prompt: str | None = None,
    timeout_s: float = 2.0,
) -> dict[str, int | str]:
    """Each engine's own count of a prompt's tokens (``servers``: endpoint id -> server root), or why there is none:
    what ``cognitora explain`` sets beside the router's count."""
    body: dict[str, Any] = {"model": model}
    if messages is not None:
        body["messages"] = list(messages)
    else:
        body["prompt"] = prompt or ""

    async def ask(client: httpx.AsyncClient, url: str) -> int | str:
        try:
            r = await client.post(f"{url.rstrip('/')}/tokenize", json=body)
        except httpx.HTTPError as exc:
            return f"not reachable ({type(exc).__name__})"
        if r.status_code != 200:
            return f"POST /tokenize answered {r.status_code}"
        count = r.json().get("count") if r.headers.get("content-type", "").startswith("application/json") else None
        return count if isinstance(count, int) else "POST /tokenize gave no count"

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        answers = await asyncio.gather(*(ask(client, url) for url in servers.values()))
    return dict(zip(servers, answers, strict=True))
