"""The offline eviction replay (bench/eviction_sim.py) prices the tail an engine would evict as each policy says."""

from __future__ import annotations

import pytest

from bench.eviction_sim import BLOCK_TOKENS, TraceRequest, replay


def req(t: float, *blocks: int) -> TraceRequest:
    return TraceRequest(t, blocks, len(blocks) * BLOCK_TOKENS)


def test_only_a_policy_that_knows_the_prefix_recurs_spares_it() -> None:
    # Two engines of two blocks. [1, 2] fills engine 0 and [3, 4] engine 1; [5] matches nowhere and must evict a
    # tail. Least-loaded takes engine 0 and pushes out block 2, so [1, 2] coming back finds one block of two; the
    # oracle sees that [1, 2] recurs and [3, 4] does not, and evicts 4 instead.
    trace = [req(0, 1, 2), req(1, 3, 4), req(2, 5), req(3, 1, 2)]
    kwargs = {"engines": 2, "kv_tokens": 2 * BLOCK_TOKENS, "slack": 10.0, "window_s": 60.0, "horizon": 10}
    assert replay(trace, "least-loaded", **kwargs) == pytest.approx(1 / 7)
    assert replay(trace, "oracle", **kwargs) == pytest.approx(2 / 7)
    # the recency charge spares the newer [3, 4] and loses block 2 like least-loaded: older is not colder here
    assert replay(trace, "coldest-tail", **kwargs) == pytest.approx(1 / 7)
