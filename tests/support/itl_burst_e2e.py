"""What both gateways' burst tests share to show that a class over its ITL objective bursts: a long stream of a team
that may not burst decodes on the engine, and a streaming-class request of a team that may is sent until one is
answered by the cloud."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from bench.burst_load import Answer, chat

HOLD_TOKENS = 1500
"""The local stream: far longer than the scraper needs to measure the engine's decode step."""
STREAMING_CLASS = {"ttft_slo_s": 60.0, "itl_slo_s": 0.001, "sheddable": True}
"""An ITL objective (1 ms) below any decode step, and a TTFT one no request misses: only the ITL can burst it, and
the test does not depend on how fast this machine is."""


@dataclass
class ItlBurst:
    burst: Answer
    """The first streaming-class request the cloud answered."""
    local_before: int
    """Streaming-class requests answered locally before it (placed before the scraper measured the decode steps)."""


async def burst_while_a_stream_decodes(
    url: str,
    model: str,
    hold_headers: dict[str, str],
    streaming_headers: dict[str, str],
    cloud_marks: frozenset[str],
    deadline_s: float = 30.0,
) -> ItlBurst:
    async with httpx.AsyncClient(timeout=120) as client:
        hold_body = {
            "model": model,
            "messages": [{"role": "user", "content": "tell me a very long story about routers"}],
            "max_tokens": HOLD_TOKENS,
            "stream": True,
        }
        async with client.stream("POST", f"{url}/v1/chat/completions", json=hold_body, headers=hold_headers) as hold:
            assert hold.status_code == 200, await hold.aread()
            async for line in hold.aiter_lines():
                if line.startswith("data: {"):
                    break  # the first token: the stream decodes
            served_by = hold.headers.get("x-litellm-model-api-base") or hold.headers.get("x-cognitora-upstream-host")
            assert served_by not in cloud_marks, "the held stream went to the cloud"
            local, deadline, i = 0, time.monotonic() + deadline_s, 0
            while time.monotonic() < deadline:
                answer = await chat(client, url, streaming_headers, f"streaming-{i}", max_tokens=4, model=model)
                i += 1
                assert answer.status == 200, answer.error
                if answer.cloud(cloud_marks):
                    return ItlBurst(answer, local)
                local += 1
                await asyncio.sleep(0.1)
    raise AssertionError(f"no streaming request went to the cloud within {deadline_s:.0f} s ({local} local)")
