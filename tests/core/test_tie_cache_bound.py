"""The tie-break's load bound (``placement.tie_cache_bound``, ``cognitora.placement.affinity.within_cache_bound``):
among candidates tied on cost, the prefix hash does not pick one whose prefix cache is much fuller than the
emptiest's. docs/placement.md, "Ties"."""

from __future__ import annotations

from typing import Any

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.placement import FleetState, place
from cognitora.request import RouteRequest
from kvstate.prompt import PromptKeys
from kvstate.store import EndpointSnapshot, PrefixMatch

NOW = 1_000_000.0
BLOCK = 16
CAPACITY = 4096
"""Tokens of KV cache per engine: 256 blocks, so the default bound (0.1) is 409.6 tokens, 25.6 blocks."""
A, B, C = "127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"
COLD_PREFIXES = 60


def fleet(placement: dict[str, Any] | None = None, **endpoint: Any) -> CognitoraConfig:
    """Three identical engines with the shipped placement settings, but for ``placement``."""
    return config_from_dict(
        {
            "models": [
                {
                    "name": "m",
                    "block_size": BLOCK,
                    "endpoints": [{"url": f"http://{e}", **endpoint} for e in (A, B, C)],
                }
            ],
            "placement": placement or {},
        }
    )


SHIPPED = fleet()
HASH_ONLY = fleet({"tie_cache_bound": None})


def idle(blocks: dict[str, int | None], capacity: int = CAPACITY) -> FleetState:
    """An idle fleet whose engines hold ``blocks`` cached blocks (of other prompts), as the scraper wrote them."""
    return FleetState(
        NOW,
        snapshots={
            e: EndpointSnapshot(endpoint=e, last_seen=NOW - 0.5, kv_capacity_tokens=capacity, cached_blocks=n)
            for e, n in blocks.items()
        },
    )


# A holds 125 blocks (2,000 tokens: half its cache) of groups placed earlier; B none; C 10 (160 tokens, within).
A_HOLDS_OTHER_GROUPS = {A: 125, B: 0, C: 10}


def keys(tokens: int, first_key: int) -> PromptKeys:
    return PromptKeys(
        keys=list(range(first_key, first_key + tokens // BLOCK)), prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK
    )


def cold_picks(config: CognitoraConfig, state: FleetState, tokens: int = 1024) -> list[str | None]:
    """Where each of ``COLD_PREFIXES`` never-seen prefixes goes, each placed on ``state``."""
    return [
        place(
            RouteRequest(model="m", prompt="x", request_id=f"r{i}"), keys(tokens, 1 + i * 1000), config, state
        ).endpoint
        for i in range(COLD_PREFIXES)
    ]


def test_a_cold_prefix_does_not_go_to_the_tied_engine_holding_other_groups() -> None:
    state = idle(A_HOLDS_OTHER_GROUPS)
    hashed = cold_picks(HASH_ONLY, state)
    assert hashed.count(A) >= 10, "the hash alone puts about a third of them there"
    bounded = cold_picks(SHIPPED, state)
    assert A not in bounded
    assert bounded.count(B) >= 20 and bounded.count(C) >= 20, "the hash still spreads them over the rest"
    # A prefix the hash gave B or C stays there: only what A would have got moves (the rendezvous property).
    assert all(b == h for b, h in zip(bounded, hashed, strict=True) if h != A)


def test_the_explanation_says_which_candidate_was_left_out_and_why() -> None:
    state = idle(A_HOLDS_OTHER_GROUPS)
    decision = place(RouteRequest(model="m", prompt="x"), keys(1024, 7), SHIPPED, state)
    assert decision.endpoint in (B, C)
    assert "left out of the tie" in decision.reason and f"{A} (2000 tokens cached of 4096)" in decision.reason
    by_endpoint = {c.endpoint: c for c in decision.candidates}
    assert (by_endpoint[A].cache_held_tokens, by_endpoint[A].kv_capacity_tokens) == (2000, CAPACITY)
    assert "prefix cache 2000/4096 tokens" in decision.explain()


def test_zero_leaves_only_the_emptiest() -> None:
    assert set(cold_picks(fleet({"tie_cache_bound": 0}), idle(A_HOLDS_OTHER_GROUPS))) == {B}


def test_loads_within_the_bound_are_all_hashed() -> None:
    # 25 blocks more than the emptiest is 400 tokens, under 0.1 x 4,096: nobody is left out, the hash alone picks.
    state = idle({A: 25, B: 0, C: 10})
    assert cold_picks(SHIPPED, state) == cold_picks(HASH_ONLY, state)


def test_requests_sharing_a_prefix_still_converge_on_the_engine_holding_it() -> None:
    # A is the fullest, but it holds this group's 768-token prefix: it is cheaper, not tied, and every request of
    # the group (different questions after it) goes there.
    state = idle(A_HOLDS_OTHER_GROUPS)
    held = FleetState(state.now, matches={A: PrefixMatch(48, 48.0)}, snapshots=state.snapshots)
    for i in range(20):
        prompt = PromptKeys([*range(1, 49), *range(5000 + 100 * i, 5016 + 100 * i)], 1024, True, BLOCK)
        assert place(RouteRequest(model="m", prompt="x", request_id=f"q{i}"), prompt, SHIPPED, held).endpoint == A


def test_cold_requests_sharing_a_prefix_converge_on_one_engine_within_the_bound() -> None:
    # Nothing of the group is cached anywhere yet: its requests hash alike, to one engine, and not to A.
    state = idle(A_HOLDS_OTHER_GROUPS)
    picks = {
        place(
            RouteRequest(model="m", prompt="x", request_id=f"q{i}"),
            PromptKeys([*range(1, 49), *range(5000 + 100 * i, 5016 + 100 * i)], 1024, True, BLOCK),
            SHIPPED,
            state,
        ).endpoint
        for i in range(20)
    }
    assert len(picks) == 1 and A not in picks, picks


def test_unknown_capacity_falls_back_to_the_hash() -> None:
    # No KV capacity scraped, configured or given as a prior: the hash alone, wherever it puts them.
    state = idle(A_HOLDS_OTHER_GROUPS, capacity=0)
    picks = cold_picks(SHIPPED, state)
    assert picks == cold_picks(HASH_ONLY, state) and A in picks
    # A configured capacity stands in for a scraped one.
    configured = fleet(cost={"kv_capacity_tokens": CAPACITY})
    assert A not in cold_picks(configured, state)


def test_an_uncounted_candidate_falls_back_to_the_hash() -> None:
    # B's count is not known (an engine whose KV events do not feed the store): comparing it with A's would make it
    # look empty, so the hash alone picks among them all.
    state = idle({A: 125, B: None, C: 10})
    picks = cold_picks(SHIPPED, state)
    assert picks == cold_picks(HASH_ONLY, state) and A in picks


def test_a_stale_snapshots_count_is_not_used() -> None:
    stale = FleetState(
        NOW,
        snapshots={
            e: EndpointSnapshot(endpoint=e, last_seen=NOW - 3600, kv_capacity_tokens=CAPACITY, cached_blocks=n)
            for e, n in A_HOLDS_OTHER_GROUPS.items()
        },
    )
    assert A in cold_picks(SHIPPED, stale)


def test_the_saturated_tie_break_is_bounded_too() -> None:
    # 40,000 tokens at the default 10,000 tokens/s: over the default class's 2 s SLO on every idle engine (rule 4),
    # which is not sheddable, so the request goes to the fastest, ties broken as in rule 3.
    state = idle({A: 3000, B: 0, C: 0}, capacity=100_000)  # A: 48,000 tokens cached, almost half its cache
    picks = cold_picks(SHIPPED, state, tokens=40_000)
    assert A in cold_picks(HASH_ONLY, state, tokens=40_000)
    assert A not in picks
    decision = place(RouteRequest(model="m", prompt="x"), keys(40_000, 7), SHIPPED, state)
    assert decision.saturated and "left out of the tie" in decision.reason, decision.reason
