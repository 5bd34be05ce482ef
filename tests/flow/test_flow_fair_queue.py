"""The gateway queue's order (``cognitora.flow.fair_queue``): strict bands, the aged share's bound, fair shares by
cost across flows, FIFO within a flow, O(1) removal, and no credit banked by a flow that was idle."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from cognitora.flow.bands import Band
from cognitora.flow.fair_queue import FairQueue

HIGH = Band("interactive", max_wait_s=5, aged_after_s=None)
LOW = Band("batch", max_wait_s=60, aged_after_s=2.0)


def drain(q: FairQueue[str], n: int, now: float = 0.0) -> list[str]:
    out = []
    for _ in range(n):
        choice = q.next(now)
        if choice is None:
            break
        q.commit(choice)
        out.append(choice.entry.payload)
    return out


def test_fifo_within_a_flow() -> None:
    q: FairQueue[str] = FairQueue([HIGH])
    for i in range(5):
        q.push(f"a{i}", 0, "team:a", cost=100.0 * (5 - i), now=i)
    assert drain(q, 10) == ["a0", "a1", "a2", "a3", "a4"]
    assert len(q) == 0 and q.next(0) is None


def test_strict_between_bands_without_aging() -> None:
    strict_low = Band("batch", max_wait_s=60, aged_after_s=None)
    q: FairQueue[str] = FairQueue([HIGH, strict_low])
    q.push("low-early", 1, "team:a", 10, now=0)
    for i in range(20):
        q.push(f"high{i}", 0, "team:b", 10, now=100)
    order = drain(q, 21, now=10_000)  # however long the low one waited
    assert order[:20] == [f"high{i}" for i in range(20)]
    assert order[20] == "low-early"


def test_aged_band_gets_one_dispatch_in_every_ceil_one_over_share() -> None:
    """The documented bound, both ways: once the low band's oldest waiter has waited ``aged_after_s``, it gets at
    least one dispatch in every ceil(1 / aged_share), and never more than aged_share of them over a long run."""
    share = 0.1
    q: FairQueue[str] = FairQueue([HIGH, LOW], aged_share=share)
    for i in range(1000):
        q.push(f"h{i}", 0, "team:h", 10, now=0)
    for i in range(200):
        q.push(f"l{i}", 1, "team:l", 10, now=0)
    # before the low band ages: strictly high
    assert all(p.startswith("h") for p in drain(q, 50, now=1.9))
    order = drain(q, 500, now=2.0)
    lows = [i for i, p in enumerate(order) if p.startswith("l")]
    assert lows, "the aged band never got a dispatch"
    gaps = [b - a for a, b in itertools.pairwise([-1, *lows])]
    assert max(gaps) <= math.ceil(1 / share)
    assert len(lows) <= share * len(order) + 1


def test_most_overdue_aged_band_goes_first() -> None:
    mid = Band("standard", max_wait_s=60, aged_after_s=10.0)
    low = Band("batch", max_wait_s=600, aged_after_s=1.0)
    q: FairQueue[str] = FairQueue([HIGH, mid, low], aged_share=0.5)
    q.push("h", 0, "x", 1, now=0)
    q.push("h2", 0, "x", 1, now=0)
    q.push("m", 1, "y", 1, now=0)  # 20 s waited, 10 over
    q.push("b", 2, "z", 1, now=15)  # 5 s waited, 4 over
    choice = q.next(20)
    assert choice is not None and choice.aged and choice.entry.payload == "m"


def test_fair_share_by_cost_not_by_requests() -> None:
    """Team A's requests cost 8x team B's (uncached tokens): while both wait, B gets ~8 dispatches per A's, so the
    tokens each was served stay within one request's cost of each other."""
    q: FairQueue[str] = FairQueue([HIGH])
    for i in range(200):
        q.push(f"a{i}", 0, "team:a", 8000, now=0)
    for i in range(800):
        q.push(f"b{i}", 0, "team:b", 1000, now=0)
    order = drain(q, 450)
    served = Counter[str]()
    for p in order:
        served[p[0]] += 8000 if p[0] == "a" else 1000
        assert abs(served["a"] - served["b"]) <= 8000
    counts = Counter(p[0] for p in order)
    assert counts["b"] == pytest.approx(8 * counts["a"], abs=8)


def test_weights_scale_the_share() -> None:
    q: FairQueue[str] = FairQueue([HIGH], weight=lambda f: 3.0 if f == "team:gold" else 1.0)
    for _i in range(300):
        q.push("g", 0, "team:gold", 100, now=0)
        q.push("s", 0, "team:silver", 100, now=0)
    counts = Counter(drain(q, 400))
    assert counts["g"] == pytest.approx(3 * counts["s"], abs=3)


def test_an_idle_flow_banks_no_credit() -> None:
    """B waits alone for a long time, then A arrives: A does not get everything until it 'catches up' with B's
    service: it joins at the virtual time and they alternate."""
    q: FairQueue[str] = FairQueue([HIGH])
    for _i in range(100):
        q.push("b", 0, "team:b", 100, now=0)
    drain(q, 90)
    for _i in range(10):
        q.push("a", 0, "team:a", 100, now=1)
    order = drain(q, 10)
    assert 4 <= order.count("a") <= 6


def test_removal_anywhere_is_immediate_and_keeps_order() -> None:
    q: FairQueue[str] = FairQueue([HIGH, LOW])
    entries = [q.push(f"a{i}", 0, "team:a", 1, now=i) for i in range(5)]
    low = q.push("low", 1, "team:b", 1, now=0)
    assert q.remove(entries[0]) and q.remove(entries[3]) and q.remove(low)
    assert not q.remove(entries[3])
    assert len(q) == 3 and q.depth(1) == 0 and q.oldest_at(1) is None
    assert drain(q, 10) == ["a1", "a2", "a4"]


def test_removing_a_head_hands_the_turn_to_the_next() -> None:
    q: FairQueue[str] = FairQueue([HIGH])
    a0 = q.push("a0", 0, "team:a", 1, now=0)
    q.push("b0", 0, "team:b", 1, now=1)
    q.push("a1", 0, "team:a", 1, now=2)
    choice = q.next(3)
    assert choice is not None and choice.entry is a0
    q.remove(a0)
    # a1 came after b0, and both flows are at the same counter: b0's turn
    assert drain(q, 3) == ["b0", "a1"]


def test_ahead_in_band_counts_the_turns_before_a_new_request() -> None:
    q: FairQueue[str] = FairQueue([HIGH])
    for _ in range(3):
        q.push("a", 0, "team:a", 1000, now=0)
    for _ in range(10):
        q.push("b", 0, "team:b", 100, now=0)
    # a new B request follows B's 10 (1,000 tokens in all) and A's turns that start by then: at 0 and 1,000
    assert q.ahead_in_band(0, "team:b") == 12
    # a new C request (no history) starts at the virtual time 0: only the first turn of each flow is no later
    assert q.ahead_in_band(0, "team:c") == 2


def test_service_elsewhere_counts_here() -> None:
    q: FairQueue[str] = FairQueue([HIGH])
    for _ in range(20):
        q.push("a", 0, "team:a", 100, now=0)
        q.push("b", 0, "team:b", 100, now=0)
    q.add_served(0, {"team:a": 1000})  # another replica served A ten requests' worth
    assert drain(q, 10) == ["b"] * 10


def test_many_flows_stay_fair_under_random_arrivals_and_cancellations() -> None:
    """Random costs, arrivals and removals: while every flow waits, no flow is ever served more than one maximal
    request ahead of another (the DRR bound), and every live entry is dispatched exactly once."""
    rng = random.Random(7)
    q: FairQueue[int] = FairQueue([HIGH])
    flows = [f"team:{i}" for i in range(12)]
    live = {}
    for n in range(3000):
        f = rng.choice(flows)
        live[n] = q.push(n, 0, f, float(rng.randint(1, 4000)), now=n)
    for n in rng.sample(sorted(live), 500):
        q.remove(live.pop(n))
    served = Counter[str]()
    seen = set()
    while (choice := q.next(0)) is not None:
        q.commit(choice)
        e = choice.entry
        seen.add(e.payload)
        served[e.flow] += int(e.cost)
        if all(q.waiting_from(0, f) for f in flows):
            assert max(served.values()) - min(served[f] for f in flows) <= 2 * 4000
    assert seen == set(live)


def test_a_skipped_flow_sits_out_uncharged_and_is_first_again_after_unskip() -> None:
    """The controller skips a flow whose head it cannot place now: the next flow's head is offered, FIFO within
    the skipped flow is kept (its second request is not offered either), a lower band is not offered while the
    band's flows are all skipped, and after ``unskip`` the skipped flow goes first (it was not charged)."""
    q: FairQueue[str] = FairQueue([HIGH, LOW])
    q.push("a-long", 0, "team:a", cost=20_000.0, now=0)
    q.push("a-short", 0, "team:a", cost=10.0, now=1)
    for i in range(2):
        q.push(f"b{i}", 0, "team:b", cost=500.0, now=2 + i)
    q.push("low", 1, "team:c", cost=1.0, now=4)
    head = q.next(5)
    assert head is not None and head.entry.payload == "a-long"
    q.skip(head.entry)
    assert drain(q, 2, now=5) == ["b0", "b1"]
    assert q.next(5) is None  # team:a skipped, team:b empty: not "low"
    q.unskip()
    assert drain(q, 3, now=5) == ["a-long", "a-short", "low"]


def test_earliest_deadline_reads_only_deadlines_that_leave_enough() -> None:
    """A held head's turn: the flow's waiter with the earliest deadline at or after ``not_before``, never the head
    itself, nor one with no deadline; ties go to the oldest; another flow's waiters do not count."""
    q: FairQueue[str] = FairQueue([HIGH])
    head = q.push("head", 0, "team:a", cost=1.0, now=0, deadline=10.0)
    q.push("short", 0, "team:a", cost=1.0, now=1, deadline=11.0)  # too little left
    q.push("unknown", 0, "team:a", cost=1.0, now=2)
    q.push("late", 0, "team:a", cost=1.0, now=3, deadline=40.0)
    q.push("tie-1", 0, "team:a", cost=1.0, now=4, deadline=20.0)
    q.push("tie-2", 0, "team:a", cost=1.0, now=5, deadline=20.0)
    q.push("other", 0, "team:b", cost=1.0, now=6, deadline=15.0)
    found = q.earliest_deadline(0, "team:a", not_before=12.0, besides=head)
    assert found is not None and found.payload == "tie-1"
    soonest = q.earliest_deadline(0, "team:a", not_before=9.0, besides=head)
    assert soonest is not None and soonest.payload == "short"  # the head's own 10 s does not count
    assert q.earliest_deadline(0, "team:a", not_before=41.0, besides=head) is None
    assert q.earliest_deadline(0, "team:c", not_before=0.0, besides=head) is None
