"""The LiteLLM plugin's metrics keys (``metrics_path``, ``metrics_listen``): checked, kept out of the fleet's
config, and, in an SDK script, a page served from the core's own thread until the strategy is uninstalled.
(The proxy's own port is tested in tests/e2e/test_metrics_e2e.py.)"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from pathlib import Path

import httpx
import litellm
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import litellm_plugin
from cognitora.config import ConfigError
from cognitora_sim.harness.process import free_port
from litellm_plugin.export import config_from_litellm_yaml
from litellm_plugin.metrics import DEFAULT_PATH, MetricsSettings, split_args

litellm_plugin.install()  # what the proxy's callback line does; an SDK script calls it too


def test_the_metrics_keys_are_split_from_the_fleets() -> None:
    settings, rest = split_args({"metrics_listen": "127.0.0.1:9464", "metrics_path": "/m", "scrape": {}})
    assert settings == MetricsSettings(path="/m", listen="127.0.0.1:9464") and rest == {"scrape": {}}
    assert split_args(None)[0] == MetricsSettings(path=DEFAULT_PATH, listen=None)
    assert split_args({"metrics_path": ""})[0].path is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"metrics_path": "metrics"}, "metrics_path: expected a URL path"),
        ({"metrics_listen": "9464"}, "metrics_listen: '9464': expected HOST:PORT"),
    ],
)
def test_bad_metrics_keys_are_refused_with_their_name(args: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        split_args(args)


def test_the_export_leaves_the_metrics_keys_out(tmp_path: Path) -> None:
    config = {
        "model_list": [
            {"model_name": "m", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://127.0.0.1:9/v1"}}
        ],
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {"metrics_listen": "127.0.0.1:9464", "models": [{"name": "m"}]},
        },
    }
    path = tmp_path / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert config_from_litellm_yaml(path).model_names() == ["m"]  # a strict config: an unknown key would raise


def test_an_sdk_router_serves_its_page_on_metrics_listen_until_uninstalled() -> None:
    port = free_port()
    router = litellm.Router(
        model_list=[
            {
                "model_name": "chat",
                "litellm_params": {"model": "hosted_vllm/m", "api_base": f"http://127.0.0.1:{free_port()}/v1"},
            }
        ],
        routing_strategy="cognitora",
        routing_strategy_args={
            "metrics_listen": f"127.0.0.1:{port}",
            "scrape": {"interval_s": 0.2},
            "metrics": {"cors_origins": ["null", "https://dash.example"]},
        },
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        page = httpx.get(url, headers={"Origin": "null"}, timeout=10)  # the dashboard opened from disk
        assert page.status_code == 200 and page.headers["access-control-allow-origin"] == "null"
        listed = httpx.get(url, headers={"Origin": "https://dash.example"}, timeout=10)
        assert listed.headers["access-control-allow-origin"] == "https://dash.example"
        other = httpx.get(url, headers={"Origin": "https://elsewhere.example"}, timeout=10)
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        assert 'cognitora_info{process="litellm"' in page.text
        decisions = [s for f in text_string_to_metric_families(page.text) for s in f.samples if "decisions" in s.name]
        assert decisions == []  # the family is there, with no request placed yet
        assert 'cognitora_endpoint_info{endpoint="127.0.0.1:' in page.text
    finally:
        router.update_settings(routing_strategy="simple-shuffle")  # uninstalls: the page goes with the core
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=2)
