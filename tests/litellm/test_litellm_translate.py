"""The plugin's translation layer: model_list -> CognitoraConfig, kwargs -> RouteRequest, usage -> Outcome,
Rejection -> LiteLLM error. Pure functions: no engines, no proxy."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import datetime
from pathlib import Path
from typing import Any

import litellm
import pytest
from litellm.types.utils import ModelResponse, PromptTokensDetailsWrapper, Usage

from cognitora.config import ConfigError, EngineKind, Role
from cognitora.core.outcome import OutcomeKind
from cognitora.decision import Rejection
from cognitora.request import InvalidRequest
from litellm_plugin.fleet import build_fleet, endpoint_id, engine_url
from litellm_plugin.translate import (
    PLACEMENT_KEY,
    failure_outcome,
    placement_id,
    rejection_error,
    route_request,
    success_outcome,
)


def _dep(name: str, api_base: str | None, provider: str = "hosted_vllm", **info: Any) -> dict[str, Any]:
    """A deployment; by default of a self-hosted engine (tests/litellm/test_litellm_fleet.py has which ones are not)."""
    params: dict[str, Any] = {"model": f"{provider}/{name}", "api_key": "k"}
    if api_base is not None:
        params["api_base"] = api_base
    return {"model_name": name, "litellm_params": params, "model_info": {"id": f"{name}-{api_base}", **info}}


def test_each_engine_deployment_is_an_endpoint_named_host_port(smollm2_dir: Path) -> None:
    model_list = [
        _dep(
            "chat",
            "http://127.0.0.1:8001/v1",
            "openai",  # an engine because its model_info says so
            cognitora_kv_events="tcp://127.0.0.1:5557",
            cognitora_kv_events_replay="tcp://127.0.0.1:5558",
            cognitora_engine="sglang",
            cognitora_role="prefill",
        ),
        _dep("chat", "http://127.0.0.1:8002/v1"),
        _dep("cloud", None),  # a hosted provider: not an engine of the fleet
    ]
    args = {"models": [{"name": "chat", "block_size": 32, "tokenizer": str(smollm2_dir / "tokenizer.json")}]}
    fleet = build_fleet(model_list, args)
    assert fleet.config.model_names() == ["chat"]
    model = fleet.config.model("chat")
    assert model is not None and model.block_size == 32 and model.tokenizer == smollm2_dir / "tokenizer.json"
    first, second = model.endpoints
    assert (first.id, first.url) == ("127.0.0.1:8001", "http://127.0.0.1:8001")
    assert first.kv_events == "tcp://127.0.0.1:5557" and first.kv_events_replay == "tcp://127.0.0.1:5558"
    assert first.engine is EngineKind.SGLANG and first.role is Role.PREFILL
    assert second.id == "127.0.0.1:8002" and second.engine is EngineKind.VLLM
    assert fleet.endpoint_by_deployment == {
        "chat-http://127.0.0.1:8001/v1": "127.0.0.1:8001",
        "chat-http://127.0.0.1:8002/v1": "127.0.0.1:8002",
    }


def test_settings_come_from_a_config_file_overridden_inline(tmp_path: Path, smollm2_dir: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_bytes((smollm2_dir / "tokenizer.json").read_bytes())
    (tmp_path / "cognitora.yaml").write_text(
        "redis_url: redis://127.0.0.1:6379/0\n"
        "key_prefix: file-prefix\n"
        "placement: {speculative_ttl_s: 3}\n"
        "models:\n"
        "  - name: chat\n"
        "    tokenizer: tok/tokenizer.json\n"  # relative to the file
        "    endpoints:\n"
        "      - {url: 'http://127.0.0.1:8001', kv_events: 'tcp://127.0.0.1:6001'}\n"
        "      - {url: 'http://127.0.0.1:9999'}\n"  # not in model_list: ignored
    )
    model_list = [_dep("chat", "http://127.0.0.1:8001/v1"), _dep("chat", "http://127.0.0.1:8002/v1")]
    fleet = build_fleet(model_list, {"config": "cognitora.yaml", "key_prefix": "inline"}, base_dir=tmp_path)
    cfg = fleet.config
    assert cfg.redis_url == "redis://127.0.0.1:6379/0" and cfg.key_prefix == "inline"
    assert cfg.placement.speculative_ttl_s == 3
    model = cfg.model("chat")
    assert model is not None and model.tokenizer == (tmp_path / "tok" / "tokenizer.json").resolve()
    assert [(e.id, e.kv_events) for e in model.endpoints] == [
        ("127.0.0.1:8001", "tcp://127.0.0.1:6001"),
        ("127.0.0.1:8002", None),
    ]


@pytest.mark.parametrize(
    ("model_list", "args", "message"),
    [
        ([_dep("chat", "http://h:1/v1", cognitora_kv_event="tcp://h:2")], {}, "did you mean 'cognitora_kv_events'"),
        ([_dep("chat", "http://h:1/v1", cognitora_engine="tgi")], {}, "engine"),
        ([_dep("chat", None)], {}, "model_list has no engine for Cognitora to place on"),
        ([_dep("chat", "http://h:1/v1")], {"models": [{"name": "other"}]}, "'other' match no model_name"),
        ([_dep("chat", "http://h:1/v1")], {"placement": {"speculative_ttl": 1}}, "did you mean 'speculative_ttl_s'"),
        ([_dep("chat", "http://h:1/v1")], {"config": "/nonexistent/cognitora.yaml"}, "cannot read"),
        (
            [
                _dep("chat", "http://h:1/v1", cognitora_block_size=16),
                _dep("chat", "http://h:2/v1", cognitora_block_size=32),
            ],
            {},
            "disagrees with another deployment",
        ),
    ],
)
def test_bad_fleet_config_says_what_is_wrong(
    model_list: list[dict[str, Any]], args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_fleet(model_list, args)


def test_endpoint_ids() -> None:
    assert endpoint_id("http://10.0.0.5:8000/v1") == "10.0.0.5:8000"
    assert endpoint_id("https://gpu-3.internal/v1") == "gpu-3.internal:443"
    assert engine_url("http://10.0.0.5:8000/v1") == "http://10.0.0.5:8000"
    with pytest.raises(ConfigError):
        endpoint_id("10.0.0.5:8000")


def test_route_request_reads_only_authenticated_identity() -> None:
    kwargs = {
        "stream": True,
        "max_tokens": 64,
        "metadata": {
            "user_api_key_team_id": "team-a",
            "user_api_key_hash": "88ab",
            "user_api_key_user_id": "alice",
            "user_api_key_metadata": {"cognitora_priority": "batch"},
            "team": "forged-by-client",  # client body metadata keeps other keys: never read
            "cognitora_priority": "forged",
        },
    }
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    req = route_request("chat", messages, None, kwargs, ["a:1", "b:2"])
    assert (req.model, req.team, req.api_key_id, req.user) == ("chat", "team-a", "88ab", "alice")
    assert req.priority == "batch" and req.max_tokens == 64 and req.stream is True
    assert req.candidates == ("a:1", "b:2") and req.messages == messages and req.prompt is None
    anonymous = route_request("chat", None, "a text prompt", {}, ["a:1"])
    assert anonymous.team is None and anonymous.priority == "default" and anonymous.prompt == "a text prompt"
    assert route_request("chat", messages, None, kwargs, []).request_id != req.request_id


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_tokens": 1e20}, "'max_tokens' must be a whole number of tokens (an integer), got float 1e+20"),
        ({"max_tokens": 10**20}, "'max_tokens' is 100000000000000000000: more than any model's context window"),
        ({"max_completion_tokens": -5}, "'max_completion_tokens' must be a non-negative integer"),
        ({"max_tokens": "64"}, "'max_tokens' must be a whole number of tokens (an integer), got str '64'"),
    ],
)
def test_an_absurd_or_non_integer_max_tokens_is_refused_naming_the_field(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        route_request("chat", [{"role": "user", "content": "Q"}], None, kwargs, ["a:1"])
    assert err.value.message.startswith(says) and err.value.param == next(iter(kwargs))
    ok = route_request("chat", None, "Q", {"max_tokens": 64, "max_completion_tokens": None}, ["a:1"])
    assert ok.max_tokens == 64


def test_success_outcome_carries_usage_cached_tokens_and_ttft() -> None:
    response = ModelResponse(
        usage=Usage(
            prompt_tokens=100,
            completion_tokens=7,
            total_tokens=107,
            prompt_tokens_details=PromptTokensDetailsWrapper(cached_tokens=96),
        )
    )
    start = datetime.datetime(2026, 1, 1, 0, 0, 0)
    kwargs = {"api_call_start_time": start, "completion_start_time": start + datetime.timedelta(milliseconds=250)}
    outcome = success_outcome(kwargs, response)
    assert outcome.ok and outcome.kind is OutcomeKind.COMPLETED
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens) == (100, 7, 96)
    assert outcome.ttft_s == pytest.approx(0.25)
    bare = success_outcome({"standard_logging_object": {"prompt_tokens": 5, "completion_tokens": 2}}, None)
    assert (bare.prompt_tokens, bare.completion_tokens, bare.cached_tokens, bare.ttft_s) == (5, 2, None, None)


def test_failure_outcomes_say_how_the_attempt_ended_and_the_core_decides_health() -> None:
    refused = failure_outcome(litellm.InternalServerError("OpenAIException - Connection error.", "openai", "x"))
    assert refused.kind is OutcomeKind.CONNECT_FAILED and "Connection error" in refused.detail
    cases = {
        litellm.APIConnectionError("reset", "openai", "x"): (OutcomeKind.CONNECT_FAILED, True),
        litellm.ServiceUnavailableError("down", "openai", "x"): (OutcomeKind.UPSTREAM_ERROR, True),
        litellm.Timeout("slow", "x", "openai"): (OutcomeKind.TIMEOUT, False),
        litellm.BadRequestError("bad", "x", "openai"): (OutcomeKind.REJECTED, False),
        litellm.InternalServerError("model crashed", "openai", "x"): (OutcomeKind.UPSTREAM_ERROR, False),
    }
    for error, (kind, marks) in cases.items():
        outcome = failure_outcome(error)
        assert outcome.kind is kind, (error, outcome)
        assert outcome.kind.marks_unhealthy(outcome.status) is marks, (error, outcome)
    assert refused.kind.marks_unhealthy(refused.status)
    assert failure_outcome(None).kind is OutcomeKind.FAILED


def test_rejections_become_litellm_errors_with_their_status() -> None:
    limited = rejection_error(Rejection(429, "saturated for class batch", retry_after_s=3), "chat")
    assert isinstance(limited, litellm.RateLimitError)
    assert limited.status_code == 429 and limited.headers == {"retry-after": "3"}
    assert limited.num_retries == 0 and "saturated" in str(limited)
    assert isinstance(rejection_error(Rejection(404, "unknown model"), "x"), litellm.NotFoundError)
    assert isinstance(rejection_error(Rejection(400, "bad prompt"), "x"), litellm.BadRequestError)
    assert isinstance(rejection_error(Rejection(503, "no healthy"), "x"), litellm.ServiceUnavailableError)
    other = rejection_error(Rejection(413, "too long"), "x")
    assert getattr(other, "status_code", None) == 413


def test_placement_id_found_where_each_hook_sees_it() -> None:
    assert placement_id({"metadata": {PLACEMENT_KEY: "p1"}}) == "p1"
    assert placement_id({"litellm_params": {"metadata": {PLACEMENT_KEY: "p2"}}}) == "p2"
    assert placement_id({"litellm_metadata": {PLACEMENT_KEY: "p3"}}) == "p3"
    assert placement_id({"metadata": {}}) is None


def test_docs_name_every_routing_strategy_arg_and_model_info_key() -> None:
    from cognitora.config import CognitoraConfig, ModelConfig
    from litellm_plugin.fleet import ARGS_KEY_CONFIG, CLOUD_KEY, ENDPOINT_KEYS, MODEL_INFO_PREFIX, MODEL_KEYS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "litellm.md").read_text()
    keys = [ARGS_KEY_CONFIG, *CognitoraConfig.model_fields, *ModelConfig.model_fields]
    keys += [*(MODEL_INFO_PREFIX + k for k in (*ENDPOINT_KEYS, *MODEL_KEYS)), CLOUD_KEY]
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, f"docs/litellm.md does not document: {missing}"
