"""Flow control on a fleet whose running requests share a long prefix (the 32 x 32 shared-prefix ladder): the KV
those requests hold is their prefix once plus what each adds, so a request of the same group that fits is
placed at once, not held "for KV room" until it is shed (docs/flow_control.md, "The rerun, and what it found")."""

from __future__ import annotations

import asyncio
import time

from cognitora.config import config_from_dict
from cognitora.core.router import Router
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot

A = "127.0.0.1:8001"
SYSTEM = "You are the support assistant of a company that sells many things. " * 150
"""~2,000 tokens: the group's shared system prompt."""


def member(i: int) -> RouteRequest:
    question = f"Question {i}: " + " ".join(f"w{i}x{j}" for j in range(120))
    return RouteRequest(model="m", prompt=SYSTEM + question, request_id=f"r{i}", max_tokens=256)


async def test_a_group_sharing_its_prefix_is_not_held_for_kv_it_does_not_hold() -> None:
    endpoint = {"url": f"http://{A}", "cost": {"max_num_seqs": 512, "kv_capacity_tokens": 300_000}}
    config = config_from_dict({"models": [{"name": "m", "endpoints": [endpoint]}], "flow_control": {}})
    store = MemoryStore()
    snap = EndpointSnapshot(
        endpoint=A, last_seen=time.time(), mean_service_s=13.0, prefill_tokens_per_s=10_000.0, kv_usage=0.33
    )
    await store.put_snapshot(snap)
    router = Router(config, store)
    for i in range(140):  # the group's requests in flight there, each ~2,300 prompt tokens
        decision, attempt = await asyncio.wait_for(router.admit(member(i)), 5)
        assert attempt is not None, decision.explain()
        attempt.first_token()  # its prefill is done: it decodes, holding its seat and its KV
    counted = sum(router.fleet.local.context([A], {}).tokens.values())
    assert counted > 0.97 * 300_000  # their context: what their steps read, over the KV the engine has
    decision, attempt = await asyncio.wait_for(router.admit(member(999)), 5)
    assert attempt is not None, decision.explain()
    pick = next(c for c in decision.candidates if c.endpoint == A)
    assert pick.kv_pressure_s == 0.0, decision.explain()
    assert router.flow is not None and router.flow.controller.snapshot().waiting == 0
