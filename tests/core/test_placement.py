"""Placement as a pure function: a fleet state in, a Decision out. Table tests of each rule in docs/placement.md."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, Role, config_from_dict
from cognitora.core.router import Router
from cognitora.decision import CandidateScore, Decision, Rejection
from cognitora.placement import FleetState, HealthMark, place
from cognitora.placement.cost import by_ranking_cost
from cognitora.placement.picker import pick, tie_band_s
from cognitora.request import RouteRequest
from kvstate.engines import EngineLoad
from kvstate.memory_store import MemoryStore
from kvstate.prompt import PromptKeys
from kvstate.rates import RateEstimator
from kvstate.store import EndpointSnapshot, InFlight, PrefixMatch

NOW = 1_000_000.0
BLOCK = 16


def fleet(*endpoints: dict[str, Any], placement: dict[str, Any] | None = None) -> CognitoraConfig:
    # The cases isolate the predicted TTFT's terms, so the recompute charge (default 1) is off unless a case sets it;
    # the charge has cases of its own, and one with the shipped defaults.
    data: dict[str, Any] = {"models": [{"name": "m", "block_size": BLOCK, "endpoints": list(endpoints)}]}
    data["placement"] = {"recompute_weight": 0.0, **(placement or {})}
    return config_from_dict(data)


def ep(port: int, **extra: Any) -> dict[str, Any]:
    return {"url": f"http://127.0.0.1:{port}", **extra}


A, B, C = "127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"
DEFAULT_FLEET = fleet(ep(8001), ep(8002))
SLOT_WAIT = fleet(ep(8001), ep(8002), placement={"slot_wait_weight": 1.0})


def prompt(tokens: int, first_key: int = 1) -> PromptKeys:
    """A prompt of ``tokens`` whose block keys start at ``first_key`` (another start: another prefix)."""
    blocks = tokens // BLOCK
    keys = list(range(first_key, first_key + blocks))
    return PromptKeys(keys=keys, prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK)


def snap(endpoint: str, **fields: Any) -> EndpointSnapshot:
    return EndpointSnapshot(endpoint=endpoint, last_seen=NOW - 0.5, **fields)


def cached(tokens: int) -> PrefixMatch:
    return PrefixMatch(blocks=tokens // BLOCK, weighted_blocks=tokens / BLOCK)


@dataclass
class Case:
    name: str
    state: FleetState
    expect: str | None
    config: CognitoraConfig = DEFAULT_FLEET
    tokens: int = 4096
    request: dict[str, Any] = field(default_factory=dict)
    status: int | None = None
    runner_up: str | None = "unchecked"
    """The expected runner-up (None: there is none); "unchecked" skips the check."""


# B holds 6,000 tokens of the prompt but is at capacity (3 waiting); A is as busy but has no queue.
SATURATED_B = FleetState(
    NOW,
    matches={B: cached(6000)},
    snapshots={
        A: snap(A, running=40, mean_service_s=30.0),
        B: snap(B, running=40, waiting=3, mean_service_s=30.0),
    },
)


WIDE_TTFT_SLACK = {"power_ttft_slack_s": 2.0, "power_ttft_slack_ratio": 5.0}
"""A power slack so wide that neither the TTFT nor the ranking cost binds, for the cases about the E2E bound and the
energy band: their A also ranks above B by the interference with what it runs (69 ms to 1.5 s), past the default."""


def _decoding(a_tokens_per_s: float, b_tokens_per_s: float) -> dict[str, EndpointSnapshot]:
    """A greener A (0.135 J/token learned) and B (0.30), each with its learned per-sequence decode speed."""
    return {
        A: snap(A, joules_per_token=0.135, decode_tokens_per_s=a_tokens_per_s),
        B: snap(B, joules_per_token=0.30, decode_tokens_per_s=b_tokens_per_s),
    }


CASES = [
    Case(
        "cached endpoint wins while it has headroom",
        FleetState(NOW, matches={B: cached(4000)}, inflight={B: InFlight(2, 1000, 100)}),
        expect=B,
        runner_up=A,
    ),
    Case(
        "busy cached endpoint loses when its queue costs more than the prefill saved",
        # B saves 4000 tokens of prefill but has 20000 queued ahead: 20096/10000 s vs 4096/10000 s on idle A.
        FleetState(NOW, matches={B: cached(4000)}, inflight={B: InFlight(10, 20000, 0)}),
        expect=A,
        runner_up=B,
    ),
    Case(
        "scraped waiting queue counts when the routers did not see that traffic",
        FleetState(NOW, matches={B: cached(2048)}, snapshots={B: snap(B, waiting=40)}),
        expect=A,
    ),
    Case(
        "slower hardware loses on equal work",
        FleetState(NOW),
        config=fleet(ep(8001, prefill_tokens_per_s=5000), ep(8002, prefill_tokens_per_s=20000)),
        expect=B,
        runner_up=A,
    ),
    Case(
        "learned prefill rate beats the configured prior",
        FleetState(NOW, snapshots={A: snap(A, prefill_tokens_per_s=40000)}),
        config=fleet(ep(8001, prefill_tokens_per_s=5000), ep(8002, prefill_tokens_per_s=20000)),
        expect=A,
    ),
    Case(
        "unhealthy snapshot is filtered even when it holds the prefix",
        FleetState(NOW, matches={A: cached(4096)}, snapshots={A: snap(A, healthy=False)}),
        expect=B,
        runner_up=None,
    ),
    Case(
        "marked-dead endpoint is filtered until a newer healthy snapshot",
        FleetState(NOW, matches={A: cached(4096)}, health_marks={A: HealthMark(NOW - 0.1, "connection refused")}),
        expect=B,
    ),
    Case(
        "a healthy snapshot newer than the mark brings it back",
        FleetState(
            NOW,
            matches={A: cached(4096)},
            snapshots={A: snap(A)},
            health_marks={A: HealthMark(NOW - 5, "connection refused")},
        ),
        expect=A,
    ),
    Case(
        "a mark expires after unhealthy_mark_ttl_s, so the endpoint is tried again",
        FleetState(NOW, matches={A: cached(4096)}, health_marks={A: HealthMark(NOW - 31, "connection refused")}),
        expect=A,
    ),
    Case(
        "a mark says nothing of load: a healthy snapshot older than the mark does not bring the endpoint back",
        FleetState(
            NOW,
            matches={A: cached(4096)},
            snapshots={A: EndpointSnapshot(A, last_seen=NOW - 2)},
            health_marks={A: HealthMark(NOW - 1, "connection refused")},
        ),
        expect=B,
    ),
    Case(
        "the scraper's unhealthy verdict does not expire",
        FleetState(
            NOW, matches={A: cached(4096)}, snapshots={A: EndpointSnapshot(A, healthy=False, last_seen=NOW - 300)}
        ),
        expect=B,
    ),
    Case(
        "KV nearly full is filtered",
        FleetState(NOW, matches={A: cached(4096)}, snapshots={A: snap(A, kv_usage=0.99)}),
        expect=B,
    ),
    Case(
        "KV nearly full everywhere: kept rather than refusing",
        FleetState(NOW, matches={A: cached(4096)}, snapshots={A: snap(A, kv_usage=0.99), B: snap(B, kv_usage=0.99)}),
        expect=A,
    ),
    Case(
        "stale snapshot load is ignored",
        FleetState(NOW, matches={A: cached(1024)}, snapshots={A: EndpointSnapshot(A, last_seen=NOW - 60, waiting=100)}),
        expect=A,
    ),
    Case(
        "decode load is a penalty in seconds",
        FleetState(NOW, snapshots={A: snap(A, running=200)}),
        expect=B,
    ),
    Case(
        "gateway candidates restrict the choice",
        FleetState(NOW, matches={A: cached(4096)}),
        request={"candidates": [B]},
        expect=B,
    ),
    Case(
        "decode-only endpoints do not take whole requests",
        FleetState(NOW, matches={A: cached(4096)}),
        config=fleet(ep(8001, role="decode"), ep(8002)),
        expect=B,
    ),
    Case(
        "every endpoint failing its health scrape: panic routing still serves, on the best one",
        FleetState(NOW, matches={B: cached(4096)}, snapshots={A: snap(A, healthy=False), B: snap(B, healthy=False)}),
        expect=B,
    ),
    Case(
        "every endpoint refusing connections: 503",
        FleetState(
            NOW,
            health_marks={A: HealthMark(NOW - 0.1, "connection refused"), B: HealthMark(NOW - 0.2, "reset")},
        ),
        expect=None,
        status=503,
    ),
    Case(
        "panic keeps out an endpoint a gateway saw refuse connections",
        FleetState(
            NOW,
            matches={A: cached(4096)},
            snapshots={A: snap(A, healthy=False), B: snap(B, healthy=False)},
            health_marks={A: HealthMark(NOW - 0.1, "connection refused")},
        ),
        expect=B,
    ),
    Case(
        "SLO miss for a sheddable class: 429",
        FleetState(NOW, inflight={A: InFlight(50, 400_000, 0), B: InFlight(50, 400_000, 0)}),
        request={"priority": "batch"},
        expect=None,
        status=429,
    ),
    Case(
        "SLO miss for a non-sheddable class: the best local endpoint anyway",
        FleetState(NOW, inflight={A: InFlight(50, 400_000, 0), B: InFlight(50, 300_000, 0)}),
        expect=B,
    ),
    Case("unknown model: 404", FleetState(NOW), request={"model": "gpt-9"}, expect=None, status=404),
    Case("unknown priority class: 400", FleetState(NOW), request={"priority": "vip"}, expect=None, status=400),
    Case(
        "power: close TTFTs, the lower energy per token wins",
        FleetState(NOW, matches={A: cached(256)}),
        config=fleet(ep(8001, joules_per_token=0.5), ep(8002, joules_per_token=0.1)),
        expect=B,
        runner_up=A,
    ),
    Case(
        "power: never at the price of a TTFT outside the slack",
        FleetState(NOW, matches={A: cached(4096)}),
        config=fleet(ep(8001, joules_per_token=0.5), ep(8002, joules_per_token=0.1)),
        expect=A,
    ),
    Case(
        "power: learned energy from the scrape overrides the prior",
        FleetState(NOW, matches={A: cached(256)}, snapshots={A: snap(A, joules_per_token=0.05)}),
        config=fleet(ep(8001, joules_per_token=0.5), ep(8002, joules_per_token=0.1)),
        expect=A,
    ),
    Case(
        "power: an 800-token cache hit beats a cold engine with lower J/token (the slack is relative: 0.05 ms here)",
        # The end-to-end case: 0.5 ms on A (16 tokens to prefill) vs 28 ms on cold B; B's 0.1 J/token is 5x lower
        # but it would prefill 816 tokens (82 J) where A prefills 16 (8 J).
        FleetState(NOW, matches={A: cached(800)}),
        config=fleet(
            ep(8001, joules_per_token=0.5, prefill_tokens_per_s=29000),
            ep(8002, joules_per_token=0.1, prefill_tokens_per_s=29000),
        ),
        tokens=816,
        expect=A,
        runner_up=B,
    ),
    Case(
        "power: a cache hit saves prefill energy, so a cold engine with lower J/token does not win",
        # A: 3800 queued + 256 uncached = 406 ms, 0.3 J/token x 256 = 77 J. B: cold, 410 ms (within the 41 ms
        # slack), 0.1 J/token x 4096 = 410 J. Comparing J/token alone would pick B.
        FleetState(NOW, matches={A: cached(3840)}, inflight={A: InFlight(1, 3800, 0)}),
        config=fleet(ep(8001, joules_per_token=0.3), ep(8002, joules_per_token=0.1)),
        expect=A,
    ),
    Case(
        "power: expected decode tokens count in the request's energy",
        # Same as above with max_tokens=20000: A 0.3 x 20256 = 6077 J vs B 0.1 x 24096 = 2410 J. Both decode at
        # 50 tokens/s (priors), so the E2E bound holds: 400.41 s vs 400.41 s.
        FleetState(NOW, matches={A: cached(3840)}, inflight={A: InFlight(1, 3800, 0)}),
        config=fleet(
            ep(8001, joules_per_token=0.3, decode_tokens_per_s=50),
            ep(8002, joules_per_token=0.1, decode_tokens_per_s=50),
        ),
        request={"max_tokens": 20000},
        expect=B,
    ),
    Case(
        "power: refused when packing would double E2E (A decodes at half B's pace under its load)",
        # The multi-turn chat run: A's learned J/token is 55% lower (a busier engine shares idle power over more
        # tokens) and its TTFT is inside the power slack (440 ms vs B's 410 ms: 30 ms, under 41 ms), but its learned
        # per-sequence decode speed is 26 tokens/s against B's 57: 200 tokens end at 8.13 s there, 3.92 s on B.
        FleetState(NOW, inflight={A: InFlight(1, 300, 0)}, snapshots=_decoding(26.0, 57.0)),
        config=fleet(ep(8001), ep(8002), placement=WIDE_TTFT_SLACK),
        request={"max_tokens": 200},
        expect=B,
    ),
    Case(
        "power: within the E2E bound it still saves energy (A decodes 3% slower: E2E 4.04 s vs 3.92 s)",
        # The slack is widened here: A also ranks 69 ms above B (its 30 ms more TTFT and 38.5 ms of decode
        # interference with the request it runs), past the default 44.5 ms, and the case is the E2E bound.
        FleetState(NOW, inflight={A: InFlight(1, 300, 0)}, snapshots=_decoding(55.5, 57.0)),
        config=fleet(ep(8001), ep(8002), placement=WIDE_TTFT_SLACK),
        request={"max_tokens": 200},
        expect=A,
    ),
    Case(
        "power: the ranking cost bounds it too (A's 30 ms more TTFT and 38.5 ms of interference: over 44.5 ms)",
        FleetState(NOW, inflight={A: InFlight(1, 300, 0)}, snapshots=_decoding(55.5, 57.0)),
        config=fleet(ep(8001), ep(8002)),
        request={"max_tokens": 200},
        expect=B,
    ),
    Case(
        "power: the E2E slack is the smaller of 0.3 s and 10% (E2E 1.59 s vs 1.41 s: 0.18 s, over 0.141 s)",
        FleetState(NOW, inflight={A: InFlight(1, 300, 0)}, snapshots=_decoding(43.5, 50.0)),
        config=fleet(ep(8001), ep(8002), placement=WIDE_TTFT_SLACK),
        request={"max_tokens": 50},
        expect=B,
    ),
    Case(
        "power: unknown decode speed, decode tokens expected: no energy preference (its E2E cannot be bounded)",
        FleetState(NOW, matches={A: cached(256)}),
        config=fleet(ep(8001, joules_per_token=0.5), ep(8002, joules_per_token=0.1)),
        request={"max_tokens": 200},
        expect=A,
    ),
    Case(
        "power: an engine that never decoded gets a stand-in pace, so packing onto the other is still bounded",
        # A, the packed engine, runs 40 sequences at 26 tokens/s each; B has no learned pace (it got nothing since
        # the scraper started). B's stand-in: A's 38.5 ms inter-token latency less 40 x 0.1 ms = 34.5 ms: E2E 7.30 s
        # against A's 8.15 s, so A is refused. Without it A would be "within the bound" of itself alone.
        FleetState(
            NOW,
            inflight={A: InFlight(1, 300, 0)},
            snapshots={
                A: snap(A, running=40, joules_per_token=0.135, decode_tokens_per_s=26.0),
                B: snap(B, joules_per_token=0.30),
            },
        ),
        config=fleet(ep(8001), ep(8002), placement=WIDE_TTFT_SLACK),
        request={"max_tokens": 200},
        expect=B,
    ),
    Case(
        "power: with the E2E slack opened up, the rule packs again (the behaviour the bound replaced)",
        FleetState(NOW, inflight={A: InFlight(1, 300, 0)}, snapshots=_decoding(26.0, 57.0)),
        config=fleet(
            ep(8001),
            ep(8002),
            placement={**WIDE_TTFT_SLACK, "power_e2e_slack_s": 1000.0, "power_e2e_slack_ratio": 1000.0},
        ),
        request={"max_tokens": 200},
        expect=A,
    ),
    Case(
        "power: the slack is the smaller of 50 ms and 10% of the best TTFT",
        # A: 96 tokens to prefill, 9.6 ms, 48 J. B: 396 tokens, 39.6 ms, 20 J. B is greener but 30 ms slower,
        # far beyond 10% of 9.6 ms (an absolute 50 ms window would have taken it).
        FleetState(NOW, matches={A: cached(4000), B: cached(3700)}),
        config=fleet(ep(8001, joules_per_token=0.5), ep(8002, joules_per_token=0.05)),
        expect=A,
    ),
    Case(
        "power: energies within power_energy_band_ratio are equal (same hardware, noisy learned J/token)",
        # A: 4096 + 300 queued -> 440 ms (outside the 20.5 ms tie band, inside the 41 ms power slack), 0.100 J/token
        # -> 410 J. B: 410 ms, 0.110 J/token -> 451 J: 10% apart, not 20%, so TTFT decides.
        FleetState(NOW, inflight={A: InFlight(1, 300, 0)}),
        config=fleet(ep(8001, joules_per_token=0.10), ep(8002, joules_per_token=0.11), placement=WIDE_TTFT_SLACK),
        expect=B,
    ),
    Case(
        "power: unknown energy does not move the pick",
        FleetState(NOW, matches={A: cached(256)}),
        config=fleet(ep(8001), ep(8002, joules_per_token=0.1)),
        expect=A,
    ),
    Case(
        "recompute_weight 0: a hit behind a queue loses to a faster cold endpoint",
        # A: 4600 queued + 296 uncached = 490 ms + 5 ms attention; B: cold, 410 ms + 35 ms attention over the
        # whole prompt (cost_model.priors.attention_context_tokens), outside the 22 ms tie band.
        FleetState(NOW, matches={A: cached(3800)}, inflight={A: InFlight(1, 4600, 0)}),
        expect=B,
    ),
    Case(
        "recompute_weight 1: the prefill B would redo is charged, so A keeps the prefix",
        # A: 450 + 29.6 ms charge; B: 410 + 409.6 ms charge.
        FleetState(NOW, matches={A: cached(3800)}, inflight={A: InFlight(1, 4200, 0)}),
        config=fleet(ep(8001), ep(8002), placement={"recompute_weight": 1.0}),
        expect=A,
    ),
    Case(
        "shipped defaults (recompute_weight 1): a hit behind a short queue keeps the prefix",
        FleetState(NOW, matches={A: cached(3800)}, inflight={A: InFlight(1, 4200, 0)}),
        config=config_from_dict({"models": [{"name": "m", "block_size": BLOCK, "endpoints": [ep(8001), ep(8002)]}]}),
        expect=A,
    ),
    Case(
        "recompute_weight 1: a saturated cached endpoint still loses",
        # A: 2012 + 9.6 ms; B: 410 + 410 ms.
        FleetState(NOW, matches={B: cached(4000)}, inflight={B: InFlight(10, 20000, 0)}),
        config=fleet(ep(8001), ep(8002), placement={"recompute_weight": 1.0}),
        expect=A,
    ),
    Case(
        "runner-up is the second best of three",
        FleetState(NOW, matches={C: cached(4096), B: cached(2048)}),
        config=fleet(ep(8001), ep(8002), ep(8003)),
        expect=C,
        runner_up=B,
    ),
    # Saturation: B holds 6,000 of a 7,200-token prompt (0.6 s of prefill saved at 10,000 tokens/s). Each engine's
    # requests hold a slot for 30 s (learned by the scraper), 40 of them running: one leaves every 0.75 s.
    Case(
        "cached but saturated endpoint loses when its slot wait exceeds the prefill saved",
        # B: 3 waiting, so this request is admitted after 4 departures: 3.0 s, against 0.6 s saved.
        SATURATED_B,
        tokens=7200,
        config=SLOT_WAIT,
        expect=A,
        runner_up=B,
    ),
    Case(
        "cached endpoint with the same load but free slots still wins",
        FleetState(
            NOW,
            matches={B: cached(6000)},
            snapshots={
                A: snap(A, running=40, mean_service_s=30.0),
                B: snap(B, running=40, kv_usage=0.9, mean_service_s=30.0),
            },
        ),
        tokens=7200,
        config=SLOT_WAIT,
        expect=B,
        runner_up=A,
    ),
    Case(
        "a short slot wait (many running, short requests) still loses to the prefill saved",
        # B: 1 waiting, 200 running at 10 s each: 2 departures take 0.1 s, less than the 0.6 s saved.
        FleetState(
            NOW,
            matches={B: cached(6000)},
            snapshots={B: snap(B, running=200, waiting=1, mean_service_s=10.0)},
        ),
        tokens=7200,
        config=SLOT_WAIT,
        expect=B,
    ),
    Case(
        "KV full with nothing waiting yet: the routers' own requests beyond the running ones are ahead",
        # Both KV-full (so the soft KV filter keeps both). A: 1 departure, 0.75 s. B: 45 sent by the routers but 40
        # running: 6 departures, 4.5 s, against 0.6 s saved.
        FleetState(
            NOW,
            matches={B: cached(6000)},
            inflight={A: InFlight(40, 0, 40000), B: InFlight(45, 0, 45000)},
            snapshots={
                A: snap(A, running=40, kv_usage=0.98, mean_service_s=30.0),
                B: snap(B, running=40, kv_usage=0.99, mean_service_s=30.0),
            },
        ),
        tokens=7200,
        config=SLOT_WAIT,
        expect=A,
    ),
    Case(
        "without a learned service time, in-flight max_tokens over the learned decode speed stand in",
        # 1,000 tokens per request at 40 tokens/s: 25 s each; 2 waiting, 40 running: 3 x 0.625 s = 1.9 s > 0.6 s.
        FleetState(
            NOW,
            matches={B: cached(6000)},
            inflight={B: InFlight(42, 0, 42000)},
            snapshots={B: snap(B, running=40, waiting=2, decode_tokens_per_s=40.0)},
        ),
        tokens=7200,
        config=SLOT_WAIT,
        expect=A,
    ),
    Case(
        "slot wait off (the default): the saturated endpoint holding the prefix keeps it",
        SATURATED_B,
        tokens=7200,
        expect=B,
    ),
    Case(
        "a fleet without metrics places as before: decode-heavy in-flight work does not outweigh the prefix",
        FleetState(NOW, matches={B: cached(6000)}, inflight={B: InFlight(60, 0, 60000)}),
        tokens=7200,
        expect=B,
    ),
    Case(
        "a stale saturated snapshot is ignored",
        FleetState(
            NOW,
            matches={B: cached(6000)},
            snapshots={B: EndpointSnapshot(B, last_seen=NOW - 60, running=40, waiting=3, mean_service_s=30.0)},
        ),
        tokens=7200,
        expect=B,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_placement_table(case: Case) -> None:
    # Several request ids and prefixes: no expectation may hinge on the tie-break hash.
    for i, request_id in enumerate(("r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8")):
        fields = {"model": "m", "messages": [{"role": "user", "content": "x"}], "request_id": request_id}
        keys = prompt(case.tokens, 1 + i * 1000)
        decision = place(RouteRequest(**{**fields, **case.request}), keys, case.config, case.state)
        if case.expect is None:
            assert decision.endpoint is None and decision.rejection is not None, decision.explain()
            assert decision.rejection.status == case.status, decision.explain()
        else:
            assert decision.endpoint == case.expect, decision.explain()
            assert decision.rejection is None
            assert decision.url == f"http://{case.expect}"
        if case.runner_up != "unchecked":
            assert (decision.runner_up.endpoint if decision.runner_up else None) == case.runner_up, decision.explain()


FOUR = fleet(ep(8001), ep(8002), ep(8003), ep(8004))
D = "127.0.0.1:8004"


def cold_picks(config: CognitoraConfig, state: FleetState, prefixes: int, tokens: int = 1024) -> list[str | None]:
    """Where ``prefixes`` cold requests, each with its own prompt prefix, are placed (each on the same state)."""
    return [
        place(
            RouteRequest(model="m", prompt="x", request_id=f"req-{i}"), prompt(tokens, 1 + i * 1000), config, state
        ).endpoint
        for i in range(prefixes)
    ]


def test_different_cold_prefixes_spread_uniformly() -> None:
    picks = cold_picks(FOUR, FleetState(NOW), 400)
    counts = {e: picks.count(e) for e in (A, B, C, D)}
    assert all(70 <= n <= 130 for n in counts.values()), counts


def _cold_picks_sharing(shared_blocks: int, total_blocks: int = 64) -> set[str | None]:
    picks = set()
    for i in range(20):
        keys = [*range(1, shared_blocks + 1), *range(5000 + i * 100, 5000 + i * 100 + total_blocks - shared_blocks)]
        shared = PromptKeys(keys=keys, prompt_tokens=total_blocks * BLOCK, exact=True, tokens_per_key=BLOCK)
        picks.add(
            place(RouteRequest(model="m", prompt="x", request_id=f"r{i}"), shared, FOUR, FleetState(NOW)).endpoint
        )
    return picks


def test_cold_requests_sharing_a_prefix_converge_before_any_cache_entry() -> None:
    # Same first 768 of 1024 tokens (48 blocks), different rest and request ids: nothing is cached or in flight yet.
    picks = _cold_picks_sharing(48)
    assert len(picks) == 1, picks


def test_cold_requests_sharing_only_a_short_head_spread() -> None:
    # Only the first 256 of 1024 tokens shared (a system prompt before long unique documents): the tie-break key
    # is taken half-way into the prompt (cost_model.affinity_prompt_share), so they do not all hash to one engine.
    assert len(_cold_picks_sharing(16)) >= 3


def test_a_learned_rate_a_few_percent_high_does_not_herd_cold_prompts() -> None:
    # A's learned rate is 4% above the prior the others still use: within the 5% tie band, so cold prompts spread.
    state = FleetState(NOW, snapshots={A: snap(A, prefill_tokens_per_s=10400)})
    picks = cold_picks(FOUR, state, 200)
    counts = {e: picks.count(e) for e in (A, B, C, D)}
    assert all(25 <= n <= 75 for n in counts.values()), counts
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), FOUR, state)
    assert "prefix affinity" in decision.reason and "tie band" in decision.reason, decision.reason


def test_a_real_speed_difference_still_wins() -> None:
    # 20% faster is outside the tie band: every cold prompt goes to the faster endpoint, when the config says that
    # it is other hardware (its own class), or when pooling is off. Within one class 20% is learning noise (below).
    slower = {e: snap(e, prefill_tokens_per_s=10000) for e in (B, C, D)}
    state = FleetState(NOW, snapshots={A: snap(A, prefill_tokens_per_s=12000), **slower})
    labeled = fleet(ep(8001, hardware="h200"), *(ep(p, hardware="h100") for p in (8002, 8003, 8004)))
    assert set(cold_picks(labeled, state, 50)) == {A}
    unpooled = fleet(ep(8001), ep(8002), ep(8003), ep(8004), placement={"rate_pooling_band": 1.0})
    assert set(cold_picks(unpooled, state, 50)) == {A}


def test_identical_engines_learned_apart_are_priced_alike() -> None:
    # Eight identical engines were learned at 7.9k-14k tokens/s on the Mooncake trace (the prompts each happened to
    # serve), and the one that looked fastest drew the longest prompts. Within the band they get their median.
    rates = {A: 7900, B: 9500, C: 11000, D: 14000}
    state = FleetState(NOW, snapshots={e: snap(e, prefill_tokens_per_s=r) for e, r in rates.items()})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), FOUR, state)
    assert {c.prefill_tokens_per_s for c in decision.candidates} == {10250}
    picks = cold_picks(FOUR, state, 200)
    assert all(25 <= picks.count(e) <= 75 for e in rates), {e: picks.count(e) for e in rates}


def test_hardware_apart_by_more_than_the_band_keeps_its_own_rates() -> None:
    # An unlabeled fleet of two GPU generations (10k and 20k tokens/s, each learned a little apart) forms two groups;
    # an engine slowed 50x is a group of its own. Each keeps what it shows, pooled only with its own group.
    rates = {A: 9000, B: 11000, C: 20000, D: 200}
    state = FleetState(NOW, snapshots={e: snap(e, prefill_tokens_per_s=r) for e, r in rates.items()})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), FOUR, state)
    got = {c.endpoint: c.prefill_tokens_per_s for c in decision.candidates}
    assert got == {A: 10000, B: 10000, C: 20000, D: 200}
    # Another engine kind is another class, however close its rate.
    mixed = fleet(ep(8001), ep(8002), ep(8003, engine="sglang"), ep(8004, engine="sglang"))
    state = FleetState(
        NOW, snapshots={e: snap(e, prefill_tokens_per_s=r) for e, r in {A: 9000, B: 11000, C: 12000, D: 13000}.items()}
    )
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), mixed, state)
    got = {c.endpoint: c.prefill_tokens_per_s for c in decision.candidates}
    assert got == {A: 10000, B: 10000, C: 12500, D: 12500}


def test_identical_engines_learned_apart_in_energy_are_priced_alike() -> None:
    # Of four identical engines, three learned 0.09-0.11 J/token from their meters and one none yet: each is priced
    # at the class's median, so the power rule has no noise between identical engines to act on.
    learned = {A: 0.09, B: 0.10, C: 0.11}
    state = FleetState(NOW, snapshots={e: snap(e, joules_per_token=j) for e, j in learned.items()})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), FOUR, state)
    assert {c.endpoint: c.joules_per_token for c in decision.candidates} == {A: 0.10, B: 0.10, C: 0.10, D: 0.10}
    # Unpooled, each keeps its own; the cold one still takes its class's median, as for prefill rates.
    unpooled = fleet(ep(8001), ep(8002), ep(8003), ep(8004), placement={"rate_pooling_band": 1.0})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), unpooled, state)
    assert {c.endpoint: c.joules_per_token for c in decision.candidates} == {**learned, D: 0.10}


def test_identical_engines_in_energy_no_longer_pull_a_request_off_its_prefix() -> None:
    # Identical engines: A holds 3/4 of the prompt behind a queue, B is cold and idle, so B's TTFT is within the
    # power slack of A's. B's meter read 0.014 J/token against A's 0.09 over one short window: its request energy
    # looked lower in spite of the recompute, and the power rule sent the request there to recompute the prompt.
    # Energy apart by more than the band stays apart (a fault or other hardware): at 0.014 B is not pooled. Read at
    # 0.08 it is, both are priced at 0.085, and the request stays with its prefix (the cache hit is the lower
    # energy). The case where pooling alone changes the pick is the next test.
    state = FleetState(
        NOW,
        matches={A: cached(3072)},
        inflight={A: InFlight(requests=1, prefill_tokens=2900)},
        snapshots={A: snap(A, joules_per_token=0.09), B: snap(B, joules_per_token=0.014)},
    )
    noisy = place(RouteRequest(model="m", prompt="x"), prompt(4096, 7), DEFAULT_FLEET, state)
    assert noisy.endpoint == B and "lower energy" in noisy.reason, noisy.reason
    state.snapshots[B] = snap(B, joules_per_token=0.08)
    pooled = place(RouteRequest(model="m", prompt="x"), prompt(4096, 7), DEFAULT_FLEET, state)
    assert pooled.endpoint == A, pooled.reason
    assert [c.joules_per_token for c in pooled.candidates] == [pytest.approx(0.085)] * 2


def test_energy_learned_a_third_apart_on_identical_engines_does_not_herd_cold_prompts() -> None:
    # A's meter read 0.075 J/token against 0.10 on the three others (inside the pooling band): unpooled, every cold
    # prompt is "lower energy" on A, with TTFTs equal everywhere, and A draws them all. Pooled, they spread.
    state = FleetState(NOW, snapshots={e: snap(e, joules_per_token=0.075 if e == A else 0.10) for e in (A, B, C, D)})
    unpooled = fleet(ep(8001), ep(8002), ep(8003), ep(8004), placement={"rate_pooling_band": 1.0})
    assert set(cold_picks(unpooled, state, 50)) == {A}
    picks = cold_picks(FOUR, state, 200)
    assert all(25 <= picks.count(e) <= 75 for e in (A, B, C, D)), {e: picks.count(e) for e in (A, B, C, D)}


def test_a_rate_learned_on_short_prompts_only_is_priced_like_its_peers_measured_on_long_ones() -> None:
    # On the Mooncake trace 3 of 8 identical engines served short prompts and were learned at ~3.4k tokens/s (a
    # step's floor) against ~9k: 2.7x "slower", they drew no long prompt and never learned better. They take the
    # median rate of their class's engines measured on long prompts, so a long cold prompt may go there.
    short = {"prefill_tokens_per_s": 3400, "prefill_rate_from_short_prompts": True}
    state = FleetState(
        NOW,
        snapshots={
            A: snap(A, prefill_tokens_per_s=9000, running=2),
            B: snap(B, prefill_tokens_per_s=9500, running=2),
            C: snap(C, **short),
            D: snap(D, **short),
        },
    )
    decision = place(RouteRequest(model="m", prompt="x"), prompt(30_000, 7), FOUR, state)
    assert {c.endpoint: c.prefill_tokens_per_s for c in decision.candidates} == {A: 9250, B: 9250, C: 9250, D: 9250}
    assert decision.endpoint in (C, D), decision.reason  # idle, and no longer priced 2.7x slower
    basis = {c.endpoint: c.basis for c in decision.candidates}
    assert "short prompts only" in basis[C] and "short prompts only" not in basis[A], basis  # explain says why
    # Other hardware is another class: a short-prompt rate there is not replaced by this class's long-prompt one.
    labeled = fleet(ep(8001), ep(8002), ep(8003, hardware="m2"), ep(8004, hardware="m2"))
    decision = place(RouteRequest(model="m", prompt="x"), prompt(30_000, 7), labeled, state)
    assert {c.endpoint: c.prefill_tokens_per_s for c in decision.candidates} == {A: 9250, B: 9250, C: 3400, D: 3400}


def test_an_engine_slowed_while_serving_cached_prompts_is_avoided_though_its_long_prompt_rate_is_unchanged() -> None:
    # A holds the prompt's 2,000-token prefix and slowed 50x while serving short, cached prompts: no long prompt
    # came to bring its long-prompt rate down, but its short prompts now take 0.75 s each instead of 15 ms. B
    # recomputes the prefix in 0.2 s, and gets the request; healthy again, A keeps it.
    rates = {"prefill_tokens_per_s": 10_000.0}
    slowed = FleetState(
        NOW,
        matches={A: cached(2000)},
        snapshots={
            A: snap(A, short_prompt_prefill_s=0.75, **rates),
            B: snap(B, short_prompt_prefill_s=0.015, **rates),
        },
    )
    decision = place(RouteRequest(model="m", prompt="x"), prompt(2050), DEFAULT_FLEET, slowed)
    assert decision.endpoint == B, decision.reason
    ttft = {c.endpoint: c.predicted_ttft_s for c in decision.candidates}
    assert ttft[A] == pytest.approx(0.75, abs=0.01) and ttft[B] == pytest.approx(0.205, abs=0.01), ttft
    assert "short prompts take 750 ms here" in decision.explain()  # explain says why A lost
    healthy = replace(slowed, snapshots={**slowed.snapshots, A: snap(A, short_prompt_prefill_s=0.015, **rates)})
    assert place(RouteRequest(model="m", prompt="x"), prompt(2050), DEFAULT_FLEET, healthy).endpoint == A


def cpu_engine_after(requests: list[tuple[int, int, float]]) -> RateEstimator:
    """What the scraper learns from a vLLM CPU engine that served ``requests`` (prompt tokens, cached tokens,
    prefill seconds) one at a time, scraped after each."""
    est = RateEstimator()
    load = EngineLoad(
        prompt_tokens_total=0.0,
        prefix_cache_hits_total=0.0,
        ttft_seconds_sum=0.0,
        ttft_count=0.0,
        prefill_seconds_sum=0.0,
        finish_count=0.0,
        finished_prompt_tokens_sum=0.0,
    )
    est.observe(load, now=0.0)
    for n, (tokens, hits, seconds) in enumerate(requests, start=1):
        load = replace(
            load,
            prompt_tokens_total=(load.prompt_tokens_total or 0) + tokens,
            prefix_cache_hits_total=(load.prefix_cache_hits_total or 0) + hits,
            ttft_seconds_sum=(load.ttft_seconds_sum or 0) + seconds,
            ttft_count=float(n),
            prefill_seconds_sum=(load.prefill_seconds_sum or 0) + seconds,
            finish_count=float(n),
            finished_prompt_tokens_sum=(load.finished_prompt_tokens_sum or 0) + tokens,
        )
        est.observe(load, now=30.0 * n)
    return est


def test_a_cached_prompt_on_a_slow_cpu_engine_stays_where_it_is_cached() -> None:
    # tests/real_engines (2 vLLM CPU engines on a loaded machine): A prefilled the first 704-token chat cold in 27 s
    # (26 tokens/s), then one with the same system prompt (672 of 704 tokens cached) in 0.5 s. B learned 80 tokens/s
    # earlier, when the machine was less loaded (more than the pooling band apart: each keeps its own rate). The
    # next chat shares the 672 cached tokens. A 704-token prompt is "short" in tokens (under long_prompt_tokens) but
    # its 27 s were all rate: taken as A's prefill floor, they priced the cached chat on A at a whole cold prefill
    # (27 s, where it takes ~0.5 s), above B's cold one (9 s), and it went to B (as chat 2 did in the CI failure).
    home = cpu_engine_after([(704, 0, 27.0), (704, 672, 0.5)])
    assert home.prefill_tokens_per_s == pytest.approx(704 / 27.0, rel=0.01)
    assert home.short_prompt_prefill_s < 1.0, home  # the cold prefill taught no floor
    state = FleetState(
        NOW,
        matches={A: cached(672)},
        snapshots={
            A: snap(
                A,
                prefill_tokens_per_s=home.prefill_tokens_per_s,
                prefill_rate_from_short_prompts=home.prefill_rate_from_short_prompts,
                short_prompt_prefill_s=home.short_prompt_prefill_s,
            ),
            B: snap(B, prefill_tokens_per_s=80.0, prefill_rate_from_short_prompts=True),
        },
    )
    shipped = fleet(ep(8001), ep(8002), placement={"recompute_weight": 1.0})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(736), shipped, state)
    assert decision.endpoint == A, decision.explain()
    ttft = {c.endpoint: c.predicted_ttft_s for c in decision.candidates}
    assert ttft[A] < 5.0 < ttft[B], ttft  # 64 uncached tokens at 26/s against 736 at 80/s


def test_an_endpoint_not_learned_yet_is_priced_at_its_peers_learned_rate() -> None:
    # A learned 12,000 tokens/s first; B, C, D (no prior, same hardware) have not learned yet. They are assumed to
    # run at the median learned rate, not at default_prefill_tokens_per_s, so cold prompts do not herd onto A.
    state = FleetState(NOW, snapshots={A: snap(A, prefill_tokens_per_s=12000)})
    picks = cold_picks(FOUR, state, 200)
    assert all(25 <= picks.count(e) <= 75 for e in (A, B, C, D)), {e: picks.count(e) for e in (A, B, C, D)}
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), FOUR, state)
    assert {c.prefill_tokens_per_s for c in decision.candidates} == {12000}
    # A configured prior still wins over the peers' rate.
    primed = fleet(ep(8001), ep(8002, prefill_tokens_per_s=5000))
    decision = place(RouteRequest(model="m", prompt="x"), prompt(1024, 7), primed, state)
    assert {c.endpoint: c.prefill_tokens_per_s for c in decision.candidates} == {A: 12000, B: 5000}


def test_tie_band_has_an_absolute_floor_for_short_prompts() -> None:
    # 64-token prompts: 6.4 ms cold everywhere; B has 40 tokens queued (+4 ms): inside the 5 ms floor, a tie.
    state = FleetState(NOW, inflight={B: InFlight(1, 40, 0)})
    picks = cold_picks(FOUR, state, 200, tokens=64)
    assert picks.count(B) >= 25, {e: picks.count(e) for e in (A, B, C, D)}


def _loaded(endpoint: str, ttft: float, recompute_s: float, decode_interference_s: float) -> CandidateScore:
    """A candidate on a loaded engine: the decode-interference charge sums seconds over its ~100 running requests."""
    return CandidateScore(
        endpoint=endpoint,
        cached_tokens=0.0,
        queued_prefill_tokens=0.0,
        prefill_tokens_per_s=10_000.0,
        predicted_ttft_s=ttft,
        recompute_penalty_s=recompute_s,
        decode_interference_s=decode_interference_s,
    )


# B2B SaaS at 30 req/s, as the router logged it: A holds the group's 6,000-token system prompt; B would recompute
# it. The decode-interference charge is ~78 s on both (their running requests' slowdown, summed), so the ranking
# costs are 78.50 and 78.70 s: 0.2 s apart, where A's own prefill estimate is 0.5 s.
HOLDER = replace(_loaded(A, 0.40, 0.10, 78.0), cached_tokens=6000.0, predicted_decode_s=80.0)
COLD = replace(_loaded(B, 1.50, 0.70, 76.5), predicted_decode_s=79.0)


def test_the_tie_band_is_relative_to_the_prefill_estimate_not_to_the_fleet_wide_charges() -> None:
    params = DEFAULT_FLEET.placement
    ranked = sorted([HOLDER, COLD], key=by_ranking_cost)
    assert ranked[0] is HOLDER
    # 5% of A's predicted TTFT + recompute charge (25 ms); 5% of its ranking cost would be 3.9 s and tie B with it,
    # and then the prefix hash, not the cache, would pick: about half the groups would go to B and recompute.
    assert tie_band_s(HOLDER, params) == pytest.approx(0.025)
    for i in range(64):
        outcome = pick(ranked, "default", params.priorities["default"], params, f"prefix-{i}")
        assert not isinstance(outcome, Rejection)
        assert outcome.chosen.endpoint == A, outcome.reason


def test_the_power_rule_does_not_trade_a_cache_hit_for_energy_under_load() -> None:
    # B's learned energy per token is a fifth of A's (noise between identical engines does that), so the request's
    # energy is lower there even with the whole prompt to prefill; but B's predicted TTFT is 1.1 s worse, far past
    # the power slack (min(50 ms, 10%)). With a band of 5% of the ranking cost B was "close" and got the request.
    params = DEFAULT_FLEET.placement
    holder = replace(HOLDER, joules_per_token=0.111, request_joules=0.111 * (1214 + 1000))
    cold = replace(COLD, joules_per_token=0.0242, request_joules=0.0242 * (7214 + 1000))
    outcome = pick(sorted([holder, cold], key=by_ranking_cost), "default", params.priorities["default"], params, "k")
    assert not isinstance(outcome, Rejection)
    assert outcome.chosen.endpoint == A, outcome.reason


def test_the_reason_names_better_ranked_candidates_that_miss_the_slo() -> None:
    # 32 x 32 at 100 rps, as the router logged it: A ranked first but predicted 2.16 s, over the 2 s objective, so
    # B was picked, and the reason read "lowest ranking cost (9400 ms vs 9400 ms on B)": B against itself.
    params = DEFAULT_FLEET.placement
    over = _loaded(A, 2.16, 0.0, 7.2)
    picked = _loaded(B, 0.50, 0.23, 8.9)
    ranked = sorted([over, picked], key=by_ranking_cost)
    assert ranked[0] is over
    outcome = pick(ranked, "default", params.priorities["default"], params, "k")
    assert not isinstance(outcome, Rejection)
    assert outcome.chosen.endpoint == B
    assert outcome.reason == (
        f"the best-ranked endpoint meeting the class's SLO; ranked above it: {A} (predicted TTFT 2160 ms over 2 s)"
    )


def test_the_power_rule_does_not_undo_the_recompute_charge_of_a_cold_engine_with_a_shorter_queue() -> None:
    # 32 x 32 at 100 rps in LiteLLM, as the router logged it: the cold engine B has no queue, so its predicted TTFT
    # (0.36 s) is below A's (1.03 s, which holds the group's prompt), but it ranks below A by the recompute charge
    # and the decode interference of recomputing there. Its learned J/token read 0.0138 against A's 0.0904 (noise:
    # the engines are identical). Bounded by TTFT alone, B was "close" and got the request, and recomputed.
    params = DEFAULT_FLEET.placement
    holder = replace(
        _loaded(A, 1.03, 0.0, 8.0),
        cached_tokens=2304.0,
        predicted_decode_s=68.5,
        joules_per_token=0.0904,
        request_joules=0.0904 * (14 + 512),
    )
    cold = replace(
        _loaded(B, 0.36, 0.23, 9.2), predicted_decode_s=69.2, joules_per_token=0.0138, request_joules=0.0138 * 2574
    )
    ranked = sorted([holder, cold], key=by_ranking_cost)
    assert ranked[0] is holder
    outcome = pick(ranked, "default", params.priorities["default"], params, "k")
    assert not isinstance(outcome, Rejection)
    assert outcome.chosen.endpoint == A, outcome.reason
    assert not outcome.reason.startswith("lower energy"), outcome.reason


def test_an_endpoint_leaving_moves_only_its_own_prefixes() -> None:
    before = cold_picks(FOUR, FleetState(NOW), 200)
    gone = FleetState(NOW, health_marks={C: HealthMark(NOW - 1, "connection refused")})
    after = cold_picks(FOUR, gone, 200)
    assert C not in after
    assert all(b == a for b, a in zip(before, after, strict=True) if b != C)


def test_prompts_shorter_than_a_block_spread_by_request() -> None:
    tiny = PromptKeys(keys=[], prompt_tokens=10, exact=True, tokens_per_key=BLOCK)
    picks = [
        place(RouteRequest(model="m", prompt="x", request_id=f"t{i}"), tiny, FOUR, FleetState(NOW)).endpoint
        for i in range(200)
    ]
    assert len(set(picks)) == 4
    again = place(RouteRequest(model="m", prompt="x", request_id="t7"), tiny, FOUR, FleetState(NOW))
    assert again.endpoint == picks[7]  # same request, same state: same answer


def attention_s(cached: int, prompt: int, rate: float, context_tokens: float = 24_000) -> float:
    """The attention term with the shipped prior (``cost_model.priors.attention_context_tokens``)."""
    return (prompt * prompt - cached * cached) / (2 * context_tokens) / rate


def test_predicted_ttft_is_the_documented_formula() -> None:
    config = fleet(ep(8001, prefill_tokens_per_s=8000), placement={"decode_penalty_s_per_running": 0.01})
    state = FleetState(NOW, matches={A: cached(1024)}, inflight={A: InFlight(3, 2000, 300)})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(4096), config, state)
    expected = (2000 + 4096 - 1024) / 8000 + 0.01 * 3 + attention_s(1024, 4096, 8000)
    assert decision.predicted_ttft_s == pytest.approx(expected)
    assert decision.predicted_cached_tokens == 1024
    [score] = decision.candidates
    assert score.decode_penalty_s == pytest.approx(0.03)


def test_tier_weighted_match_counts_less_than_gpu() -> None:
    # A holds 256 blocks on CPU (weight 0.8 -> 204.8 blocks' worth); B holds 240 blocks on GPU.
    state = FleetState(NOW, matches={A: PrefixMatch(256, 204.8), B: PrefixMatch(240, 240.0)})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(4096), DEFAULT_FLEET, state)
    assert decision.endpoint == B


def test_unknown_model_message_lists_configured_models() -> None:
    decision = place(RouteRequest(model="gpt-9", prompt="x"), prompt(16), DEFAULT_FLEET, FleetState(NOW))
    assert decision.rejection is not None
    assert decision.rejection.message == "unknown model 'gpt-9'; configured: m"


def test_sheddable_rejection_carries_retry_after_and_reason() -> None:
    state = FleetState(NOW, inflight={A: InFlight(50, 400_000, 0), B: InFlight(50, 400_000, 0)})
    decision = place(RouteRequest(model="m", prompt="x", priority="batch"), prompt(4096), DEFAULT_FLEET, state)
    assert decision.rejection is not None
    # best TTFT is ~40.4 s against a 30 s SLO: retry after the ~11 s overshoot
    assert decision.rejection.retry_after_s == 11
    assert "saturated for priority 'batch'" in decision.rejection.message
    assert decision.runner_up is not None  # the best it would have used, for the explanation


def test_excluded_endpoints_are_listed_with_their_reason() -> None:
    state = FleetState(NOW, snapshots={A: snap(A, healthy=False)})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(64), DEFAULT_FLEET, state)
    reasons = {c.endpoint: c.excluded for c in decision.candidates}
    assert reasons == {B: None, A: "unhealthy (metrics scrape failing)"}
    text = decision.explain()
    assert "unhealthy" in text and f"picked {B}" in text


def test_decision_carries_keys_and_decode_tokens_for_dispatch() -> None:
    decision = place(RouteRequest(model="m", prompt="x", max_tokens=77), prompt(64), DEFAULT_FLEET, FleetState(NOW))
    assert decision.keys == (1, 2, 3, 4)
    assert decision.expected_decode_tokens == 77


def test_prefill_role_request_uses_prefill_endpoints() -> None:
    config = fleet(ep(8001, role="prefill"), ep(8002, role="decode"))
    decision = place(RouteRequest(model="m", prompt="x"), prompt(64), config, FleetState(NOW), role=Role.PREFILL)
    assert decision.endpoint == A


def test_learned_energy_feeds_the_power_rule_however_old_the_snapshot() -> None:
    # Energy per token is a property of the hardware, not a load figure: an hour-old snapshot's still counts.
    config = fleet(ep(8001, joules_per_token=0.5), ep(8002, joules_per_token=0.1))
    old = EndpointSnapshot(A, last_seen=NOW - 3600, joules_per_token=0.02)
    learned = FleetState(NOW, matches={A: cached(256)}, snapshots={A: old})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(4096), config, learned)
    assert decision.endpoint == A
    assert {c.endpoint: c.joules_per_token for c in decision.candidates} == {A: 0.02, B: 0.1}


def test_reason_names_the_winning_terms() -> None:
    busy = FleetState(NOW, matches={B: cached(4000)}, inflight={B: InFlight(10, 20000, 0)})
    decision = place(RouteRequest(model="m", prompt="x"), prompt(4096), DEFAULT_FLEET, busy)
    assert decision.reason.startswith(f"lowest predicted TTFT (445 ms vs 2013 ms on {B}): 2000 ms less queue wait")
    config = fleet(ep(8001, joules_per_token=0.5), ep(8002, joules_per_token=0.1))
    green = place(RouteRequest(model="m", prompt="x"), prompt(4096), config, FleetState(NOW, matches={A: cached(256)}))
    expected = f"lower energy: 410 J for this request vs 1920 J on the fastest ({A}; 0.1 vs 0.5 J/token)"
    assert green.reason.startswith(expected)


def test_saturation_is_flagged_for_burst_decisions() -> None:
    saturated = FleetState(NOW, inflight={A: InFlight(50, 400_000, 0), B: InFlight(50, 300_000, 0)})
    kept = place(RouteRequest(model="m", prompt="x"), prompt(4096), DEFAULT_FLEET, saturated)
    assert kept.endpoint == B and kept.saturated and "not sheddable" in kept.reason
    shed = place(RouteRequest(model="m", prompt="x", priority="batch"), prompt(4096), DEFAULT_FLEET, saturated)
    assert shed.rejection is not None and shed.saturated
    calm = place(RouteRequest(model="m", prompt="x"), prompt(4096), DEFAULT_FLEET, FleetState(NOW))
    assert not calm.saturated


# -- bursts through the Router over an in-process store --------------------------------------------------------------

BURST_ENDPOINTS = [f"127.0.0.1:{9001 + i}" for i in range(4)]
BURST_SYSTEM = "You are the support assistant of Acme Billing. Answer from the policy below. " * 60


def burst_router(smollm2_dir: Path, **placement: Any) -> Router:
    config = config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0, **placement},
            "models": [
                {
                    "name": "m",
                    "block_size": BLOCK,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": f"http://{e}"} for e in BURST_ENDPOINTS],
                }
            ],
        }
    )
    return Router(config, MemoryStore())


def support_chat(system: str, question: str) -> RouteRequest:
    return RouteRequest(
        model="m", messages=[{"role": "system", "content": system}, {"role": "user", "content": question}]
    )


async def place_and_dispatch(router: Router, req: RouteRequest) -> Decision:
    decision, _ = await router.admit(req)
    return decision


async def test_router_cold_burst_of_different_prefixes_spreads(smollm2_dir: Path) -> None:
    router = burst_router(smollm2_dir)
    reqs = [support_chat(f"Tenant {i} of 8. " + BURST_SYSTEM, "How do refunds work?") for i in range(8)]
    decisions = await asyncio.gather(*(place_and_dispatch(router, r) for r in reqs))
    used = {d.endpoint for d in decisions}
    assert len(used) >= 3, [d.endpoint for d in decisions]


async def test_router_sequential_requests_sharing_a_cold_prefix_stay_on_one_engine(smollm2_dir: Path) -> None:
    # One after the other: each sees the earlier ones in flight and their speculative keys. The queue term charges
    # only the work a request adds behind the shared prefix (identical prompts: none), so they stay together.
    router = burst_router(smollm2_dir)
    decisions = [await place_and_dispatch(router, support_chat(BURST_SYSTEM, "How do refunds work?")) for _ in range(8)]
    assert len({d.endpoint for d in decisions}) == 1, [d.endpoint for d in decisions]
    assert all(d.predicted_cached_tokens > 0.9 * d.prompt_tokens for d in decisions[1:])


async def test_router_concurrent_burst_of_one_cold_prefix_lands_on_one_engine(smollm2_dir: Path) -> None:
    router = burst_router(smollm2_dir)
    reqs = [support_chat(BURST_SYSTEM, "How do refunds work?") for _ in range(8)]
    decisions = await asyncio.gather(*(place_and_dispatch(router, r) for r in reqs))
    assert len({d.endpoint for d in decisions}) == 1, [d.endpoint for d in decisions]


async def test_router_requests_sharing_a_system_prompt_stay_together_by_default(smollm2_dir: Path) -> None:
    # Different questions behind one ~1,000-token system prompt, one after another. Each queues its own ~25-token
    # suffix behind the first one's prefill; ranked by predicted TTFT alone (recompute_weight 0), once those exceed
    # the 5.2 ms tie band a cold endpoint is faster for the request and the prefix is built there too
    # (docs/placement.md, "Bursts of one prefix").
    questions = [f"Question {i}: how do refunds work for order {i}?" for i in range(8)]
    ttft_only = burst_router(smollm2_dir, recompute_weight=0.0)
    spread = [await place_and_dispatch(ttft_only, support_chat(BURST_SYSTEM, q)) for q in questions]
    assert len({d.endpoint for d in spread}) > 1
    assert len({d.endpoint for d in spread[:2]}) == 1  # the first ones do converge
    # The default recompute charge prices the prefill a cold endpoint would redo: they stay together.
    default = burst_router(smollm2_dir)
    together = [await place_and_dispatch(default, support_chat(BURST_SYSTEM, q)) for q in questions]
    assert len({d.endpoint for d in together}) == 1, [d.endpoint for d in together]


def test_slot_wait_is_a_named_term_of_the_prediction_and_the_reason() -> None:
    state = FleetState(
        NOW,
        matches={B: cached(6000)},
        snapshots={B: snap(B, running=40, waiting=3, mean_service_s=30.0)},
    )
    req = RouteRequest(model="m", messages=[{"role": "user", "content": "x"}], request_id="r")
    decision = place(req, prompt(7200), SLOT_WAIT, state)
    assert decision.endpoint == A
    saturated = next(c for c in decision.candidates if c.endpoint == B)
    assert saturated.slot_wait_s == pytest.approx(3.0)  # 4 departures at 40 / 30 s
    expected = 3.0 + (3 * 512 + 1200) / 10_000 + 40 * 0.0002 + attention_s(6000, 7200, 10_000)
    assert saturated.predicted_ttft_s == pytest.approx(expected)
    assert "slot wait" in decision.reason, decision.reason
    assert "at capacity: slot wait 3000 ms" in decision.explain()


ITL_SLO = fleet(
    ep(8001),
    ep(8002),
    placement={
        "priorities": {
            "default": {"ttft_slo_s": 2.0, "itl_slo_s": 0.1},
            "batch": {"ttft_slo_s": 30.0, "itl_slo_s": 0.1, "sheddable": True},
        }
    },
)


def test_an_itl_slo_moves_a_request_off_an_engine_whose_decode_step_is_too_slow() -> None:
    # A holds the prompt, but its engine measures 120 ms a token now; B is cold at 30 ms.
    state = FleetState(
        NOW,
        matches={A: cached(4000)},
        snapshots={
            A: snap(A, running=10, decode_tokens_per_s=1 / 0.120),
            B: snap(B, running=5, decode_tokens_per_s=1 / 0.030),
        },
    )
    request = RouteRequest(model="m", prompt="x")
    assert place(request, prompt(4096), DEFAULT_FLEET, state).endpoint == A  # no ITL objective: the cache wins
    decision = place(request, prompt(4096), ITL_SLO, state)
    assert decision.endpoint == B and not decision.saturated
    assert "ITL 120 ms" in decision.explain()  # the candidates' table shows what each was held to
    assert {c.endpoint: c.predicted_itl_s for c in decision.candidates} == {
        A: pytest.approx(0.120 + 4096 * 4.7e-8),
        B: pytest.approx(0.030 + 4096 * 4.7e-8),
    }


def test_the_itl_prediction_counts_the_context_sent_since_the_measurement() -> None:
    # A measured 90 ms; 300k tokens of context sent there since then add ~14 ms to each of its steps.
    snaps = {
        A: snap(A, running=10, decode_tokens_per_s=1 / 0.090),
        B: snap(B, running=5, decode_tokens_per_s=1 / 0.095),
    }
    request = RouteRequest(model="m", prompt="x")
    calm = FleetState(NOW, matches={A: cached(4000)}, snapshots=snaps)
    assert place(request, prompt(4096), ITL_SLO, calm).endpoint == A
    sent = FleetState(NOW, matches={A: cached(4000)}, snapshots=snaps, context_since_snapshot={A: 300_000.0})
    assert place(request, prompt(4096), ITL_SLO, sent).endpoint == B


def test_an_idle_or_unmeasured_engine_meets_any_itl_slo() -> None:
    # A's last busy window measured 500 ms, but nothing runs there now; B has never decoded.
    state = FleetState(
        NOW, matches={A: cached(4000)}, snapshots={A: snap(A, running=0, decode_tokens_per_s=1 / 0.5), B: snap(B)}
    )
    decision = place(RouteRequest(model="m", prompt="x"), prompt(4096), ITL_SLO, state)
    assert decision.endpoint == A and not decision.saturated
    assert all(c.predicted_itl_s is None for c in decision.candidates)


def test_over_the_itl_slo_everywhere_a_sheddable_class_is_refused_and_others_placed() -> None:
    state = FleetState(
        NOW,
        matches={A: cached(4000)},
        snapshots={
            A: snap(A, running=40, decode_tokens_per_s=1 / 0.150),
            B: snap(B, running=30, decode_tokens_per_s=1 / 0.120),
        },
    )
    shed = place(RouteRequest(model="m", prompt="x", priority="batch"), prompt(4096), ITL_SLO, state)
    assert shed.rejection is not None and shed.rejection.status == 429 and shed.saturated
    assert shed.rejection.retry_after_s == 1
    assert shed.rejection.message == (
        "fleet saturated for priority 'batch': best predicted inter-token latency 120 ms (on 127.0.0.1:8002) "
        "exceeds its ITL SLO of 100 ms; retry later"
    )
    kept = place(RouteRequest(model="m", prompt="x"), prompt(4096), ITL_SLO, state)
    assert kept.endpoint == A and kept.saturated and "not sheddable" in kept.reason
