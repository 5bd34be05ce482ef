"""Admission that is exact under load, through ``Router.admit`` on a real ``redis-server`` of this module's own
(paused on purpose with ``CLIENT PAUSE ... WRITE``, which holds every write, the budget scripts included, exactly
as a loaded server or a loaded gateway delays them):

- a store slower than ``placement.store_timeout_s`` is waited for, never admitted past the cap (fail-open is for an
  unreachable store only);
- slower than ``budgets.reserve_timeout_s``: a 503 with Retry-After, and the reservation that lands afterwards is
  given back (a refused request is charged nothing, with ``fail_open`` and with ``fail_closed``);
- a request cancelled while its reservation is out gives it back;
- the estimate covers every prompt of a completions batch, ``n`` and ``best_of``, by surface;
- requests without a team meet the anonymous budget (``budgets.anonymous``, else ``defaults.team``);
- a budget rejection's decision (and its log line) names the budget, not a placement reason.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.harness.redis_server import private_redis
from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.identity import Identity
from cognitora.request import InvalidRequest, RouteRequest, Surface, read_choices
from kvstate.memory_store import MemoryStore
from kvstate.redis_store import RedisStore

MODEL = "smollm2"
MAX_TOKENS = 50


@pytest.fixture(scope="module")
def own_redis() -> Iterator[str]:
    """A Redis nobody else uses: these tests pause it."""
    with private_redis() as url:
        yield url


def make_config(
    smollm2_dir: Path, budgets: dict[str, Any], redis_url: str | None = None, **top: Any
) -> CognitoraConfig:
    data: dict[str, Any] = {
        # The production default: a fleet read slower than this degrades; a reservation must not.
        "placement": {"store_timeout_s": 0.25},
        **top,
        "budgets": budgets,
        "models": [
            {
                "name": MODEL,
                "tokenizer": str(smollm2_dir / "tokenizer.json"),
                "endpoints": [{"url": "http://127.0.0.1:18001"}, {"url": "http://127.0.0.1:18002"}],
            }
        ],
    }
    if redis_url is not None:
        data["redis_url"] = redis_url
    return config_from_dict(data)


def team_limit(total: int, **more: Any) -> dict[str, Any]:
    return {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": total}]}}, **more}


def ask(team: str | None = "alpha", **fields: Any) -> RouteRequest:
    fields.setdefault("messages", [{"role": "user", "content": "What is a KV cache, in one line?"}])
    fields.setdefault("max_tokens", MAX_TOKENS)
    return RouteRequest(model=MODEL, team=team, **fields)


@pytest.fixture
async def redis_router(smollm2_dir: Path, own_redis: str, key_prefix: str) -> AsyncIterator[Any]:
    """A factory of Routers on ``own_redis`` (closed at the end)."""
    made: list[Router] = []

    def make(budgets: dict[str, Any], **top: Any) -> Router:
        config = make_config(smollm2_dir, budgets, own_redis, key_prefix=key_prefix, **top)
        router = Router(config, RedisStore.from_url(own_redis, key_prefix=key_prefix))
        made.append(router)
        return router

    yield make
    for router in made:
        await router.close()


def pause_writes(url: str, ms: int) -> threading.Event:
    """``CLIENT PAUSE ms WRITE`` on the server; the event is set once the pause is over."""
    with redis.Redis.from_url(url) as client:
        client.execute_command("CLIENT", "PAUSE", ms, "WRITE")
    over = threading.Event()
    threading.Timer(ms / 1000 + 0.05, over.set).start()
    return over


async def counted(router: Router, team: str | None = "alpha") -> int:
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    r = gate.planner.plan("-", Identity(team=team), MODEL, gate.planner.usage(MODEL, 0, 0))
    values = await gate.ledger.counter_values([c for c in r.counters if c.subject_kind.value == "team"], _now_ms())
    return sum(values)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def prompt_tokens(router: Router, request: RouteRequest) -> int:
    return (await router.place(request)).prompt_tokens


async def warm_up(router: Router) -> None:
    """One request admitted and finished: connections open, scripts loaded, as in a gateway that is running."""
    decision, attempt = await router.admit(ask(team="warm-up"))
    assert attempt is not None, decision.explain()
    attempt.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=decision.prompt_tokens, completion_tokens=1))
    assert router.budgets is not None
    await router.budgets.drain()


async def until(over: threading.Event) -> None:
    while not over.is_set():
        await asyncio.sleep(0.02)


# -- a slow store is waited for ---------------------------------------------------------------------------------


async def test_a_store_slower_than_the_store_timeout_never_admits_past_the_cap(redis_router: Any) -> None:
    """40 concurrent requests against a cap for 10, while Redis holds every write for 0.6 s (more than
    ``store_timeout_s``): exactly 10 admitted, the counter at the cap, no fail-open."""
    probe = redis_router(team_limit(10**9))
    each = await prompt_tokens(probe, ask()) + MAX_TOKENS
    router = redis_router(team_limit(10 * each))
    await warm_up(router)
    over = pause_writes(router.config.redis_url or "", 600)
    started = time.monotonic()
    results = await asyncio.gather(*(router.admit(ask()) for _ in range(40)))
    waited = time.monotonic() - started
    await until(over)
    admitted = [a for _, a in results if a is not None]
    refused = [d.rejection for d, a in results if a is None]
    gate = router.budgets
    assert gate is not None
    assert gate.stats.fail_open == 0
    assert len(admitted) == 10, [r.message if r else None for r in refused][:3]
    assert waited >= 0.45, "the pause did not hold the reservations: the test proves nothing"
    assert all(r is not None and r.status == 429 for r in refused)
    assert await counted(router) == 10 * each


async def test_a_reservation_sent_again_after_a_read_timeout_counts_once(redis_router: Any) -> None:
    """Redis holds writes for 2.5 s, past the ledger's 1 s read timeout (and redis-py's one retry): the batch is
    sent again, within ``reserve_timeout_s``, and the request is admitted and counted once, not twice."""
    router = redis_router(team_limit(10**6))
    await warm_up(router)
    each = await prompt_tokens(router, ask()) + MAX_TOKENS
    over = pause_writes(router.config.redis_url or "", 2500)
    decision, attempt = await router.admit(ask())
    assert attempt is not None, decision.explain()
    await until(over)
    gate = router.budgets
    assert gate is not None
    assert await counted(router) == each and await gate.ledger.open_reservations() == 1
    assert gate.stats.fail_open == 0


@pytest.mark.parametrize("on_store_error", ["fail_open", "fail_closed"])
async def test_slower_than_reserve_timeout_is_a_503_and_charges_nothing(redis_router: Any, on_store_error: str) -> None:
    """Past ``budgets.reserve_timeout_s`` the request is refused (503, Retry-After), whatever ``on_store_error``
    says: the store is up, only slow. The reservation the paused script makes afterwards is given back, so the
    refused request is charged nothing, even once its lease would have run out."""
    router = redis_router(team_limit(10**6, on_store_error=on_store_error, reserve_timeout_s=0.3, reservation_ttl_s=1))
    await warm_up(router)
    over = pause_writes(router.config.redis_url or "", 1200)
    decision, attempt = await router.admit(ask())
    assert attempt is None and decision.rejection is not None
    assert decision.rejection.status == 503 and decision.rejection.retry_after_s == 1
    assert "budgets.reserve_timeout_s" in decision.rejection.message
    await until(over)
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    # Past the refused request's lease: a reservation left open would now be settled at its estimate.
    time.sleep(1.1)
    settled, served = await router.admit(ask(team="beta"))
    assert served is not None, settled.explain()
    assert await counted(router) == 0
    day = await gate.ledger.days([gate.planner.plan("-", Identity(), MODEL, gate.planner.usage(MODEL, 0, 0)).day])
    rows = next(iter(day.values()), {})
    assert rows.get(f"team\talpha\t{MODEL}\trequests", 0) == 0
    assert rows.get(f"team\talpha\t{MODEL}\tinput_tokens", 0) == 0
    assert gate.stats.fail_open == 0 and gate.stats.refused.get(("alpha", "store_slow")) == 1


async def test_a_request_cancelled_while_reserving_gives_its_reservation_back(redis_router: Any) -> None:
    """The client goes away while its reservation waits on the store; the reservation lands later and is given
    back (a store timeout long enough that the reservation is not simply abandoned on the wire)."""
    router = redis_router(team_limit(10**6), placement={"store_timeout_s": 5.0})
    await warm_up(router)
    over = pause_writes(router.config.redis_url or "", 800)
    task = asyncio.ensure_future(router.admit(ask()))
    await asyncio.sleep(0.2)  # the reservation is out, held by the paused server
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(over)
    gate = router.budgets
    assert gate is not None
    await gate.drain()
    assert await counted(router) == 0
    assert await gate.ledger.open_reservations() == 0


# -- what a request reserves ------------------------------------------------------------------------------------


async def test_the_estimate_covers_every_prompt_of_a_batch_n_and_best_of(smollm2_dir: Path) -> None:
    router = Router(make_config(smollm2_dir, team_limit(2_000)), MemoryStore())
    gate = router.budgets
    assert gate is not None
    questions = [f"Question {i}: what is a KV cache?" for i in range(40)]

    # 40 prompts x 100 tokens can never fit a 2,000-token cap: told so, with what to lower.
    decision, attempt = await router.admit(ask(messages=None, prompt=questions, max_tokens=100))
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 400
    assert "budgets.teams.alpha.limits[0].total_tokens" in decision.rejection.message
    assert f"needs {decision.prompt_tokens + 40 * 100:,} total_tokens" in decision.rejection.message

    async def reserved(request: RouteRequest) -> int:
        before = await counted(router)
        decision, attempt = await router.admit(request)
        assert attempt is not None, decision.explain()
        return await counted(router) - before - decision.prompt_tokens

    assert await reserved(ask(messages=None, prompt=questions[:10], max_tokens=10)) == 10 * 10
    assert await reserved(ask(n=3, max_tokens=10)) == 3 * 10
    assert await reserved(ask(messages=None, prompt=questions[0], n=1, best_of=4, max_tokens=10)) == 4 * 10
    assert await reserved(ask(messages=None, prompt=questions[:2], n=2, max_tokens=10)) == 2 * 2 * 10
    assert await reserved(ask(messages=None, prompt=questions[0], surface=Surface.EMBEDDINGS)) == 0
    assert await reserved(ask(surface=Surface.MESSAGES, n=1, max_tokens=7)) == 7
    await router.close()


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"n": "2"}, "n"), ({"n": 0}, "n"), ({"best_of": 129}, "best_of"), ({"n": 3, "best_of": 2}, "best_of")],
)
def test_n_and_best_of_are_read_by_the_cores_rule(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read_choices(fields)
    assert caught.value.param == named
    assert read_choices({"n": 2, "best_of": 5}) == (2, 5) and read_choices({"n": None}) == (1, None)


# -- who is limited ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"anonymous": [{"window": "day", "total_tokens": 0}]}, "budgets.anonymous"),
        ({"defaults": {"team": [{"window": "day", "total_tokens": 0}]}}, "budgets.defaults.team"),
    ],
)
async def test_requests_without_a_team_meet_the_anonymous_budget(
    smollm2_dir: Path, extra: dict[str, Any], path: str
) -> None:
    """Requests with no team (``allow_missing`` in the Envoy example) are one pool, team ``-``, limited by
    ``budgets.anonymous`` (else ``defaults.team``): never unlimited when the operator set either."""
    budgets = {"teams": {"alpha": {"limits": [{"window": "day", "total_tokens": 10**6}]}}, **extra}
    router = Router(make_config(smollm2_dir, budgets), MemoryStore())
    decision, attempt = await router.admit(ask(team=None))
    assert attempt is None and decision.rejection is not None
    assert f"{path}.limits[0].total_tokens" in decision.rejection.message
    assert "team - (requests without a team)" in decision.rejection.message or decision.rejection.status == 400
    _, named = await router.admit(ask(team="alpha"))
    assert named is not None  # a named team has its own budget
    await router.close()


async def test_a_pooled_anonymous_budget_runs_out_for_all_of_them(smollm2_dir: Path) -> None:
    probe = Router(make_config(smollm2_dir, team_limit(10**6)), MemoryStore())
    each = (await probe.place(ask(team=None))).prompt_tokens + MAX_TOKENS
    await probe.close()
    budgets = team_limit(10**6, anonymous=[{"window": "day", "total_tokens": 3 * each}])
    router = Router(make_config(smollm2_dir, budgets), MemoryStore())
    results = [await router.admit(ask(team=None, user=f"u{i}")) for i in range(5)]
    assert [a is not None for _, a in results] == [True, True, True, False, False]
    refusal = results[-1][0].rejection
    assert refusal is not None and refusal.status == 429
    assert "team - (requests without a team)" in refusal.message and "budgets.anonymous" in refusal.message
    await router.close()


# -- what a rejection says --------------------------------------------------------------------------------------


async def test_a_budget_rejection_says_which_budget_in_its_decision_and_log(
    smollm2_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = Router(make_config(smollm2_dir, team_limit(10**6)), MemoryStore())
    each = (await probe.place(ask())).prompt_tokens + MAX_TOKENS
    await probe.close()
    router = Router(make_config(smollm2_dir, team_limit(each)), MemoryStore())
    _, first = await router.admit(ask())
    assert first is not None
    first.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=each - MAX_TOKENS, completion_tokens=MAX_TOKENS))
    with caplog.at_level(logging.INFO, logger="cognitora.decisions"):
        decision, attempt = await router.admit(ask())
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 429
    for text in (decision.reason, decision.explain()):
        assert "budgets.teams.alpha.limits[0].total_tokens" in text and "team alpha" in text
        assert "day (UTC) window" in text and f"{each:,} total_tokens of {each:,}" in text
    assert "prefix affinity" not in decision.reason and "predicted TTFT" not in decision.reason
    [line] = [r for r in caplog.records if r.name == "cognitora.decisions" and r.getMessage() == "decision"]
    assert line.__dict__["status"] == 429 and line.__dict__["reason"] == decision.rejection.message
    await router.close()
