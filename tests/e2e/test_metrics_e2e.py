"""Each process's metrics page, read over HTTP after real traffic, as a user (or a dashboard in a browser) reads it.

- Envoy: the real envoy binary on ``examples/envoy.yaml`` in front of ``cognitora extproc --workers 2`` (over
  Redis) and ``cognitora collector``, both with ``--metrics-listen``; and in front of one ``cognitora extproc
  --collector`` (no Redis). A simulated fleet of 2 engines.
- LiteLLM: the real ``litellm`` proxy CLI with the plugin in embedded mode: the page on the proxy's own port
  (``/cognitora/metrics``) and on a port of its own (``metrics_listen``).

What is asserted is what a user checks: decisions counted == requests sent, every engine's gauges present, KV
events and scrapes counted, energy per token measured, and the CORS answers a page from another origin needs.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cognitora_sim.harness.envoy_launch import render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = "https://dashboard.example"
REQUESTS = 24


def metrics(
    url: str, transport: httpx.HTTPTransport | None = None
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """GET a metrics page, parsed: (sample name, labels) -> value."""
    with httpx.Client(transport=transport, timeout=10) as client:
        response = client.get(url, headers={"Origin": ORIGIN})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def total(page: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in page.items() if n == name and set(labels.items()) <= ls)


def by_label(page: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, label: str) -> dict[str, float]:
    return {dict(ls)[label]: v for (n, ls), v in page.items() if n == name}


def system_prompt(group: int) -> str:
    rng = random.Random(group)
    return " ".join(f"topic{group}-{rng.randrange(10_000)}" for _ in range(150))


def body(i: int) -> dict[str, Any]:
    return {
        "model": "smollm2",
        "max_tokens": 4,
        "messages": [{"role": "system", "content": system_prompt(i % 4)}, {"role": "user", "content": f"Q{i}?"}],
    }


async def send(
    url: str, n: int, concurrency: int, headers: dict[str, str] | None = None, model: str = "smollm2"
) -> list[int]:
    limit = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, i: int) -> int:
        async with limit:
            payload = body(i) | {"model": model}
            if i % 3 == 0:  # some streamed, as clients do
                payload |= {"stream": True, "stream_options": {"include_usage": True}}
                async with client.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as r:
                    async for _ in r.aiter_lines():
                        pass
                    return r.status_code
            r = await client.post("/v1/chat/completions", json=payload, headers=headers)
            return r.status_code

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(n))))


def assert_preflight_answered(url: str, *, only_listed: bool = True) -> None:
    """The page answers the origin the config lists (metrics.cors_origins), and, ``only_listed``, no other."""
    headers = {"Origin": ORIGIN, "Access-Control-Request-Method": "GET"}
    preflight = httpx.request("OPTIONS", url, headers=headers, timeout=10)
    assert preflight.status_code in (200, 204), preflight.text
    assert preflight.headers.get("access-control-allow-origin") in ("*", ORIGIN)
    got = httpx.get(url, headers={"Origin": ORIGIN}, timeout=10)
    assert got.headers.get("access-control-allow-origin") in ("*", ORIGIN)
    if only_listed:
        other = httpx.get(url, headers={"Origin": "https://elsewhere.example"}, timeout=10)
        assert "access-control-allow-origin" not in other.headers, other.headers


def assert_feedback_learned(page: dict[tuple[str, frozenset[tuple[str, str]]], float], fleet: SimFleet) -> None:
    """The streamed attempts' achieved TTFT reached the core: a bounded TTFT feedback factor per endpoint served,
    beside the predicted/achieved histograms it comes from (docs/placement.md, "Feedback")."""
    assert total(page, "cognitora_attempt_ttft_achieved_seconds_count") > 0
    factors = by_label(page, "cognitora_ttft_bias_factor", "endpoint")
    assert factors and set(factors) <= set(fleet.endpoint_ids), factors
    assert all(0.5 <= f <= 2.0 for f in factors.values()), factors


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    work = tmp_path_factory.mktemp("metrics-fleet")
    with start_fleet(2, time_scale=10.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=work) as f:
        yield f


def fleet_models(fleet: SimFleet, smollm2_dir: Path) -> list[dict[str, Any]]:
    return [
        {
            "name": fleet.model,
            "block_size": 16,
            "tokenizer": str(smollm2_dir / "tokenizer.json"),
            "chat_template": str(smollm2_dir / "chat_template.jinja"),
            "endpoints": [
                {"url": url, "kv_events": ev, "kv_events_replay": rp, "prefill_tokens_per_s": 30000}
                for url, ev, rp in zip(fleet.urls, fleet.events_addresses, fleet.replay_addresses, strict=True)
            ],
        }
    ]


def test_envoy_workers_and_collector_pages_after_traffic(
    fleet: SimFleet, tmp_path: Path, redis_server_url: str, smollm2_dir: Path
) -> None:
    config = {
        "redis_url": redis_server_url,
        "key_prefix": f"cogtest-metrics-{secrets.token_hex(4)}",
        "models": fleet_models(fleet, smollm2_dir),
        "scrape": {"interval_s": 0.5, "timeout_s": 0.4},
        "metrics": {"cors_origins": [ORIGIN]},
        "placement": {"store_timeout_s": 2.0},
    }
    config_path = tmp_path / "cognitora.yaml"
    config_path.write_text(yaml.safe_dump(config))
    cli = [sys.executable, "-m", "cognitora.cli"]
    extproc_port, extproc_metrics, collector_metrics = free_port(), free_port(), free_port()
    listen, admin = free_port(), free_port()
    collector = ManagedProcess(
        [*cli, "collector", "--config", str(config_path), "--metrics-listen", f"127.0.0.1:{collector_metrics}"],
        tmp_path / "collector.log",
        cwd=ROOT,
    )
    extproc = ManagedProcess(
        [
            *cli,
            "extproc",
            "--config",
            str(config_path),
            "--listen",
            f"127.0.0.1:{extproc_port}",
            "--workers",
            "2",
            "--metrics-listen",
            f"127.0.0.1:{extproc_metrics}",
        ],
        tmp_path / "extproc.log",
        cwd=ROOT,
    )
    envoy = None

    def spread_streams(envoy_config: dict[str, Any]) -> None:
        # Several connections to the service, so the kernel can hand them to both workers (docs/envoy.md, Cost).
        for cluster in envoy_config["static_resources"]["clusters"]:
            if cluster["name"] == "cognitora_extproc":
                options = cluster["typed_extension_protocol_options"]
                for value in options.values():
                    value["explicit_http_config"] = {"http2_protocol_options": {"max_concurrent_streams": 2}}

    try:
        wait_listening(extproc_port, extproc)
        wait_until(lambda: extproc.log_tail(400).count("ext_proc listening") == 2, 60.0, "both workers listening")
        collector.wait_http(f"http://127.0.0.1:{collector_metrics}/metrics")
        envoy_text = render_config(
            listen_port=listen,
            admin_port=admin,
            extproc_port=extproc_port,
            engines=fleet.endpoint_ids,
            edit=spread_streams,
        )
        envoy = start_envoy(envoy_text, tmp_path / "envoy", admin)
        extproc_url = f"http://127.0.0.1:{extproc_metrics}/metrics"
        collector_url = f"http://127.0.0.1:{collector_metrics}/metrics"
        before = metrics(collector_url)  # the energy window's first snapshot
        assert total(metrics(extproc_url), "cognitora_decisions_total") == 0

        statuses = asyncio.run(send(f"http://127.0.0.1:{listen}", REQUESTS, concurrency=8))
        assert statuses == [200] * REQUESTS

        # Ends are reported just after each response: wait for every attempt's, then read the totals.
        wait_until(
            lambda: total(metrics(extproc_url), "cognitora_attempts_finished_total") >= REQUESTS,
            30.0,
            "every attempt's end on the extproc page",
        )
        page = metrics(extproc_url)
        assert total(page, "cognitora_decisions_total") == REQUESTS
        assert total(page, "cognitora_decisions_total", outcome="placed") == REQUESTS
        assert total(page, "cognitora_attempts_finished_total", kind="completed") == REQUESTS
        assert total(page, "cognitora_decision_duration_seconds_count") == REQUESTS
        assert total(page, "cognitora_exporter_workers") == 2
        assert total(page, "cognitora_attempt_ttft_achieved_seconds_count") > 0
        assert total(page, "cognitora_attempt_cached_tokens_achieved_total") > 0  # shared system prompts
        assert total(page, "cognitora_info", process="extproc") == 1  # once, not once per worker
        running = by_label(page, "cognitora_endpoint_running", "endpoint")
        assert set(running) == set(fleet.endpoint_ids), running
        assert set(by_label(page, "cognitora_endpoint_healthy", "endpoint").values()) == {1.0}

        # The merge is the sum of what each worker saw (each serves its page on a socket named in the log).
        folder = re.search(r"merged from (\S+)\"", extproc.log_tail(400))
        assert folder, extproc.log_tail(400)
        per_worker = [
            total(
                metrics("http://worker/metrics", httpx.HTTPTransport(uds=f"{folder.group(1)}/worker-{i}.sock")),
                "cognitora_decisions_total",
            )
            for i in range(2)
        ]
        assert sum(per_worker) == REQUESTS, per_worker
        assert_preflight_answered(extproc_url)

        # The collector: its streams, its scrapes, the fleet's gauges and energy per token over the traffic.
        wait_until(
            lambda: (
                total(metrics(collector_url), "cognitora_endpoint_generation_tokens_total")
                > total(before, "cognitora_endpoint_generation_tokens_total")
            ),
            30.0,
            "the engines' token counters moved on the collector's page",
        )
        page = metrics(collector_url)
        assert total(page, "cognitora_info", process="collector") == 1
        applied = by_label(page, "cognitora_kv_event_batches_applied_total", "endpoint")
        assert set(applied) == set(fleet.endpoint_ids) and sum(applied.values()) > 0, applied
        assert total(page, "cognitora_kv_blocks_stored_total") > 0
        assert total(page, "cognitora_scrapes_total", result="ok") > 0
        assert set(by_label(page, "cognitora_endpoint_running", "endpoint")) == set(fleet.endpoint_ids)
        assert set(by_label(page, "cognitora_endpoint_power_watts", "endpoint")) == set(fleet.endpoint_ids)
        assert total(page, "cognitora_fleet_power_watts") > 0
        assert total(page, "cognitora_fleet_joules_per_token") > 0
        assert total(page, "cognitora_fleet_energy_window_seconds") > 0
        assert "cognitora_decisions_total" not in {n for n, _ in page}  # the collector places nothing
        assert_preflight_answered(collector_url)

        # One JSON line per decision in the workers' log, each naming its endpoint and predicted TTFT.
        decisions = [
            json.loads(line)
            for line in extproc.log_tail(2000).splitlines()
            if line.startswith("{") and '"cognitora.decisions"' in line
        ]
        assert len(decisions) == REQUESTS
        assert all(d["endpoint"] in fleet.endpoint_ids and d["predicted_ttft_s"] > 0 for d in decisions)
    finally:
        if envoy is not None:
            envoy.stop()
        tail = extproc.log_tail(60)
        code = extproc.stop()
        collector.stop()
    assert code == 0, tail


def test_envoy_one_process_with_its_embedded_collector_serves_every_family(
    fleet: SimFleet, tmp_path: Path, smollm2_dir: Path
) -> None:
    config = {
        "models": fleet_models(fleet, smollm2_dir),
        "scrape": {"interval_s": 0.5, "timeout_s": 0.4},
        "metrics": {"cors_origins": [ORIGIN]},
        # A third of the requests stream (8): learn from the first, so both engines show a factor.
        "cost_model": {"feedback": {"min_samples": 1}},
    }
    config_path = tmp_path / "cognitora.yaml"
    config_path.write_text(yaml.safe_dump(config))
    extproc_port, metrics_port, listen, admin = free_port(), free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(config_path), "--collector"]
    argv += ["--listen", f"127.0.0.1:{extproc_port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    extproc = ManagedProcess(argv, tmp_path / "extproc.log", cwd=ROOT)
    envoy = None
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        wait_listening(extproc_port, extproc)
        extproc.wait_http(url)
        envoy_text = render_config(
            listen_port=listen, admin_port=admin, extproc_port=extproc_port, engines=fleet.endpoint_ids
        )
        envoy = start_envoy(envoy_text, tmp_path / "envoy", admin)
        statuses = asyncio.run(send(f"http://127.0.0.1:{listen}", REQUESTS, concurrency=6))
        assert statuses == [200] * REQUESTS
        wait_until(
            lambda: total(metrics(url), "cognitora_attempts_finished_total") >= REQUESTS, 30.0, "every attempt's end"
        )
        page = metrics(url)
        assert total(page, "cognitora_decisions_total", outcome="placed") == REQUESTS
        assert total(page, "cognitora_decisions_total") == REQUESTS
        assert "cognitora_exporter_workers" not in {n for n, _ in page}  # one process: nothing merged
        # The embedded collector's families, from the same page.
        assert set(by_label(page, "cognitora_kv_event_batches_applied_total", "endpoint")) == set(fleet.endpoint_ids)
        assert total(page, "cognitora_scrapes_total", result="ok") > 0
        assert set(by_label(page, "cognitora_endpoint_running", "endpoint")) == set(fleet.endpoint_ids)
        assert total(page, "cognitora_internal_errors_total") == 0
        assert_feedback_learned(page, fleet)
        assert_preflight_answered(url)
    finally:
        if envoy is not None:
            envoy.stop()
        tail = extproc.log_tail(60)
        code = extproc.stop()
    assert code == 0, tail


def test_litellm_proxy_serves_the_page_on_its_own_port_and_on_metrics_listen(
    fleet: SimFleet, tmp_path: Path, smollm2_dir: Path
) -> None:
    own_port = free_port()
    deployments = [
        {
            "model_name": "smollm2",
            "litellm_params": {"model": "openai/smollm2", "api_base": f"{url}/v1", "api_key": "none"},
            "model_info": {"id": f"engine-{i}", "cognitora_kv_events": ev, "cognitora_kv_events_replay": rp},
        }
        for i, (url, ev, rp) in enumerate(zip(fleet.urls, fleet.events_addresses, fleet.replay_addresses, strict=True))
    ]
    config = {
        "model_list": deployments,
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {
                "models": [{"name": "smollm2", "tokenizer": str(smollm2_dir / "tokenizer.json")}],
                "scrape": {"interval_s": 0.5, "timeout_s": 0.5},
                "metrics": {"cors_origins": [ORIGIN]},
                "cost_model": {"feedback": {"min_samples": 1}},
                "metrics_listen": f"127.0.0.1:{own_port}",
            },
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }
    config_path = tmp_path / "litellm_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    launched = LiteLLMProxy(config_path, tmp_path, key_prefix="sk-metrics-", ready_s=120)
    proxy, port, key = launched.process, launched.port, launched.key
    try:
        on_proxy = f"http://127.0.0.1:{port}/cognitora/metrics"
        on_own = f"http://127.0.0.1:{own_port}/metrics"
        # No key asked for, and the page starts the core (and the embedded collector) before any request.
        wait_until(
            lambda: (
                set(by_label(metrics(on_proxy), "cognitora_endpoint_running", "endpoint")) == set(fleet.endpoint_ids)
            ),
            60.0,
            "both engines' gauges on the proxy's page",
        )
        statuses = asyncio.run(
            send(f"http://127.0.0.1:{port}", REQUESTS, 6, headers={"Authorization": f"Bearer {key}"})
        )
        assert statuses == [200] * REQUESTS
        wait_until(
            lambda: total(metrics(on_proxy), "cognitora_attempts_finished_total") >= REQUESTS,
            30.0,
            "every attempt's end on the proxy's page",
        )
        page = metrics(on_proxy)
        assert total(page, "cognitora_decisions_total") == REQUESTS
        assert total(page, "cognitora_decisions_total", model="smollm2", outcome="placed") == REQUESTS
        assert total(page, "cognitora_attempts_finished_total", kind="completed") == REQUESTS
        assert total(page, "cognitora_attempt_cached_tokens_achieved_total") > 0
        assert total(page, "cognitora_info", process="litellm") == 1
        assert sum(by_label(page, "cognitora_kv_event_batches_applied_total", "endpoint").values()) > 0
        assert total(page, "cognitora_scrapes_total", result="ok") > 0
        assert set(by_label(page, "cognitora_endpoint_running", "endpoint")) == set(fleet.endpoint_ids)
        assert_feedback_learned(page, fleet)
        own = metrics(on_own)  # the same core behind both pages
        assert total(own, "cognitora_decisions_total") == REQUESTS
        assert_preflight_answered(on_proxy, only_listed=False)  # the proxy's own CORS policy (LITELLM_CORS_ORIGINS)
        assert_preflight_answered(on_own)
    finally:
        proxy.stop()
    # The proxy shows no INFO record of its own by default: the plugin's decision lines are JSON on its stderr.
    lines = [line for line in (tmp_path / "litellm.log").read_text().splitlines() if '"cognitora.decisions"' in line]
    decisions = [json.loads(line) for line in lines]
    assert len(decisions) == REQUESTS and {d["outcome"] for d in decisions} == {"placed"}
    assert {d["endpoint"] for d in decisions} <= set(fleet.endpoint_ids)
