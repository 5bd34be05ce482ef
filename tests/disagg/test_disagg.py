"""Prefill/decode pairs: the pair's placement as a pure function (table), its in-flight accounting through the
router, and the wire bodies of each engine kind's two requests (engines.md section 5, field by field)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.disagg import place_with_pairs, uses_pairs
from cognitora.disagg import protocols as pd
from cognitora.disagg.pair import transfer_s
from cognitora.placement import FleetState, HealthMark
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.prompt import PromptKeys
from kvstate.store import EndpointSnapshot, InFlight, PrefixMatch

NOW = 1_000_000.0
BLOCK = 16
P1, P2, D1, D2, W = "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003", "127.0.0.1:9004", "127.0.0.1:9005"
P3 = "127.0.0.1:9006"


def fleet(
    prefill_rate: float = 30000.0,
    decode_rate: float = 1200.0,
    whole: float | None = None,
    link: dict[str, Any] | None = None,
    prefills: tuple[str, ...] = (P1, P2),
    placement: dict[str, Any] | None = None,
) -> CognitoraConfig:
    """``prefills`` (2) + 2 decode endpoints (and one ``both`` endpoint at ``whole`` tokens/s when given)."""
    endpoints: list[dict[str, Any]] = [
        *({"url": f"http://{p}", "role": "prefill", "prefill_tokens_per_s": prefill_rate} for p in prefills),
        {"url": f"http://{D1}", "role": "decode", "prefill_tokens_per_s": decode_rate},
        {"url": f"http://{D2}", "role": "decode", "prefill_tokens_per_s": decode_rate},
    ]
    if whole is not None:
        endpoints.append({"url": f"http://{W}", "prefill_tokens_per_s": whole})
    return config_from_dict(
        {
            "models": [{"name": "m", "block_size": BLOCK, "kv_bytes_per_token": 131072, "endpoints": endpoints}],
            "disaggregation": {"link_gbps": 10.0, "link_latency_s": 0.05, **(link or {})},
            "placement": {"recompute_weight": 0.0, **(placement or {})},
        }
    )


def prompt(tokens: int) -> PromptKeys:
    return PromptKeys(keys=list(range(1, tokens // BLOCK + 1)), prompt_tokens=tokens, exact=True, tokens_per_key=BLOCK)


def cached(tokens: int) -> PrefixMatch:
    return PrefixMatch(blocks=tokens // BLOCK, weighted_blocks=tokens / BLOCK)


@dataclass
class Case:
    name: str
    tokens: int
    expect_decode: str | set[str]
    expect_prefill: str | set[str] | None
    """None: placed whole."""
    config: CognitoraConfig = field(default_factory=fleet)
    state: FleetState = field(default_factory=lambda: FleetState(NOW))


CASES = [
    # A long cold prompt: 2,048 tokens are 1.7 s on a decode engine, 0.07 s + 0.27 s of transfer as a pair.
    Case("long cold prompt: split", 2048, {D1, D2}, {P1, P2}),
    # llm-d's prefix-based-pd-decider would split these (>= 16 uncached tokens); the predicted cost does not.
    Case("short prompt: whole (the transfer's set-up is dearer)", 48, {D1, D2}, None),
    Case(
        "long prompt mostly cached on a decode engine: whole there",
        2048,
        D2,
        None,
        state=FleetState(NOW, matches={D2: cached(2000)}),
    ),
    Case(
        "equal hardware everywhere: whole (a split only adds the transfer)",
        2048,
        {D1, D2},
        None,
        config=fleet(prefill_rate=10000.0, decode_rate=10000.0),
    ),
    Case(
        # Both legs pay the attention of a 30k-token prefill (and the pair a 0.08 s transfer besides): when only
        # whole placement was priced with the cost model, the pair looked ~1.9 s cheaper and split.
        "equal hardware, a fast link, a long-context prompt: whole",
        30_000,
        {D1, D2},
        None,
        config=fleet(prefill_rate=10000.0, decode_rate=10000.0, link={"link_gbps": 400.0, "link_latency_s": 0.0005}),
    ),
    Case(
        "an idle aggregated engine as fast as the prefill pool: whole there",
        2048,
        W,
        None,
        config=fleet(whole=30000.0),
    ),
    Case(
        "prefill endpoint by its prefix cache",
        4096,
        {D1, D2},
        P2,
        state=FleetState(NOW, matches={P2: cached(3000)}),
    ),
    Case(
        "prefill endpoint by its queue",
        4096,
        {D1, D2},
        P1,
        state=FleetState(NOW, inflight={P2: InFlight(3, 60000, 0)}),
    ),
    Case(
        "decode endpoint by decode load",
        2048,
        D2,
        {P1, P2},
        state=FleetState(NOW, inflight={D1: InFlight(200, 0, 40000)}),
    ),
    Case(
        "decode endpoint with no KV room is not paired",
        2048,
        D2,
        {P1, P2},
        state=FleetState(NOW, snapshots={D1: EndpointSnapshot(D1, last_seen=NOW - 0.5, kv_usage=0.99)}),
    ),
    Case(
        "decode endpoint holding part of the prompt: less to move",
        4096,
        D1,
        {P1, P2},
        state=FleetState(NOW, matches={D1: cached(1024)}),
    ),
    Case(
        "every prefill endpoint down: whole",
        2048,
        {D1, D2},
        None,
        state=FleetState(NOW, health_marks={P1: HealthMark(NOW - 1, "refused"), P2: HealthMark(NOW - 1, "refused")}),
    ),
    Case(
        "a required gain the pair does not reach: whole",
        2048,
        {D1, D2},
        None,
        config=fleet(link={"min_gain_s": 5.0}),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_pair_placement(case: Case) -> None:
    req = RouteRequest(model="m", prompt="x", request_id="r1", max_tokens=32)
    d = place_with_pairs(req, prompt(case.tokens), case.config, case.state)
    assert d.rejection is None, d.reason
    assert d.endpoint in ({case.expect_decode} if isinstance(case.expect_decode, str) else case.expect_decode)
    if case.expect_prefill is None:
        assert d.prefill is None, d.explain()
        return
    assert d.prefill is not None, d.explain()
    expected = {case.expect_prefill} if isinstance(case.expect_prefill, str) else case.expect_prefill
    assert d.prefill.endpoint in expected
    # One unit: the pair's predicted TTFT is its three legs, and it beat the best whole placement.
    leg = d.prefill
    assert d.predicted_ttft_s == pytest.approx(leg.prefill_s + leg.transfer_s + leg.admission_s)
    assert leg.whole_ttft_s is not None and d.predicted_ttft_s < leg.whole_ttft_s
    assert "split: prefill on" in d.explain()


def test_transfer_prices_the_uncached_tokens_at_the_link() -> None:
    config = fleet()
    model = config.models[0]
    assert uses_pairs(model)
    # 1,000 tokens x 128 KiB x 8 bits over 10 Gb/s = 0.105 s, plus 50 ms of set-up.
    assert transfer_s(config, model, 1000) == pytest.approx(0.05 + 1000 * 131072 * 8 / 10e9)
    assert transfer_s(config, model, 0) == pytest.approx(0.05)


def test_a_fleet_without_prefill_endpoints_is_not_paired() -> None:
    config = config_from_dict({"models": [{"name": "m", "endpoints": [{"url": "http://h:1", "role": "decode"}]}]})
    assert not uses_pairs(config.models[0])


# The prefill pick's load bound (placement.tie_cache_bound, as in whole placement: test_tie_cache_bound.py). P1 holds
# 125 blocks (2,000 tokens, half its 4,096-token cache) of groups split earlier; P2 none; P3 10 (160 tokens: within
# the default bound of 0.1 x 4,096 tokens of the emptiest).
PREFILL_CAPACITY = 4096
P1_HOLDS_OTHER_GROUPS = FleetState(
    NOW,
    snapshots={
        p: EndpointSnapshot(endpoint=p, last_seen=NOW - 0.5, kv_capacity_tokens=PREFILL_CAPACITY, cached_blocks=n)
        for p, n in {P1: 125, P2: 0, P3: 10}.items()
    },
)


def prefill_picks(config: CognitoraConfig, state: FleetState, prefixes: int = 60) -> list[str | None]:
    """The prefill endpoint of each of ``prefixes`` never-seen 2,048-token prompts (all split), each placed on
    ``state``."""
    picks: list[str | None] = []
    for i in range(prefixes):
        keys = list(range(1 + i * 1000, 1 + i * 1000 + 2048 // BLOCK))
        req = RouteRequest(model="m", prompt="x", request_id=f"r{i}", max_tokens=32)
        d = place_with_pairs(req, PromptKeys(keys, 2048, True, BLOCK), config, state)
        assert d.prefill is not None, d.explain()
        picks.append(d.prefill.endpoint)
    return picks


def test_cold_prefixes_are_not_prefilled_on_the_tied_prefill_engine_holding_other_groups() -> None:
    shipped = fleet(prefills=(P1, P2, P3))
    hashed = prefill_picks(fleet(prefills=(P1, P2, P3), placement={"tie_cache_bound": None}), P1_HOLDS_OTHER_GROUPS)
    assert hashed.count(P1) >= 10, "the hash alone gives the fullest prefill engine about a third of them"
    bounded = prefill_picks(shipped, P1_HOLDS_OTHER_GROUPS)
    assert P1 not in bounded
    assert bounded.count(P2) >= 20 and bounded.count(P3) >= 20, "the hash still spreads them over the rest"
    # Only what P1 would have got moves: a prefix the hash gave P2 or P3 stays there (the rendezvous property).
    assert all(b == h for b, h in zip(bounded, hashed, strict=True) if h != P1)
    # A prefix P1 clearly holds is cheaper to prefill there: not a tie, so the bound does not move it.
    held = FleetState(NOW, matches={P1: cached(1536)}, snapshots=P1_HOLDS_OTHER_GROUPS.snapshots)
    for i in range(10):
        keys = [*range(1, 1 + 1536 // BLOCK), *range(5000 + 100 * i, 5000 + 100 * i + 512 // BLOCK)]
        req = RouteRequest(model="m", prompt="x", request_id=f"q{i}", max_tokens=32)
        d = place_with_pairs(req, PromptKeys(keys, 2048, True, BLOCK), shipped, held)
        assert d.prefill is not None and d.prefill.endpoint == P1, d.explain()


async def test_router_counts_the_prefill_on_the_prefill_endpoint_and_releases_both() -> None:
    store = MemoryStore()
    router = Router(fleet(), store)
    req = RouteRequest(model="m", prompt="word " * 3000, max_tokens=40)
    decision, attempt = await router.admit(req)
    assert attempt is not None and decision.prefill is not None, decision.explain()
    p, d = decision.prefill.endpoint, decision.endpoint
    assert d is not None
    await attempt.settled()
    work = await store.inflight([p, d])
    assert work[p] == InFlight(1, decision.prompt_tokens - round(decision.predicted_cached_tokens), 0)
    assert work[d] == InFlight(1, 0, 40)
    attempt.first_token()  # the prefill is over: the prefill endpoint is done with it
    await attempt.settled()
    work = await store.inflight([p, d])
    assert work[p] == InFlight() and work[d] == InFlight(1, 0, 40)
    attempt.finish(Outcome(OutcomeKind.COMPLETED))
    await attempt.settled()
    assert await store.inflight([p, d]) == {p: InFlight(), d: InFlight()}


async def test_a_pair_that_ends_before_its_first_token_releases_both() -> None:
    store = MemoryStore()
    router = Router(fleet(), store)
    decision, attempt = await router.admit(RouteRequest(model="m", prompt="word " * 3000, max_tokens=8))
    assert attempt is not None and decision.prefill is not None and decision.endpoint is not None
    attempt.finish(Outcome(OutcomeKind.CONNECT_FAILED, detail="sidecar gone"))
    await attempt.settled()
    ids = [decision.prefill.endpoint, decision.endpoint]
    assert await store.inflight(ids) == {e: InFlight() for e in ids}


# -- the wire bodies ----------------------------------------------------------------------------------------------
CLIENT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 64,
    "max_completion_tokens": 64,
    "min_tokens": 4,
}


def test_vllm_nixl_prefill_and_decode_bodies() -> None:
    pre = pd.vllm_prefill_body(CLIENT)
    assert pre["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert pre["stream"] is False and "stream_options" not in pre and "min_tokens" not in pre
    assert pre["max_tokens"] == 1 and pre["max_completion_tokens"] == 1
    assert CLIENT["max_tokens"] == 64 and "kv_transfer_params" not in CLIENT  # the caller's body is not touched
    returned = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r", "remote_block_ids": [1]}
    dec = pd.vllm_decode_body(CLIENT, {"kv_transfer_params": returned})
    assert dec["kv_transfer_params"] == returned  # passed through unchanged
    assert {k: v for k, v in dec.items() if k != "kv_transfer_params"} == CLIENT  # the client's own limits, stream
    with pytest.raises(pd.ProtocolError, match="kv_transfer_params"):
        pd.vllm_decode_body(CLIENT, {"choices": []})


def test_sglang_bootstrap_fields_in_both_bodies_one_per_batch_item() -> None:
    pre, dec = pd.sglang_bodies(CLIENT, "10.0.0.7", 8998, 42)
    for b in (pre, dec):
        assert (b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"]) == ("10.0.0.7", 8998, 42)
        assert b["stream"] is True  # the same body to both: SGLang's prefill server answers it its own way
    batch = {"model": "m", "prompt": ["a", "b", "c"]}
    pre, _ = pd.sglang_bodies(batch, "h", 1, 7)
    assert pre["bootstrap_host"] == ["h"] * 3 and pre["bootstrap_port"] == [1] * 3
    assert len(set(pre["bootstrap_room"])) == 3
    assert 0 <= pd.sglang_room() < 2**63


def test_trtllm_context_and_generation_bodies() -> None:
    ctx = pd.trtllm_context_body(CLIENT)
    assert ctx["disaggregated_params"] == {"request_type": "context_only"} and ctx["stream"] is False
    answer = {"choices": [{"disaggregated_params": {"request_type": "context_only", "ctx_request_id": 5}}]}
    gen = pd.trtllm_generation_body(CLIENT, answer)
    assert gen["disaggregated_params"] == {"request_type": "generation_only", "ctx_request_id": 5}
    assert answer["choices"][0]["disaggregated_params"]["request_type"] == "context_only"  # a copy was changed
    with pytest.raises(pd.ProtocolError, match="disaggregated_params"):
        pd.trtllm_generation_body(CLIENT, {"choices": [{}]})


def test_classic_pd_splits_even_what_a_decode_engine_would_take_whole() -> None:
    config = fleet(prefill_rate=10000.0, decode_rate=10000.0, link={"whole_on_decode": False})
    req = RouteRequest(model="m", prompt="x", request_id="r1", max_tokens=32)
    d = place_with_pairs(req, prompt(2048), config, FleetState(NOW))
    assert d.prefill is not None and d.endpoint in {D1, D2}, d.explain()
    # With the prefill pool down, a decode engine still takes it whole rather than the request being refused.
    down = {P1: HealthMark(NOW - 1, "refused"), P2: HealthMark(NOW - 1, "refused")}
    d = place_with_pairs(req, prompt(2048), config, FleetState(NOW, health_marks=down))
    assert d.rejection is None and d.prefill is None and d.endpoint in {D1, D2}


async def test_envoy_drops_a_clients_prefill_header_and_sets_the_pairs() -> None:
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from envoy_extproc.addresses import AddressBook
    from envoy_extproc.processor import Exchange
    from envoy_extproc.settings import parse_settings

    def header_map(**values: str) -> Any:
        message = ep.HttpHeaders()
        for key, value in values.items():
            message.headers.headers.append(base_pb2.HeaderValue(key=key, raw_value=value.encode()))
        return message

    router = Router(fleet(), MemoryStore())
    exchange = Exchange(router, parse_settings(["--config", "c.yaml"]), AddressBook({}))
    forged = header_map(**{":path": "/v1/completions", ":method": "POST", "x-cognitora-prefill-endpoint": "evil:1"})
    answer = await exchange.on_request_headers(forged)
    assert list(answer.request_headers.response.header_mutation.remove_headers) == ["x-cognitora-prefill-endpoint"]
    body = ep.HttpBody(
        body=b'{"model": "m", "prompt": "' + b"word " * 3000 + b'", "max_tokens": 8}', end_of_stream=True
    )
    answer = await exchange.on_request_body(body)
    sets = {h.header.key: h.header.raw_value.decode() for h in answer.request_body.response.header_mutation.set_headers}
    assert sets["x-cognitora-prefill-endpoint"] in {f"http://{P1}", f"http://{P2}"}
    assert sets["x-gateway-destination-endpoint"] in {D1, D2}
    exchange.attempt.finish(Outcome(OutcomeKind.COMPLETED))  # type: ignore[union-attr]


async def test_the_sidecar_uses_only_the_prefill_endpoints_it_allows() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from cognitora.disagg.sidecar import Sidecar, SidecarSettings

    calls: list[str] = []

    async def engine(request: web.Request) -> web.Response:
        calls.append(request.headers.get("x-cognitora-prefill-endpoint", "-"))
        return web.json_response({"choices": [{"message": {"content": "ok"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine)
    async with TestServer(app) as upstream:
        url = str(upstream.make_url("")).rstrip("/")
        sidecar = Sidecar(SidecarSettings(engine_url=url, allowed_prefill=frozenset({"p:1"})))
        async with TestClient(TestServer(sidecar.build_app())) as client:
            r = await client.post(
                "/v1/chat/completions",
                json={"model": "m"},
                headers={"x-cognitora-prefill-endpoint": "169.254.169.254:80"},
            )
            assert r.status == 200 and r.headers["x-cognitora-pd"] == "fallback"
            assert "not allowed" in r.headers["x-cognitora-pd-fallback"]
    assert calls == ["-"]  # answered locally, and the header never reached the engine
