"""What the real-engine tests send and read: prompts, one request through a gateway, an engine's own counters."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvstate.engines import ENGINES
from kvstate.engines.base import EngineLoad
from kvstate.engines.prom import parse_prometheus_text

WORDS = ["orbit", "comet", "nebula", "quasar", "planet", "lunar", "solar", "galaxy", "meteor", "pulsar", "zenith"]


def system_prompt(salt: str, words: int = 110) -> str:
    """A system prompt of ~``words`` x 5 tokens, distinct from its first words on for each ``salt``."""
    rng = random.Random(salt)
    body = " ".join(f"{rng.choice(WORDS)}-{rng.randrange(10_000)}" for _ in range(words))
    return f"Assistant {salt}: answer briefly. Reference notes: {body}."


def question(salt: str, n: int) -> str:
    return f"Question {n} ({salt}): which of the notes above mentions a comet?"


def messages(salt: str, n: int, words: int = 110) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system_prompt(salt, words)},
        {"role": "user", "content": question(salt, n)},
    ]


def engine_load(url: str) -> EngineLoad:
    """The engine's own ``/metrics``, read as the collector's scraper reads it."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return ENGINES.get("vllm").load_from(parse_prometheus_text(text))


def prefix_cache_hits(url: str) -> float:
    hits = engine_load(url).prefix_cache_hits_total
    assert hits is not None, f"{url}/metrics has no vllm:prefix_cache_hits_total"
    return hits


@dataclass
class Reply:
    status: int
    engine: str
    """The endpoint id (``host:port``) that answered, as the gateway reports it."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    ttft_s: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class GatewayClient:
    """One gateway as a client sees it: where to send, with which key and model name, and how it names engines."""

    name: str
    url: str
    model: str
    headers: dict[str, str]
    engine_header: str

    def engine_of(self, response: httpx.Response) -> str:
        raw = response.headers.get(self.engine_header, "")
        return raw.removeprefix("http://").removesuffix("/v1")

    def send(self, path: str, body: dict[str, Any], timeout_s: float = 120.0) -> Reply:
        """POST ``body`` (model filled in) to ``path``; streamed when ``body["stream"]``, usage read either way."""
        body = {"model": self.model, **body}
        started = time.monotonic()
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout_s) as client:
            if not body.get("stream"):
                r = client.post(path, json=body)
                reply = Reply(r.status_code, self.engine_of(r), ttft_s=time.monotonic() - started)
                if r.status_code != 200:
                    reply.error = r.text
                    return reply
                reply.body = r.json()
                choice = reply.body["choices"][0]
                reply.text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
                _usage(reply, reply.body.get("usage") or {})
                return reply
            body["stream_options"] = {"include_usage": True}
            with client.stream("POST", path, json=body) as r:
                reply = Reply(r.status_code, self.engine_of(r))
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                        if piece and not reply.text:
                            reply.ttft_s = time.monotonic() - started
                        reply.text += piece
                    if chunk.get("usage"):
                        _usage(reply, chunk["usage"])
                if r.status_code != 200:
                    reply.error = r.read().decode(errors="replace")
                return reply


def _usage(reply: Reply, usage: dict[str, Any]) -> None:
    reply.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    reply.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
