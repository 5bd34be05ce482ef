"""Which LiteLLM deployments are engines, and how ``routing_strategy_args`` combine with a ``config:`` file:
merged deeply, paths relative to the file that names them, secrets from the environment; and what the strategy
refuses at start inside a proxy of several workers. No engines; the proxy is stood in for by the two facts it leaves
for its workers (tests/e2e/test_litellm_e2e.py starts the real one).
"""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from cognitora.config import ConfigError, EngineKind
from litellm_plugin.fleet import build_fleet, merge_settings
from litellm_plugin.live import ReloadedFleet, config_source


def dep(group: str, model: str, api_base: str | None, id_: str, **info: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"model": model, "api_key": "k"}
    if api_base is not None:
        params["api_base"] = api_base
    return {"model_name": group, "litellm_params": params, "model_info": {"id": id_, **info}}


def endpoints_of(fleet: Any, group: str = "chat") -> list[str]:
    model = fleet.config.model(group)
    assert model is not None
    return [e.id for e in model.endpoints]


# -- a deployment is an engine only when it says so -------------------------------------------------------------


def test_a_cloud_deployment_in_an_engine_group_is_never_an_endpoint() -> None:
    model_list = [
        dep("chat", "hosted_vllm/smollm2", "http://127.0.0.1:8001/v1", "vllm-a"),
        dep("chat", "openai/smollm2", "http://127.0.0.1:8002/v1", "engine-b", cognitora_engine="sglang"),
        dep("chat", "azure/gpt-4o-mini", "https://my-org.openai.azure.com", "azure"),
        dep("chat", "openai/gpt-4o-mini", "http://127.0.0.1:4001/v1", "local-gateway"),  # localhost is not enough
        dep("chat", "anthropic/claude-3-5-haiku", None, "anthropic"),
    ]
    fleet = build_fleet(model_list, {})
    assert endpoints_of(fleet) == ["127.0.0.1:8001", "127.0.0.1:8002"]
    # Only engines are endpoints, so only they are scraped and only they are candidates of the group.
    assert fleet.endpoint_by_deployment == {"vllm-a": "127.0.0.1:8001", "engine-b": "127.0.0.1:8002"}
    assert fleet.config.endpoint("my-org.openai.azure.com:443") is None
    assert fleet.config.endpoint("127.0.0.1:4001") is None


def test_the_provider_gives_the_engine_kind_and_model_info_overrides_it() -> None:
    model_list = [
        dep("chat", "hosted_vllm/smollm2", "http://127.0.0.1:8001/v1", "a"),
        dep("chat", "ollama/smollm2", "http://127.0.0.1:11434", "b"),
        dep("chat", "ollama_chat/smollm2", "http://127.0.0.1:11435", "c", cognitora_engine="llamacpp"),
        {
            "model_name": "chat",
            "litellm_params": {"model": "smollm2", "custom_llm_provider": "hosted_vllm", "api_base": "http://h:9/v1"},
            "model_info": {"id": "d"},
        },
    ]
    model = build_fleet(model_list, {}).config.model("chat")
    assert model is not None
    assert [(e.id, e.engine) for e in model.endpoints] == [
        ("127.0.0.1:8001", EngineKind.VLLM),
        ("127.0.0.1:11434", EngineKind.OPENAI),  # health-checked only: Ollama has no vLLM metrics
        ("127.0.0.1:11435", EngineKind.LLAMACPP),
        ("h:9", EngineKind.VLLM),
    ]


def test_an_engine_listed_in_routing_strategy_args_needs_no_model_info() -> None:
    model_list = [
        dep("chat", "openai/smollm2", "http://127.0.0.1:8001/v1", "a"),
        dep("chat", "openai/smollm2", "http://127.0.0.1:8002/v1", "b"),
    ]
    args = {"models": [{"name": "chat", "endpoints": [{"url": "http://127.0.0.1:8001", "engine": "sglang"}]}]}
    model = build_fleet(model_list, args).config.model("chat")
    assert model is not None and [(e.id, e.engine) for e in model.endpoints] == [("127.0.0.1:8001", EngineKind.SGLANG)]


def test_a_deployment_that_claims_to_be_an_engine_needs_an_api_base() -> None:
    with pytest.raises(ConfigError) as info:
        build_fleet([dep("chat", "openai/smollm2", None, "a", cognitora_kv_events="tcp://h:5557")], {})
    message = str(info.value)
    assert message.startswith("model_list[0] (model_name 'chat', api_base None): model_info has cognitora_kv_events")
    assert "Set it." in message


def test_a_fleet_without_engines_says_how_to_mark_one() -> None:
    model_list = [dep("chat", "openai/smollm2", "http://127.0.0.1:8001/v1", "a")]
    with pytest.raises(ConfigError) as info:
        build_fleet(model_list, {})
    message = str(info.value)
    assert "model_list has no engine for Cognitora to place on (1 deployment(s), none of them an engine)" in message
    assert "cognitora_engine: vllm" in message and "hosted_vllm/" in message


# -- routing_strategy_args over a config: file -------------------------------------------------------------------

ENGINES = [
    dep("chat", "hosted_vllm/smollm2", "http://127.0.0.1:8001/v1", "a"),
    dep("chat", "hosted_vllm/smollm2", "http://127.0.0.1:8002/v1", "b"),
]


def test_inline_keys_merge_deeply_over_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "cognitora.yaml").write_text(
        "scrape: {interval_s: 0.5}\n"
        "placement:\n"
        "  store_timeout_s: 2.0\n"
        "  priorities:\n"
        "    default: {ttft_slo_s: 1.5}\n"
        "    interactive: {ttft_slo_s: 0.5}\n"
        "    batch: {ttft_slo_s: 20, sheddable: true}\n"
        "models:\n"
        "  - name: chat\n"
        "    block_size: 32\n"
        "    endpoints:\n"
        "      - {url: 'http://127.0.0.1:8001', kv_events: 'tcp://127.0.0.1:5557'}\n"
        "      - {url: 'http://127.0.0.1:8002', kv_events: 'tcp://127.0.0.1:5559'}\n"
    )
    args = {
        "config": "cognitora.yaml",
        "placement": {"store_timeout_s": 0.5, "priorities": {"batch": {"ttft_slo_s": 10}}},
        # a list replaces the file's list: only 8001's facts are given now
        "models": [{"name": "chat", "endpoints": [{"url": "http://127.0.0.1:8001", "prefill_tokens_per_s": 5000}]}],
    }
    config = build_fleet(ENGINES, args, base_dir=tmp_path).config
    assert config.placement.store_timeout_s == 0.5
    priorities = config.placement.priorities
    assert set(priorities) == {"default", "interactive", "batch"}  # not dropped by the inline placement
    assert priorities["default"].ttft_slo_s == 1.5 and priorities["interactive"].ttft_slo_s == 0.5
    assert priorities["batch"].ttft_slo_s == 10 and priorities["batch"].sheddable
    assert config.scrape.interval_s == 0.5
    model = config.model("chat")
    assert model is not None and model.block_size == 32  # the file's model entry, merged by name
    a, b = model.endpoints
    assert (a.kv_events, a.prefill_tokens_per_s) == (None, 5000)
    assert (b.id, b.kv_events) == ("127.0.0.1:8002", None)


def test_merging_leaves_both_sources_untouched() -> None:
    base = {"placement": {"priorities": {"default": {"ttft_slo_s": 1}}}, "models": [{"name": "m", "block_size": 8}]}
    override = {"placement": {"priorities": {"default": {"sheddable": True}}}, "models": [{"name": "m"}]}
    merged = merge_settings(base, override)
    assert merged["placement"] == {"priorities": {"default": {"ttft_slo_s": 1, "sheddable": True}}}
    assert merged["models"] == [{"name": "m", "block_size": 8}]
    assert base["placement"] == {"priorities": {"default": {"ttft_slo_s": 1}}}
    assert override["placement"] == {"priorities": {"default": {"sheddable": True}}}


def test_paths_are_relative_to_the_file_that_names_them_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    litellm_dir = tmp_path / "proxy"  # where the LiteLLM config lives
    (litellm_dir / "models").mkdir(parents=True)
    (litellm_dir / "models" / "chat.json").write_text("{}")
    (litellm_dir / "models" / "tool.json").write_text("{}")
    (litellm_dir / "cognitora").mkdir()
    (litellm_dir / "cognitora" / "template.jinja").write_text("{{ messages }}")
    (litellm_dir / "cognitora" / "cognitora.yaml").write_text(
        "models: [{name: chat, chat_template: template.jinja}, {name: tool, tokenizer: ../models/tool.json}]\n"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the proxy was started from another directory
    model_list = [*ENGINES, dep("tool", "hosted_vllm/t", "http://127.0.0.1:8003/v1", "t")]
    args = {"config": "cognitora/cognitora.yaml", "models": [{"name": "chat", "tokenizer": "models/chat.json"}]}
    config = build_fleet(model_list, args, base_dir=litellm_dir).config
    chat, tool = config.model("chat"), config.model("tool")
    assert chat is not None and tool is not None
    assert chat.tokenizer == (litellm_dir / "models" / "chat.json").resolve()  # inline: the LiteLLM config's dir
    assert chat.chat_template == (litellm_dir / "cognitora" / "template.jinja").resolve()  # the file's own dir
    assert tool.tokenizer == (litellm_dir / "models" / "tool.json").resolve()

    by_model_info = [
        dep("chat", "hosted_vllm/s", "http://127.0.0.1:8001/v1", "a", cognitora_tokenizer="models/chat.json")
    ]
    model = build_fleet(by_model_info, {}, base_dir=litellm_dir).config.model("chat")
    assert model is not None and model.tokenizer == (litellm_dir / "models" / "chat.json").resolve()


def test_secrets_come_from_the_environment_inline_in_the_file_and_in_model_info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COG_TEST_REDIS_URL", "redis://:pw@10.0.0.9:6379/0")
    monkeypatch.setenv("COG_TEST_PREFIX", "fleet-7")
    monkeypatch.setenv("COG_TEST_EVENTS", "tcp://10.0.0.5:5557")
    (tmp_path / "cognitora.yaml").write_text("key_prefix: os.environ/COG_TEST_PREFIX\n")
    model_list = [
        dep("chat", "hosted_vllm/s", "http://127.0.0.1:8001/v1", "a", cognitora_kv_events="os.environ/COG_TEST_EVENTS")
    ]
    args = {"config": "cognitora.yaml", "redis_url": "os.environ/COG_TEST_REDIS_URL"}
    config = build_fleet(model_list, args, base_dir=tmp_path).config
    assert (config.redis_url, config.key_prefix) == ("redis://:pw@10.0.0.9:6379/0", "fleet-7")
    assert config.models[0].endpoints[0].kv_events == "tcp://10.0.0.5:5557"


def test_an_unset_variable_names_the_key_the_variable_and_where_it_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COG_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError) as inline:
        build_fleet(ENGINES, {"redis_url": "os.environ/COG_TEST_UNSET"})
    assert str(inline.value) == (
        "LiteLLM routing_strategy_args: redis_url: os.environ/COG_TEST_UNSET names the environment variable "
        "COG_TEST_UNSET, which is not set; set COG_TEST_UNSET (or write the value itself)"
    )
    (tmp_path / "cognitora.yaml").write_text("redis_url: os.environ/COG_TEST_UNSET\n")
    with pytest.raises(ConfigError) as in_file:
        build_fleet(ENGINES, {"config": "cognitora.yaml"}, base_dir=tmp_path)
    assert str(in_file.value).startswith(f"{tmp_path / 'cognitora.yaml'}: redis_url: os.environ/COG_TEST_UNSET names")
    model_list = [dep("chat", "hosted_vllm/s", "http://h:1/v1", "a", cognitora_kv_events="os.environ/COG_TEST_UNSET")]
    with pytest.raises(ConfigError, match=r"^model_list\[0\] .*: model_info: cognitora_kv_events: os.environ/COG"):
        build_fleet(model_list, {})


def test_a_null_from_the_proxy_is_refused_not_taken_for_embedded_mode() -> None:
    # What LiteLLM's proxy hands us for `redis_url: os.environ/REDIS_URL` when REDIS_URL is not set.
    with pytest.raises(ConfigError) as info:
        build_fleet(ENGINES, {"redis_url": None})
    assert str(info.value).startswith("routing_strategy_args.redis_url is null. LiteLLM's proxy turns os.environ/NAME")
    model_list = [dep("chat", "hosted_vllm/s", "http://h:1/v1", "a", cognitora_kv_events=None)]
    with pytest.raises(ConfigError, match=r"model_info\.cognitora_kv_events is null"):
        build_fleet(model_list, {})


@pytest.mark.parametrize(
    ("file_text", "args", "says"),
    [
        (None, {"placment": {}}, "(top level): unknown key 'placment'; did you mean 'placement'?"),
        ("placement: {speculative_ttl: 1}\n", {}, "placement: unknown key 'speculative_ttl'; did you mean"),
        (None, {"placement": {"priorities": {"batch": {"ttft_slo": 3}}}}, "placement.priorities.batch: unknown key"),
        ("key_prefix: a\nkey_prefix: b\n", {}, "cognitora.yaml: line 2: duplicate key 'key_prefix'"),
        (None, {"models": [{"block_size": 8}]}, "routing_strategy_args.models[0] (inline): expected a mapping with"),
    ],
)
def test_bad_keys_still_name_the_key(tmp_path: Path, file_text: str | None, args: dict[str, Any], says: str) -> None:
    if file_text is not None:
        (tmp_path / "cognitora.yaml").write_text(file_text)
        args = {**args, "config": "cognitora.yaml"}
    with pytest.raises(ConfigError) as info:
        build_fleet(ENGINES, args, base_dir=tmp_path)
    assert says in str(info.value)
    if file_text is not None:
        assert str(tmp_path / "cognitora.yaml") in str(info.value)  # which file the bad key is in


def test_export_reads_the_litellm_config_as_the_proxy_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from litellm_plugin.export import config_from_litellm_yaml

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tokenizer.json").write_text("{}")
    (tmp_path / "litellm_config.yaml").write_text(
        "model_list:\n"
        "  - model_name: chat\n"
        "    litellm_params: {model: hosted_vllm/s, api_base: os.environ/COG_TEST_ENGINE}\n"
        "  - model_name: chat\n"
        "    litellm_params: {model: azure/gpt-4o, api_base: 'https://o.azure.com', api_key: os.environ/COG_NO}\n"
        "router_settings:\n"
        "  routing_strategy_args: {models: [{name: chat, tokenizer: models/tokenizer.json}]}\n"
    )
    monkeypatch.setenv("COG_TEST_ENGINE", "http://10.0.0.5:8000/v1")
    monkeypatch.delenv("COG_NO", raising=False)  # the cloud deployment's key: not needed to export the fleet
    monkeypatch.chdir(tmp_path.parent)
    config = config_from_litellm_yaml(tmp_path / "litellm_config.yaml")
    model = config.model("chat")
    assert model is not None and [e.id for e in model.endpoints] == ["10.0.0.5:8000"]
    assert model.tokenizer == (tmp_path / "models" / "tokenizer.json").resolve()


# -- inside the proxy: its config's folder, its worker count ------------------------------------------------------


def in_proxy(monkeypatch: pytest.MonkeyPatch, config_path: Path, workers: int) -> None:
    """What a proxy worker holds when the Router is built: the proxy module (with the config path) and NUM_WORKERS."""
    monkeypatch.setitem(
        sys.modules, "litellm.proxy.proxy_server", types.SimpleNamespace(user_config_file_path=str(config_path))
    )
    monkeypatch.setenv("NUM_WORKERS", str(workers))


def test_embedded_mode_is_refused_in_a_proxy_of_several_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import litellm

    import litellm_plugin

    litellm_plugin.install()
    (tmp_path / "litellm_config.yaml").write_text("{}")
    in_proxy(monkeypatch, tmp_path / "litellm_config.yaml", workers=4)
    with pytest.raises(ConfigError) as info:
        litellm.Router(model_list=ENGINES, routing_strategy="cognitora", routing_strategy_args={})
    message = str(info.value)
    assert message.startswith("routing_strategy_args has no redis_url (embedded mode), but the proxy runs 4 worker")
    assert "Set redis_url" in message and "cognitora collector" in message

    shared = litellm.Router(
        model_list=ENGINES, routing_strategy="cognitora", routing_strategy_args={"redis_url": "redis://127.0.0.1:9/0"}
    )
    try:
        assert litellm_plugin.strategy_for(shared).fleet.config.redis_url == "redis://127.0.0.1:9/0"
    finally:
        shared.update_settings(routing_strategy="simple-shuffle")

    monkeypatch.setenv("NUM_WORKERS", "1")
    single = litellm.Router(model_list=ENGINES, routing_strategy="cognitora", routing_strategy_args={})
    single.update_settings(routing_strategy="simple-shuffle")


def test_inline_paths_in_the_proxy_are_relative_to_its_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_dir: Path
) -> None:
    import litellm

    import litellm_plugin

    litellm_plugin.install()
    (tmp_path / "proxy" / "models").mkdir(parents=True)
    # a real tokenizer: the strategy loads it when the Router installs it (a "{}" is refused at start)
    shutil.copy(smollm2_dir / "tokenizer.json", tmp_path / "proxy" / "models" / "tokenizer.json")
    (tmp_path / "proxy" / "litellm_config.yaml").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    in_proxy(monkeypatch, tmp_path / "proxy" / "litellm_config.yaml", workers=1)
    args = {"models": [{"name": "chat", "tokenizer": "models/tokenizer.json"}]}
    router = litellm.Router(model_list=ENGINES, routing_strategy="cognitora", routing_strategy_args=args)
    try:
        model = litellm_plugin.strategy_for(router).fleet.config.model("chat")
        assert model.tokenizer == (tmp_path / "proxy" / "models" / "tokenizer.json").resolve()
    finally:
        router.update_settings(routing_strategy="simple-shuffle")


# -- a reload's fleet --------------------------------------------------------------------------------------------


def test_a_reload_puts_in_force_the_fleet_built_with_its_config_and_keeps_no_other(tmp_path: Path) -> None:
    """The file watch's loader builds a Fleet beside each config; the strategy takes the one built with the config
    in force next. A load that was refused, or changed nothing, leaves nothing behind for later."""
    (tmp_path / "cognitora.yaml").write_text("placement: {tie_band_s: 0.01}\n")
    router = types.SimpleNamespace(model_list=[dep("chat", "hosted_vllm/m", "http://127.0.0.1:8001/v1", "a")])
    reloaded = ReloadedFleet()
    source = config_source(router, {"config": "cognitora.yaml"}, tmp_path, reloaded)
    assert source is not None and source.path == tmp_path / "cognitora.yaml"
    first = source.load()
    second = source.load()  # the first was refused, say: only the latest is kept
    assert reloaded.take(first) is None
    second_again = source.load()
    fleet = reloaded.take(second_again)
    assert fleet is not None and fleet.config is second_again and endpoints_of(fleet) == ["127.0.0.1:8001"]
    assert reloaded.take(second_again) is None  # taken once
    assert second is not second_again
