"""The plugin's ledger of placed attempts: each reported exactly once, grouped by request, never kept forever."""

from __future__ import annotations

import threading
from typing import Any

from cognitora.decision import Decision
from litellm_plugin.ledger import Placement, PlacementLedger


def _placement(rid: str, trace: str | None, host: Any = None) -> Placement:
    decision = Decision(request_id=rid, model="chat", endpoint="a:1", url="http://a:1", prompt_tokens=10)
    return Placement(decision=decision, host=host, trace_id=trace)


def test_an_attempt_is_taken_once_whichever_callback_comes_first() -> None:
    ledger = PlacementLedger()
    ledger.open(_placement("r1", "t1"))
    taken: list[Placement | None] = []
    threads = [threading.Thread(target=lambda: taken.append(ledger.take("r1"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(p is not None for p in taken) == 1
    assert len(ledger) == 0 and ledger.take("r1") is None


def test_a_retry_settles_the_earlier_attempts_of_its_request_only() -> None:
    ledger = PlacementLedger()
    for rid, trace in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("n1", None)]:
        ledger.open(_placement(rid, trace))
    assert sorted(p.decision.request_id for p in ledger.take_trace("A", keep="a2")) == ["a1"]
    assert [p.decision.request_id for p in ledger.take_trace("A")] == ["a2"]
    assert ledger.take_trace("A") == [] and ledger.take_trace(None) == []
    assert ledger.get("b1") is not None and ledger.get("n1") is not None
    ledger.take("b1")
    assert ledger.take_trace("B") == []


def test_attempts_whose_end_never_came_are_forgotten_after_max_age() -> None:
    now = [0.0]
    ledger = PlacementLedger(max_age_s=100.0, clock=lambda: now[0])
    old = _placement("old", "T")
    old.opened_at = 0.0
    ledger.open(old)
    now[0] = 250.0
    fresh = _placement("fresh", "U")
    fresh.opened_at = 250.0
    ledger.open(fresh)
    assert ledger.get("old") is None and ledger.take_trace("T") == []
    assert ledger.get("fresh") is not None
