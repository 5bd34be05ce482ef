"""``cognitora.telemetry``: what the Router records per decision and per finished attempt, with the labels a
metrics page and the decision log then show."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cognitora import jsonlog
from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.outcome import AttemptRecord, Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.decision import Decision, Rejection
from cognitora.request import RouteRequest
from cognitora.telemetry import DECISION_LOGGER, UNKNOWN, DecisionOutcome, Histogram, Telemetry, decision_outcome
from kvstate.memory_store import MemoryStore
from kvstate.store import StoreUnavailable

A, B = "127.0.0.1:8001", "127.0.0.1:8002"


def config(**placement: object) -> CognitoraConfig:
    return config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0, **placement},
            "models": [
                {"name": "m", "loras": ["m-lora"], "endpoints": [{"url": f"http://{A}"}, {"url": f"http://{B}"}]}
            ],
        }
    )


def decision(**fields: object) -> Decision:
    base: dict[str, object] = {"request_id": "r", "model": "m", "endpoint": A, "url": None, "prompt_tokens": 10}
    return Decision(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "fallback", "outcome"),
    [
        ({}, False, DecisionOutcome.PLACED),
        ({"saturated": True}, False, DecisionOutcome.SATURATED),
        ({"saturated": True, "shed_probe": True}, False, DecisionOutcome.PROBE),
        ({"degraded": True, "saturated": True}, False, DecisionOutcome.DEGRADED),
        ({"degraded": True}, True, DecisionOutcome.FALLBACK),
        ({"endpoint": None, "saturated": True, "rejection": Rejection(429, "busy", 1)}, False, DecisionOutcome.SHED),
        ({"endpoint": None, "rejection": Rejection(404, "no such model")}, False, DecisionOutcome.REJECTED),
        ({"endpoint": None, "rejection": Rejection(503, "placement failed", 1)}, True, DecisionOutcome.REJECTED),
    ],
)
def test_decision_outcomes(fields: dict[str, object], fallback: bool, outcome: DecisionOutcome) -> None:
    assert decision_outcome(decision(**fields), fallback=fallback) is outcome


def test_histogram_buckets_are_inclusive_upper_bounds() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.observe(v)
    assert h.cumulative() == [(0.1, 2), (1.0, 4), (float("inf"), 5)]
    assert h.count == 5 and h.sum == pytest.approx(8.65)


async def test_admit_counts_each_decision_with_bounded_labels() -> None:
    router = Router(config(), MemoryStore())
    for _ in range(3):
        _, attempt = await router.admit(RouteRequest(model="m", prompt="hello " * 30))
        assert attempt is not None
    await router.admit(RouteRequest(model="m-lora", prompt="hi"))
    await router.admit(RouteRequest(model="a client's free text", prompt="x"))
    await router.admit(RouteRequest(model="m", prompt="x", priority="vip-made-up"))
    table = router.telemetry.decisions
    assert sum(table.values()) == 6
    assert sum(n for (model, _, ep, out, _), n in table.items() if model == "m" and ep and out == "placed") == 3
    assert [out for (model, *_, out, _), n in table.items() if model == "m-lora"] == ["placed"]  # a LoRA: its own name
    assert (UNKNOWN, "default", "", "rejected", "404") in table
    assert ("m", UNKNOWN, "", "rejected", "400") in table
    assert router.telemetry.decision_seconds["m"].count == 4  # the 400 was decided for model m too
    assert router.telemetry.store_read_seconds.count == 5  # every configured model's placement, not the 404


async def test_finished_attempts_record_prediction_beside_achievement() -> None:
    router = Router(config(), MemoryStore())
    decision_, attempt = await router.admit(RouteRequest(model="m", prompt="hello " * 30, max_tokens=4))
    assert attempt is not None
    attempt.first_token()
    attempt.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=31, completion_tokens=4, cached_tokens=16))
    _, second = await router.admit(RouteRequest(model="m", prompt="bye " * 30))
    assert second is not None
    second.finish(Outcome(OutcomeKind.UPSTREAM_ERROR, status=500, detail="boom"))
    t = router.telemetry
    assert t.finished_attempts[("m", attempt.endpoint, "completed", "")] == 1
    assert t.finished_attempts[("m", second.endpoint, "upstream_error", "500")] == 1
    pair = ("m", attempt.endpoint)
    assert t.ttft_achieved[pair].count == t.ttft_predicted[pair].count == 1
    assert t.ttft_predicted[pair].sum == pytest.approx(decision_.predicted_ttft_s)
    assert t.regret[pair].count == 1  # two endpoints: there was a runner-up
    assert t.cache[pair].reports == 1 and t.cache[pair].achieved_cached_tokens == 16  # the failed one had no usage
    assert t.cache[pair].prompt_tokens == 31
    assert t.tokens[("m", attempt.endpoint, "completion")] == 4


def test_an_attempt_without_a_runner_up_has_no_regret() -> None:
    t = Telemetry.for_names(["m"], ["default"])
    record = AttemptRecord(
        request_id="r",
        model="m",
        endpoint=A,
        kind=OutcomeKind.COMPLETED,
        status=None,
        prompt_tokens=10,
        completion_tokens=None,
        predicted_cached_tokens=0.0,
        achieved_cached_tokens=None,
        predicted_ttft_s=0.5,
        achieved_ttft_s=0.75,
        runner_up=None,
        runner_up_predicted_ttft_s=None,
        finished_at=0.0,
    )
    t.finished(record)
    assert t.ttft_achieved[("m", A)].sum == 0.75
    assert t.regret == {} and t.tokens == {}


class _DownStore(MemoryStore):
    async def fleet_view(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        raise StoreUnavailable("down")


async def test_a_failed_store_read_is_timed_and_counted_and_the_decision_is_degraded() -> None:
    router = Router(config(), _DownStore())
    await router.admit(RouteRequest(model="m", prompt="hello"))
    assert router.telemetry.store_read_failures == 1
    assert router.telemetry.store_read_seconds.count == 1
    assert [k[3] for k in router.telemetry.decisions] == ["degraded"]


async def test_one_json_line_per_decision_at_info_and_none_above(tmp_path: Path) -> None:
    log_file = tmp_path / "log.jsonl"
    with log_file.open("w") as stream:
        jsonlog.configure("info", stream)
        router = Router(config(), MemoryStore())
        placed, _ = await router.admit(RouteRequest(model="m", prompt="hello " * 30, request_id="req-1"))
        await router.admit(RouteRequest(model="nope", prompt="x", request_id="req-2"))
        logging.getLogger(DECISION_LOGGER).setLevel(logging.WARNING)
        await router.admit(RouteRequest(model="m", prompt="quiet", request_id="req-3"))
        logging.getLogger(DECISION_LOGGER).setLevel(logging.NOTSET)
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    decisions = [line for line in lines if line["logger"] == DECISION_LOGGER]
    assert [d["request_id"] for d in decisions] == ["req-1", "req-2"]
    first, second = decisions
    assert first["msg"] == "decision" and first["level"] == "INFO"
    assert first["endpoint"] == placed.endpoint and first["outcome"] == "placed" and first["model"] == "m"
    assert first["predicted_ttft_s"] == pytest.approx(placed.predicted_ttft_s, abs=1e-6)
    assert first["predicted_cached_tokens"] == 0.0 and first["reason"]
    assert second["outcome"] == "rejected" and second["status"] == 404 and second["endpoint"] is None
    assert "unknown model 'nope'" in second["reason"]
