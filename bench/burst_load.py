"""The load the burst end-to-end tests and bench/burst_ladder.py drive: streamed chat requests with unique
~500-token prompts, timed to their first token at the client, and told apart by who answered (engine or cloud)."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

CLOUD_MODEL = "gpt-4o-mini"
"""The simulated cloud's name for the local model (it echoes the model it was asked for)."""


@dataclass
class Answer:
    status: int
    ttft_s: float | None
    served_by: str
    """Who answered: LiteLLM's ``x-litellm-model-api-base`` header, or Envoy's ``x-cognitora-upstream-host`` (the
    address that answered, after any retry), else the answer's ``model``."""
    error: str = ""
    model_field: str = ""
    """The ``model`` of the answer's chunks."""

    def cloud(self, marks: frozenset[str]) -> bool:
        return self.served_by in marks


def prompt(seed: str, words: int = 120) -> str:
    rng = random.Random(seed)
    return "Summarize these notes: " + " ".join(f"note{rng.randrange(1_000_000)}" for _ in range(words))


async def chat(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    seed: str,
    max_tokens: int = 24,
    model: str = "chat",
    words: int = 120,
) -> Answer:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt(seed, words)}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    started = time.monotonic()
    ttft: float | None = None
    served = ""
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            return Answer(resp.status_code, None, "", (await resp.aread()).decode(errors="replace")[:300])
        # LiteLLM names the deployment's api_base; Envoy (expose_upstream_host) the address that answered.
        api_base = resp.headers.get("x-litellm-model-api-base") or resp.headers.get("x-cognitora-upstream-host", "")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            served = served or chunk.get("model", "")
            choices = chunk.get("choices") or []
            if ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                ttft = time.monotonic() - started
    return Answer(200, ttft, api_base or served, model_field=served)


async def closed_loop(
    url: str,
    headers: dict[str, str],
    workers: int,
    requests: int,
    tag: str,
    max_tokens: int = 24,
    model: str = "chat",
) -> list[Answer]:
    """``requests`` requests from ``workers`` concurrent clients, each sending its next when the last is done."""
    counter = iter(range(requests))
    answers: list[Answer] = []

    async def worker(client: httpx.AsyncClient) -> None:
        for i in counter:
            try:
                answers.append(await chat(client, url, headers, f"{tag}-{i}", max_tokens, model))
            except httpx.HTTPError as exc:
                answers.append(Answer(0, None, "", f"{type(exc).__name__}: {exc}"))

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(workers)))
    return answers


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)] if ordered else float("nan")


TTFT_FAMILY = "vllm:time_to_first_token_seconds"


def engine_ttft_counts(metrics_url: str, bound: float) -> tuple[float, float]:
    """(requests with a first token, of which within ``bound`` s) summed over the engines on the page: the
    engine's own TTFT histogram (queue + prefill), without the gateway's overhead on this shared machine."""
    text = httpx.get(metrics_url, timeout=10).text
    total = within = 0.0
    for line in text.splitlines():
        if line.startswith(f"{TTFT_FAMILY}_count"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{TTFT_FAMILY}_bucket") and f'le="{bound}"' in line:
            within += float(line.rsplit(" ", 1)[1])
    return total, within
