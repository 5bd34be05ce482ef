"""When placement itself fails (a bug): the operator's ``placement.on_error`` policy, counted, logged rarely; and
input that used to make placement raise (and skip shedding) is a 400 that says what was wrong."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core import router as router_module
from cognitora.core.router import Router
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import InFlight

A, B = "127.0.0.1:8001", "127.0.0.1:8002"


def make_config(smollm2_dir: Path, **placement: Any) -> CognitoraConfig:
    return config_from_dict(
        {
            "placement": placement,
            "models": [
                {
                    "name": "m",
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": f"http://{A}"}, {"url": f"http://{B}"}],
                }
            ],
        }
    )


def chat(text: str = "hello") -> RouteRequest:
    return RouteRequest(model="m", messages=[{"role": "user", "content": text}])


@pytest.fixture
def broken_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("a placement bug")

    monkeypatch.setattr(router_module, "place", explode)


async def test_fallback_serves_and_counts_the_request_and_logs_one_traceback(
    smollm2_dir: Path, broken_placement: None, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    router = Router(make_config(smollm2_dir), store)
    caplog.set_level(logging.ERROR, logger="cognitora.router")
    picks = []
    for _ in range(20):
        decision, attempt = await router.admit(chat())
        assert attempt is not None and decision.rejection is None, decision.reason
        assert "placement failed (ZeroDivisionError)" in decision.reason
        picks.append(decision.endpoint)
    # Least work first: the fallback spreads what it cannot place, and every pick is counted.
    assert picks.count(A) == picks.count(B) == 10
    await attempt.settled()
    assert (await store.inflight([A, B])) == {A: InFlight(10, 0, 0), B: InFlight(10, 0, 0)}
    assert router.stats.internal_errors == 20
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "placement of a request for model 'm' failed" in tracebacks[0].getMessage()


async def test_reject_answers_503_and_dispatches_nothing(smollm2_dir: Path, broken_placement: None) -> None:
    store = MemoryStore()
    router = Router(make_config(smollm2_dir, on_error="reject"), store)
    decision, attempt = await router.admit(chat())
    assert attempt is None and decision.rejection is not None
    assert decision.rejection.status == 503 and decision.rejection.retry_after_s == 1
    assert "retry shortly" in decision.rejection.message
    assert (await store.inflight([A, B])) == {A: InFlight(), B: InFlight()}


async def test_a_lone_surrogate_is_a_400_naming_where_it_is(smollm2_dir: Path) -> None:
    router = Router(make_config(smollm2_dir), MemoryStore())
    req = RouteRequest(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "x\ud800y"}]}])
    decision, attempt = await router.admit(req)
    assert attempt is None and decision.rejection is not None and decision.rejection.status == 400
    assert "messages[0].content[0].text is not valid Unicode" in decision.rejection.message
    assert router.stats.internal_errors == 0
