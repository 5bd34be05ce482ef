"""The LiteLLM proxy with Cognitora, run as a service: its ``routing_strategy_args.config`` file reloaded when it
changes or on SIGHUP (a good file in force at once: limits, priority classes, budgets; a bad one refused with the
old config kept and the log saying why; the proxy alive after SIGHUP: ``litellm_plugin.live``), and each decision a
span of the client's trace, exported over OTLP/HTTP to a real receiver, that the engine continues
(``cognitora.tracing``). One proxy, one fleet, for the whole module."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from cognitora_sim.harness.process import ManagedProcess, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.litellm_proxy import LiteLLMProxy
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.reload_files import reload_to, write_seen

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proxy:
    receiver: OtlpReceiver
    fleet: SimFleet
    process: ManagedProcess
    url: str
    key: str
    cognitora_yaml: Path
    settings: dict[str, object]

    def chat(self, content: str, traceparent: str | None = None) -> httpx.Response:
        body = {"model": "chat", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        headers = {"Authorization": f"Bearer {self.key}"}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=60)

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")


def litellm_config(fleet: SimFleet, smollm2_dir: Path, cognitora_yaml: Path) -> dict[str, object]:
    deployments = [
        {
            "model_name": "chat",
            "litellm_params": {"model": "openai/smollm2", "api_base": f"{url}/v1", "api_key": "none"},
            "model_info": {"id": f"engine-{i}", "cognitora_engine": "vllm"},
        }
        for i, url in enumerate(fleet.urls)
    ]
    return {
        "model_list": deployments,
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {
                "config": str(cognitora_yaml),
                "models": [{"name": "chat", "block_size": 16, "tokenizer": str(smollm2_dir / "tokenizer.json")}],
            },
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Proxy]:
    work = tmp_path_factory.mktemp("litellm-ops")
    with (
        OtlpReceiver() as receiver,
        start_fleet(2, tokenizer=smollm2_dir / "tokenizer.json", log_dir=work) as fleet,
    ):
        settings: dict[str, object] = {"scrape": {"interval_s": 1.0, "timeout_s": 1.0}}
        cognitora_yaml = work / "cognitora.yaml"
        cognitora_yaml.write_text(yaml.safe_dump(settings))
        config = work / "litellm_config.yaml"
        config.write_text(yaml.safe_dump(litellm_config(fleet, smollm2_dir, cognitora_yaml), sort_keys=False))
        # Traces to the receiver, exported every 0.1 s (the SDK's default is 5 s).
        env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with LiteLLMProxy(config, work, key_prefix="sk-ops-", env=env) as launched:
            yield Proxy(receiver, fleet, launched.process, launched.url, launched.key, cognitora_yaml, settings)


def test_the_config_file_reloads_when_it_changes_and_a_bad_one_is_refused(proxy: Proxy) -> None:
    long_prompt = "tell me about routers " * 20  # 440 characters
    first = proxy.chat(long_prompt)
    assert first.status_code == 200, first.text  # (the core starts, and its file watch with it)

    # In force: prompts above 100 characters are refused (413), where any length was placed before.
    strict = {**proxy.settings, "limits": {"exact_prompt_max_chars": 100, "over_limit": "reject"}}
    proxy.cognitora_yaml.write_text(yaml.safe_dump(strict))
    wait_until(lambda: "config reloaded" in proxy.log(), 60, "the file change reloaded")
    refused = proxy.chat(long_prompt)
    assert refused.status_code == 413, refused.text
    assert proxy.chat("short").status_code == 200

    # A bad file (a key the schema does not know): refused, the log names it, the strict limit stays.
    proxy.cognitora_yaml.write_text(yaml.safe_dump({**strict, "placement": {"not_a_setting": 1}}))
    wait_until(lambda: "config reload refused" in proxy.log(), 60, "the bad file refused")
    assert "not_a_setting" in proxy.log()
    assert proxy.chat(long_prompt).status_code == 413

    proxy.cognitora_yaml.write_text(yaml.safe_dump(proxy.settings))
    wait_until(lambda: proxy.log().count("config reloaded") >= 2, 60, "the restoring reload")
    again = proxy.chat(long_prompt)
    assert again.status_code == 200, again.text


def test_a_reload_changes_priorities_and_budgets_by_the_file_watch_and_by_sighup(proxy: Proxy) -> None:
    assert proxy.chat("warm up").status_code == 200  # the core starts, and its watch and SIGHUP handler with it
    write_seen(proxy.cognitora_yaml, proxy.settings)  # padded (tests.support.reload_files); nothing changes

    # Priorities: the default class made sheddable with an SLO no engine meets, idle or not: shed (429); back to
    # the shipped classes by SIGHUP alone (the watch cannot see that write), the proxy alive: placed again.
    strict = {"default": {"ttft_slo_s": 1e-9, "sheddable": True}, "batch": {"ttft_slo_s": 30, "sheddable": True}}
    reload_to(
        proxy.cognitora_yaml, {**proxy.settings, "placement": {"priorities": strict}}, [proxy.process], sighup=False
    )
    shed = [proxy.chat(f"shed {i}") for i in range(3)]
    assert [a.status_code for a in shed] == [429] * 3, shed[0].text
    reload_to(proxy.cognitora_yaml, proxy.settings, [proxy.process], sighup=True)
    assert [proxy.chat(f"placed {i}").status_code for i in range(3)] == [200] * 3

    # Budgets: the proxy's master key has no team: the requests without one get a small day's limit by the watch:
    # a few are served, then 429 naming the limit; raised by SIGHUP: served again.
    low = {"anonymous": [{"window": "day", "total_tokens": 300}]}
    reload_to(proxy.cognitora_yaml, {**proxy.settings, "budgets": low}, [proxy.process], sighup=False)
    statuses: list[int] = []
    while 429 not in statuses:
        answer = proxy.chat(f"spend {len(statuses)}")
        statuses.append(answer.status_code)
        assert len(statuses) <= 20, statuses
    assert statuses[0] == 200 and set(statuses) == {200, 429}, statuses
    assert "budgets.anonymous" in answer.text, answer.text
    high = {"anonymous": [{"window": "day", "total_tokens": 1_000_000}]}
    reload_to(proxy.cognitora_yaml, {**proxy.settings, "budgets": high}, [proxy.process], sighup=True)
    assert [proxy.chat(f"again {i}").status_code for i in range(3)] == [200] * 3
    reload_to(proxy.cognitora_yaml, proxy.settings, [proxy.process], sighup=False)


def test_the_decision_is_a_span_of_the_clients_trace_and_the_engine_continues_it(proxy: Proxy) -> None:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    answer = proxy.chat("trace me through litellm", traceparent=f"00-{trace_id}-{parent}-01")
    assert answer.status_code == 200, answer.text
    span = proxy.receiver.wait_for(lambda s: s.trace_id == trace_id, 20)
    assert (span.name, span.service, span.parent_span_id) == ("cognitora.decide", "cognitora-litellm", parent)
    attrs = span.attributes
    assert attrs["gen_ai.request.model"] == "chat" and attrs["cognitora.endpoint"] in proxy.fleet.endpoint_ids, attrs
    assert attrs["cognitora.prompt_tokens"] > 0 and attrs["cognitora.reason"]
    assert "trace me" not in str(attrs)  # never the prompt
    engine = attrs["cognitora.endpoint"]
    seen = httpx.get(f"http://{engine}/sim/traceparents", timeout=5).json()
    assert f"00-{trace_id}-{span.span_id}-01" in seen, seen
