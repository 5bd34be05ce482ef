"""What both gateways' flow-control tests share (tests/e2e/test_flow_*_e2e.py): one simulated engine that Cognitora
knows has one seat (``cost.max_num_seqs: 1``), so while a long stream holds it every other request waits in the
gateway. A burst of requests of three classes is sent while the stream runs, each one sent once the gateway's
``/metrics`` shows the one before it waiting; a request of a class with a short ``max_wait_s`` gets 429 with
Retry-After; a client that gives up leaves the queue (the depth on ``/metrics`` drops); when the stream ends the
queue is served one request at a time, in band order (interactive, default, batch; first come first served within
a band of one team).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

HOLD_TOKENS = 4000
"""The stream that holds the seat (~10 ms a token on the simulated engine): long enough for the burst, the timeout
and the disconnect to happen meanwhile on a loaded machine (1,200 tokens were not, behind LiteLLM, once in three)."""
PRIORITIES = {
    "interactive": {"ttft_slo_s": 30.0},
    "default": {"ttft_slo_s": 60.0},
    "batch": {"ttft_slo_s": 120.0},
    "scavenger": {"ttft_slo_s": 240.0},
}
FLOW_CONTROL = {
    "classes": {
        "interactive": {"max_wait_s": 150},
        "default": {"max_wait_s": 150},
        "batch": {"max_wait_s": 150},
        "scavenger": {"max_wait_s": 1},
    }
}
BURST = (("b1", "batch"), ("d1", "default"), ("b2", "batch"), ("i1", "interactive"), ("d2", "default"))
"""Sent in this order while the seat is held; served in band order."""
SERVED_ORDER = ["i1", "d1", "d2", "b1", "b2"]
DEADLINE_S = 30.0


@dataclass
class Seen:
    order: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    timeout: httpx.Response | None = None
    depth_with_leaver: int = 0
    depth_after_leaver: int = 0
    hold_tokens: int = 0
    page: str = ""
    """The metrics page once every request of the burst was answered."""


def queue_depth(page: str) -> int:
    """Requests waiting, summed over bands and flows, from a metrics page."""
    return int(sum(float(v) for v in re.findall(r"^cognitora_flow_queue_depth\{[^}]*\} (\S+)$", page, re.M)))


async def until_depth(client: httpx.AsyncClient, metrics_url: str, n: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        page = (await client.get(metrics_url)).text
        if queue_depth(page) == n:
            return
        assert time.monotonic() < deadline, f"the queue never held {n} (now {queue_depth(page)})"
        await asyncio.sleep(0.05)


def gauge(page: str, name: str, band: str | None = None) -> float:
    """The one sample of gauge ``name`` (of ``band``) on a metrics page; fails when it is not served."""
    labels = "" if band is None else f'\\{{band="{band}"\\}}'
    found = re.findall(rf"^{name}{labels} (\S+)$", page, re.M)
    assert len(found) == 1, f"{name} {band or ''}: {found} in\n{page}"
    return float(found[0])


def body(model: str, text: str, max_tokens: int = 4, stream: bool = False) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": stream}


async def burst_behind_a_held_seat(
    url: str,
    model: str,
    metrics_url: str,
    headers_of: Callable[[str], dict[str, str]],
    *,
    with_leaver: bool = True,
) -> Seen:
    """``headers_of(priority class)``: the headers of a client whose trusted identity carries that class.
    ``with_leaver``: a client also gives up while waiting, and the depth must drop (Envoy cancels the stream; the
    LiteLLM proxy does not reliably cancel a non-streaming call whose client left: docs/flow_control.md)."""
    seen = Seen()
    chat = f"{url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=120) as client:
        hold_body = body(model, "tell me a very long story about queues", HOLD_TOKENS, stream=True)
        async with client.stream("POST", chat, json=hold_body, headers=headers_of("default")) as hold:
            assert hold.status_code == 200, await hold.aread()
            lines = hold.aiter_lines()
            async for line in lines:
                if line.startswith("data: {"):
                    break  # the first token: the seat is taken

            async def one(tag: str, priority: str) -> None:
                r = await client.post(chat, json=body(model, f"burst request {tag}"), headers=headers_of(priority))
                seen.statuses[tag] = r.status_code
                seen.order.append(tag)

            tasks = []
            for n, (tag, priority) in enumerate(BURST, start=1):
                tasks.append(asyncio.ensure_future(one(tag, priority)))
                await until_depth(client, metrics_url, n)
            seen.timeout = await client.post(chat, json=body(model, "may wait 1 s"), headers=headers_of("scavenger"))
            await until_depth(client, metrics_url, len(BURST))
            if with_leaver:
                leaver = asyncio.ensure_future(
                    client.post(chat, json=body(model, "I will not wait"), headers=headers_of("default"))
                )
                await until_depth(client, metrics_url, len(BURST) + 1)
                seen.depth_with_leaver = len(BURST) + 1
                leaver.cancel()  # the client closes its connection
                await until_depth(client, metrics_url, len(BURST))
                seen.depth_after_leaver = len(BURST)
            async for line in lines:
                if line.startswith("data: {") and '"content"' in line:
                    seen.hold_tokens += 1
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
    async with httpx.AsyncClient(timeout=30) as client:
        seen.page = (await client.get(metrics_url)).text
    return seen


def check(seen: Seen, *, with_leaver: bool = True) -> None:
    assert seen.statuses == dict.fromkeys(SERVED_ORDER, 200), seen.statuses
    assert seen.order == SERVED_ORDER
    refusal = seen.timeout
    assert refusal is not None and refusal.status_code == 429, None if refusal is None else refusal.text
    assert "max_wait_s of class 'scavenger'" in refusal.json()["error"]["message"], refusal.text
    assert int(refusal.headers["retry-after"]) >= 1
    if with_leaver:
        assert seen.depth_with_leaver == len(BURST) + 1
        assert seen.depth_after_leaver == seen.depth_with_leaver - 1
    # What flow control learned is served too: fewer than min_samples (10) requests were timed, so no margin yet;
    # the gaps between each band's requests as sent (batch: b1, b2; interactive: i1 alone).
    assert gauge(seen.page, "cognitora_flow_prediction_margin_samples") < 10
    assert gauge(seen.page, "cognitora_flow_prediction_margin") == 1.0
    assert gauge(seen.page, "cognitora_flow_band_gaps", "batch") == 1
    assert gauge(seen.page, "cognitora_flow_band_gaps", "interactive") == 0
    assert gauge(seen.page, "cognitora_flow_band_gaps", "default") >= 2  # the stream, d1, d2 (and the leaver)
    for band in PRIORITIES:
        assert gauge(seen.page, "cognitora_flow_band_arrival_rate", band) >= 0
