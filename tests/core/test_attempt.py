"""The core's request lifecycle (``cognitora.attempt``) over both real stores: once each, in order, from any
thread; health decided from the outcome; nothing left counted when a gateway never reports an end."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import InFlight, Store

A, B, C = "127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"
MODEL = "smollm2"
SYSTEM = "You are a careful assistant for the Cognitora project. " * 40


def make_config(smollm2_dir: Path, **placement: Any) -> CognitoraConfig:
    return config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0, **placement},
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": f"http://{e}"} for e in (A, B, C)],
                }
            ],
        }
    )


def chat(question: str = "What is a KV cache?", **extra: Any) -> RouteRequest:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return RouteRequest(model=MODEL, messages=messages, **extra)


async def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


async def test_admit_counts_at_once_and_the_end_is_taken_once_whoever_reports_it(
    smollm2_dir: Path, store: Store
) -> None:
    router = Router(make_config(smollm2_dir), store)
    decision, attempt = await router.admit(chat(max_tokens=40, candidates=[A]))
    assert attempt is not None and attempt.endpoint == A
    # Counted before any await: the very next placement sees A's queue.
    nxt = await router.place(chat("Another question entirely", candidates=[A, B]))
    assert {c.endpoint: c.queued_prefill_tokens for c in nxt.candidates}[A] == decision.prompt_tokens
    await attempt.settled()
    assert (await store.inflight([A]))[A] == InFlight(1, decision.prompt_tokens, 40)

    attempt.first_token()
    attempt.first_token()
    await attempt.settled()
    assert (await store.inflight([A]))[A] == InFlight(1, 0, 40)

    # LiteLLM fires several hooks for one end, some on worker threads: the first finish wins.
    won = Outcome(OutcomeKind.COMPLETED, prompt_tokens=decision.prompt_tokens, cached_tokens=7)
    threads = [
        threading.Thread(target=attempt.finish, args=(won if i == 0 else Outcome(OutcomeKind.FAILED),))
        for i in range(6)
    ]
    threads[0].start()
    threads[0].join()
    for t in threads[1:]:
        t.start()
    for t in threads[1:]:
        t.join()

    async def released() -> bool:
        return router.attempt(decision.request_id) is None

    await wait_for(released, 5.0, "the finish to reach the router's loop")
    await attempt.settled()
    assert (await store.inflight([A]))[A] == InFlight()
    assert router.stats.finished_ok == 1 and router.stats.finished_error == 0
    assert router.stats.finished_by_kind == {"completed": 1}
    (record,) = router.recent_outcomes()
    assert record.kind is OutcomeKind.COMPLETED and record.achieved_cached_tokens == 7
    assert record.achieved_ttft_s is not None and record.achieved_ttft_s >= 0
    assert record.predicted_ttft_s == decision.predicted_ttft_s
    attempt.first_token()  # after the finish: ignored
    assert router.open_attempts() == []


@pytest.mark.parametrize(
    ("outcome", "marked"),
    [
        (Outcome(OutcomeKind.CONNECT_FAILED, detail="connection refused"), True),
        (Outcome(OutcomeKind.UPSTREAM_ERROR, status=503, detail="HTTP 503"), True),
        (Outcome(OutcomeKind.UPSTREAM_ERROR, status=500, detail="HTTP 500"), False),
        (Outcome(OutcomeKind.TIMEOUT, detail="no answer in 30 s"), False),
        (Outcome(OutcomeKind.CLIENT_CANCELLED), False),
        (Outcome(OutcomeKind.REJECTED, status=400), False),
    ],
)
async def test_the_core_decides_from_the_outcome_whether_the_endpoint_is_gone(
    smollm2_dir: Path, outcome: Outcome, marked: bool
) -> None:
    store = MemoryStore()
    router = Router(make_config(smollm2_dir), store)
    _, attempt = await router.admit(chat(candidates=[A]))
    assert attempt is not None
    attempt.finish(outcome)
    after = await router.place(chat())
    excluded = {c.endpoint: c.excluded for c in after.candidates}
    if marked:
        assert excluded[A] is not None and excluded[A].startswith("marked unhealthy"), after.explain()
        assert after.endpoint != A
        # ... and the mark is shared: another gateway replica on the same store skips A too.
        await attempt.settled()
        replica = await Router(make_config(smollm2_dir), store).place(chat(candidates=[A, B]))
        assert replica.endpoint == B
    else:
        assert excluded[A] is None, after.explain()
    assert (await store.inflight([A]))[A] == InFlight()


async def test_a_first_token_never_reported_stops_counting_as_queued_after_its_deadline(
    smollm2_dir: Path, store: Store
) -> None:
    router = Router(make_config(smollm2_dir, prefill_report_min_s=0.3, prefill_report_factor=1.0), store)
    decision, attempt = await router.admit(chat(max_tokens=10, candidates=[A]))
    assert attempt is not None and decision.prompt_tokens > 0
    await attempt.settled()
    assert (await store.inflight([A]))[A].prefill_tokens == decision.prompt_tokens

    async def prefill_dropped() -> bool:
        await attempt.settled()
        local = await router.place(chat("unrelated", candidates=[A]))
        return (await store.inflight([A]))[A].prefill_tokens == 0 and local.candidates[0].queued_prefill_tokens == 0

    await wait_for(prefill_dropped, 5.0, "the prefill deadline")
    assert (await store.inflight([A]))[A].requests == 1  # still running: only its prefill stopped counting
    attempt.finish(Outcome(OutcomeKind.COMPLETED))
    await attempt.settled()
    assert (await store.inflight([A]))[A] == InFlight()
    (record,) = router.recent_outcomes()
    assert record.achieved_ttft_s is None  # a deadline is not a measured first token


async def test_a_retry_of_a_request_ends_its_unreported_attempts(smollm2_dir: Path, store: Store) -> None:
    router = Router(make_config(smollm2_dir), store)
    _, first = await router.admit(chat(candidates=[A]), group="trace-1")
    _, other = await router.admit(chat("unrelated", candidates=[C]), group="trace-2")
    _, retry = await router.admit(chat(candidates=[B]), group="trace-1")
    assert first is not None and other is not None and retry is not None
    assert first.outcome is not None and first.outcome.kind is OutcomeKind.ABANDONED
    assert other.outcome is None and retry.outcome is None
    for attempt in (first, other, retry):  # each attempt's store writes land on its own chain
        await attempt.settled()
    inflight = await store.inflight([A, B, C])
    assert inflight[A] == InFlight() and inflight[B].requests == 1 and inflight[C].requests == 1
    assert {a.request_id for a in router.open_attempts()} == {other.request_id, retry.request_id}


async def test_an_attempt_whose_end_never_comes_is_finished_after_its_lease(smollm2_dir: Path) -> None:
    store = MemoryStore()
    router = Router(make_config(smollm2_dir, inflight_ttl_s=0.2), store)
    _, lost = await router.admit(chat(candidates=[A]))
    assert lost is not None

    async def pruned() -> bool:
        await router.admit(chat("keep the router busy", candidates=[B]))
        return lost.outcome is not None

    await wait_for(pruned, 5.0, "the lost attempt's lease to end")
    assert lost.outcome is not None and lost.outcome.kind is OutcomeKind.ABANDONED
    assert router.attempt(lost.request_id) is None


async def test_a_reroute_moves_the_count_and_marks_the_unreachable_pick(smollm2_dir: Path, store: Store) -> None:
    router = Router(make_config(smollm2_dir), store)
    decision, attempt = await router.admit(chat(max_tokens=5))
    assert attempt is not None and decision.endpoint is not None
    assert len(decision.fallbacks) == 2 and decision.endpoint not in decision.fallbacks
    picked, served = decision.endpoint, decision.fallbacks[0]
    moved = attempt.rerouted(served, Outcome(OutcomeKind.CONNECT_FAILED, detail="Envoy retried elsewhere"))
    assert moved.endpoint == served and moved is router.attempt(moved.request_id)
    assert moved.dispatched_at == attempt.dispatched_at  # the client has waited since the first dispatch
    await attempt.settled()
    await moved.settled()
    inflight = await store.inflight([picked, served])
    assert inflight[picked] == InFlight() and inflight[served].requests == 1
    assert (await router.place(chat())).endpoint != picked
    moved.finish(Outcome(OutcomeKind.COMPLETED))
    await moved.settled()
    assert (await store.inflight([served]))[served] == InFlight()


async def test_fallbacks_follow_the_cores_ranking_key(smollm2_dir: Path) -> None:
    store = MemoryStore()
    router = Router(make_config(smollm2_dir), store)
    # B holds the prompt; C is loaded: the ranking (TTFT + recompute charge) puts B, then A, then C.
    keys = (await router.place(chat())).keys
    await store.add_blocks(MODEL, B, list(keys))
    await router.admit(chat("a long unrelated prompt " * 200, candidates=[C]))
    decision = await router.place(chat())
    assert decision.endpoint == B, decision.explain()
    assert decision.fallbacks == (A, C)
