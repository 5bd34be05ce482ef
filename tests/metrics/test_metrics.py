"""Cognitora's metrics pages, in process: what the page says after decisions and attempts, energy per token over
a window, the workers' merge, the HTTP server's CORS answers, and docs/metrics.md against the metric table.

The processes serving these pages, after real traffic, are tested in tests/e2e/test_metrics_e2e.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from cognitora.collector import Collector
from cognitora.config import CognitoraConfig, ConfigError, config_from_dict
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.core.router import Router
from cognitora.metrics.cors import CorsPolicy
from cognitora.metrics.exporter import Exporter
from cognitora.metrics.names import SPECS, Kind, Merge, reference_markdown
from cognitora.metrics.serve import MetricsServer, parse_listen
from cognitora.metrics.window import CounterWindow, fleet_energy
from cognitora.metrics.workers import merge_pages
from cognitora.redaction import register_secret
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from kvstate.store import EndpointSnapshot

ROOT = Path(__file__).resolve().parents[2]
A, B = "127.0.0.1:8001", "127.0.0.1:8002"


def make_config() -> CognitoraConfig:
    return config_from_dict(
        {
            "placement": {"store_timeout_s": 5.0},
            "models": [
                {
                    "name": "m",
                    "endpoints": [
                        {"url": f"http://{A}", "kv_events": "tcp://127.0.0.1:5557"},
                        {"url": f"http://{B}"},
                    ],
                }
            ],
        }
    )


def samples(text: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        yield from family.samples


def value(text: str, name: str, **labels: str) -> float:
    """The one sample ``name`` with (at least) ``labels``; fails when there is none or several."""
    found = [s.value for s in samples(text) if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) == 1, f"{len(found)} samples {name}{labels} in:\n{text}"
    return found[0]


def total(text: str, name: str, **labels: str) -> float:
    return sum(s.value for s in samples(text) if s.name == name and labels.items() <= s.labels.items())


def snap(endpoint: str, t: float, **fields: float) -> EndpointSnapshot:
    return EndpointSnapshot(endpoint, last_seen=t, **fields)  # type: ignore[arg-type]


async def test_a_gateway_page_counts_what_its_router_did() -> None:
    config = make_config()
    store = MemoryStore()
    router = Router(config, store)
    await store.put_snapshot(
        snap(A, 100.0, running=3, waiting=1, kv_usage=0.25, power_watts=300.0, decode_tokens_per_s=25.0)
    )
    for i in range(5):
        _, attempt = await router.admit(RouteRequest(model="m", prompt=f"question {i} " * 20))
        assert attempt is not None
        attempt.first_token()
        attempt.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=60, completion_tokens=2, cached_tokens=32))
    await router.admit(RouteRequest(model="not-configured", prompt="x"))
    exporter = Exporter(config, "extproc", router=router, extproc_errors=lambda: 2)
    page = (await exporter.page()).decode()

    assert value(page, "cognitora_info", process="extproc") == 1
    assert total(page, "cognitora_decisions_total") == 6
    assert total(page, "cognitora_decisions_total", outcome="placed") == 5
    assert value(page, "cognitora_decisions_total", model="(unknown)", status="404") == 1
    assert total(page, "cognitora_decision_duration_seconds_count") == 6
    assert total(page, "cognitora_attempts_finished_total", kind="completed") == 5
    assert value(page, "cognitora_attempts_open") == 0
    assert total(page, "cognitora_attempt_ttft_achieved_seconds_count") == 5
    assert total(page, "cognitora_attempt_ttft_predicted_seconds_count") == 5
    assert total(page, "cognitora_routing_regret_seconds_count") == 5
    assert total(page, "cognitora_attempt_cached_tokens_achieved_total") == 5 * 32
    assert total(page, "cognitora_attempt_cache_prompt_tokens_total") == 5 * 60
    assert total(page, "cognitora_attempt_tokens_total", kind="completion") == 10
    assert value(page, "cognitora_internal_errors_total", where="extproc") == 2
    assert value(page, "cognitora_store_read_duration_seconds_count") == 5
    # The fleet, from the store: the endpoint with a snapshot, and both endpoints' info.
    assert value(page, "cognitora_endpoint_running", endpoint=A) == 3
    assert value(page, "cognitora_endpoint_waiting", endpoint=A) == 1
    assert value(page, "cognitora_endpoint_kv_usage_ratio", endpoint=A) == 0.25
    assert value(page, "cognitora_endpoint_power_watts", endpoint=A) == 300
    assert value(page, "cognitora_endpoint_inter_token_latency_seconds", endpoint=A) == 0.04
    assert value(page, "cognitora_fleet_power_watts") == 300
    assert total(page, "cognitora_endpoint_info") == 2
    assert not [s for s in samples(page) if s.name == "cognitora_endpoint_running" and s.labels["endpoint"] == B]
    # Every family on the page is one the table declares, with the labels it declares.
    declared = {s.name: s for s in SPECS}
    for family in text_string_to_metric_families(page):
        spec = declared[family.name]
        assert family.type == spec.kind.value
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(spec.labels), sample


async def test_energy_per_token_and_hit_rate_come_from_counter_deltas_over_the_window() -> None:
    config = make_config()
    store = MemoryStore()
    exporter = Exporter(config, "extproc", router=Router(config, store))
    # Cumulative counters from different origins: only their deltas mean anything.
    await store.put_snapshot(snap(A, 10.0, energy_joules=5e6, prompt_tokens_total=1e5, generation_tokens_total=1e4))
    await store.put_snapshot(snap(B, 10.0, energy_joules=1e3, prompt_tokens_total=0, generation_tokens_total=0))
    first = (await exporter.page()).decode()
    assert not [s for s in samples(first) if s.name.endswith("joules_per_token")]  # one snapshot: no window yet
    await store.put_snapshot(
        snap(
            A,
            20.0,
            energy_joules=5e6 + 3000,
            prompt_tokens_total=1e5 + 800,
            generation_tokens_total=1e4 + 200,
            prefix_cache_hits_total=600,
            prefix_cache_queries_total=800,
        )
    )
    await store.put_snapshot(snap(B, 20.0, energy_joules=1e3 + 1000, prompt_tokens_total=0, generation_tokens_total=0))
    page = (await exporter.page()).decode()
    assert value(page, "cognitora_endpoint_joules_per_token", endpoint=A) == pytest.approx(3.0)
    assert not [s for s in samples(page) if s.name == "cognitora_endpoint_joules_per_token" and B in s.labels.values()]
    # The idle engine's joules count for the fleet: (3000 + 1000) J over 1000 tokens, 200 of them generated.
    assert value(page, "cognitora_fleet_joules_per_token") == pytest.approx(4.0)
    assert value(page, "cognitora_fleet_joules_per_output_token") == pytest.approx(20.0)
    assert value(page, "cognitora_fleet_energy_window_seconds") == 10.0
    assert value(page, "cognitora_endpoint_energy_joules_total", endpoint=A) == 5e6 + 3000


def test_a_counter_going_back_restarts_the_window_and_old_points_leave_it() -> None:
    window = CounterWindow(window_s=60)
    window.observe(snap(A, 0.0, energy_joules=1000, prompt_tokens_total=100))
    window.observe(snap(A, 30.0, energy_joules=2000, prompt_tokens_total=600))
    delta = window.delta()
    assert delta is not None and delta.joules_per_token == pytest.approx(2.0)
    window.observe(snap(A, 40.0, energy_joules=50, prompt_tokens_total=10))  # the engine restarted
    assert window.delta() is None
    for t in range(50, 200, 10):
        window.observe(snap(A, float(t), energy_joules=50 + t, prompt_tokens_total=10 + t))
    delta = window.delta()
    assert delta is not None and 60 <= delta.seconds < 70  # the window, plus at most one step
    window.observe(snap(A, 190.0, energy_joules=1e9, prompt_tokens_total=1))  # the same snapshot again: ignored
    assert window.delta() == delta
    assert fleet_energy([]) is None


def test_collector_families_show_its_streams_and_scrapes() -> None:
    config = make_config()
    collector = Collector(config, MemoryStore())
    collector.subscribers[A].stats.applied = 7
    collector.subscribers[A].stats.gaps = 1
    collector.ingestors["m"].stats.unknown_parent = 2
    collector.scraper.stats.rounds = 10
    collector.scraper.stats.failures = 3
    page = Exporter(config, "collector", collector=lambda: collector).render().decode()
    assert value(page, "cognitora_info", process="collector") == 1
    assert value(page, "cognitora_kv_event_batches_applied_total", endpoint=A) == 7
    assert value(page, "cognitora_kv_event_gaps_total", endpoint=A) == 1
    assert value(page, "cognitora_kv_events_skipped_total", model="m", reason="unknown_parent") == 2
    assert value(page, "cognitora_scrapes_total", result="ok") == 7
    assert value(page, "cognitora_scrapes_total", result="failed") == 3
    assert "cognitora_decisions_total" not in page  # no router here


def test_workers_pages_merge_sums_counters_and_shows_the_fleet_once() -> None:
    def page(placed: int, fast: int, slow: int, running: int) -> str:
        return (
            f'# TYPE cognitora_decisions counter\ncognitora_decisions_total{{model="m",outcome="placed"}} {placed}\n'
            "# TYPE cognitora_decision_duration_seconds histogram\n"
            f'cognitora_decision_duration_seconds_bucket{{le="0.01"}} {fast}\n'
            f'cognitora_decision_duration_seconds_bucket{{le="+Inf"}} {fast + slow}\n'
            f"cognitora_decision_duration_seconds_sum 0.02\ncognitora_decision_duration_seconds_count {fast + slow}\n"
            f'# TYPE cognitora_endpoint_running gauge\ncognitora_endpoint_running{{endpoint="a"}} {running}\n'
            '# TYPE cognitora_info gauge\ncognitora_info{process="extproc",version="1"} 1\n'
        )

    one, two = page(placed=3, fast=2, slow=1, running=4), page(placed=5, fast=1, slow=4, running=6)
    merged = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in merge_pages([one, two]) for s in f.samples}
    assert merged[("cognitora_decisions_total", (("model", "m"), ("outcome", "placed")))] == 8
    assert merged[("cognitora_decision_duration_seconds_bucket", (("le", "0.01"),))] == 3
    assert merged[("cognitora_decision_duration_seconds_count", ())] == 8
    assert merged[("cognitora_endpoint_running", (("endpoint", "a"),))] == 4  # the first worker's, not 4 + 6
    assert merged[("cognitora_info", (("process", "extproc"), ("version", "1")))] == 1


def test_every_fleet_and_process_family_merges_first_and_the_rest_sum() -> None:
    # A learned factor is not additive over workers (two workers' 1.5 is not 3), nor is the last prompt-token
    # difference one worker saw, nor what flow control learned and decides with (the prediction margin, a band's
    # rate and gaps as that worker saw them): those gauges show one worker's.
    not_additive = {
        "cognitora_ttft_bias_factor",
        "cognitora_prompt_token_mismatch_last",
        "cognitora_flow_prediction_margin",
        "cognitora_flow_prediction_margin_samples",
        "cognitora_flow_band_arrival_rate",
        "cognitora_flow_band_gaps",
        "cognitora_flow_band_mean_gap_seconds",
    }
    for s in SPECS:
        expected = Merge.FIRST if s.source.value in {"fleet", "process"} or s.name in not_additive else Merge.SUM
        assert s.merge is expected, s.name
        assert s.name.startswith("cognitora_") and not s.name.endswith("_total"), s.name
        assert s.kind is not Kind.COUNTER or s.sample_name.endswith("_total")


async def test_the_http_page_answers_only_the_origins_the_operator_lists() -> None:
    # Before, every answer carried "Access-Control-Allow-Origin: *" and every preflight "Allow-Private-Network": any
    # site an insider's browser opened could read engine addresses, team names and budget usage.
    config = config_from_dict(
        {
            "models": [{"name": "m", "endpoints": [{"url": "http://127.0.0.1:9"}]}],
            "metrics": {"cors_origins": ["null", "https://dashboard.example"]},
        }
    )
    exporter = Exporter(config, "extproc", router=Router(config, MemoryStore()))
    server = MetricsServer(exporter.page, CorsPolicy.of(config.metrics))
    await server.start("127.0.0.1:0")

    def preflight_headers(origin: str) -> dict[str, str]:
        return {
            "Origin": origin,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "x-requested-with",
            "Access-Control-Request-Private-Network": "true",
        }

    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            got = await client.get("/metrics", headers={"Origin": "null"})  # the dashboard opened from file://
            assert got.status_code == 200
            assert got.headers["access-control-allow-origin"] == "null" and got.headers["vary"] == "Origin"
            assert got.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert value(got.text, "cognitora_info", process="extproc") == 1
            listed = await client.request("OPTIONS", "/metrics", headers=preflight_headers("https://dashboard.example"))
            assert listed.status_code == 204
            assert listed.headers["access-control-allow-origin"] == "https://dashboard.example"
            assert "GET" in listed.headers["access-control-allow-methods"]
            assert listed.headers["access-control-allow-headers"] == "x-requested-with"
            assert listed.headers["access-control-allow-private-network"] == "true"
            # A sandboxed frame of any site is "null" too: no private-network grant for it.
            null = await client.request("OPTIONS", "/metrics", headers=preflight_headers("null"))
            assert "access-control-allow-private-network" not in null.headers
            for origin in ("https://evil.example", "http://dashboard.example"):
                other = await client.get("/metrics", headers={"Origin": origin})
                assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
                refused = await client.request("OPTIONS", "/metrics", headers=preflight_headers(origin))
                assert not {"access-control-allow-origin", "access-control-allow-private-network"} & set(
                    refused.headers
                )
            missing = await client.get("/nope", headers={"Origin": "https://dashboard.example"})
            assert missing.status_code == 404
            assert missing.headers["access-control-allow-origin"] == "https://dashboard.example"
    finally:
        await server.stop()


def test_the_default_lets_only_the_dashboard_from_disk_read_and_a_bad_origin_is_a_clear_error() -> None:
    default = config_from_dict({"models": [{"name": "m", "endpoints": [{"url": "http://127.0.0.1:9"}]}]})
    assert default.metrics.cors_origins == ["null"]
    policy = CorsPolicy.of(default.metrics)
    assert policy.headers({"Origin": "null"}).get("Access-Control-Allow-Origin") == "null"
    assert "Access-Control-Allow-Origin" not in policy.headers({"Origin": "https://any.example"})
    with pytest.raises(ConfigError, match=r"metrics.cors_origins.*not an origin: write scheme://host\[:port\]"):
        config_from_dict(
            {
                "models": [{"name": "m", "endpoints": [{"url": "http://127.0.0.1:9"}]}],
                "metrics": {"cors_origins": ["https://dash.example/path"]},
            }
        )


async def test_a_page_that_cannot_be_made_is_a_503_not_a_dead_server() -> None:
    async def broken() -> bytes:
        raise RuntimeError("no page today")

    server = MetricsServer(broken)
    await server.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient() as client:
            got = await client.get(f"http://127.0.0.1:{server.port}/metrics")
        assert got.status_code == 503 and "no page today" in got.text
    finally:
        await server.stop()


async def test_label_values_are_redacted() -> None:
    register_secret("s3cret-endpoint-token")
    config = config_from_dict(
        {"models": [{"name": "m", "endpoints": [{"url": "http://127.0.0.1:8001", "id": "gpu-s3cret-endpoint-token"}]}]}
    )
    page = Exporter(config, "extproc", router=Router(config, MemoryStore())).render().decode()
    assert "s3cret-endpoint-token" not in page and 'endpoint="gpu-****"' in page


@pytest.mark.parametrize("bad", ["9464", ":9464", "host:", "host:99999", "host:port"])
def test_listen_addresses_are_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_listen(bad)
    assert parse_listen("[::1]:9464") == ("::1", 9464)


def test_docs_hold_the_metric_table() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert reference_markdown() in doc, (
        "docs/metrics.md is out of date: paste cognitora.metrics.names.reference_markdown()"
    )


def test_a_bad_metrics_address_is_refused_at_start(tmp_path: Path) -> None:
    from envoy_extproc.settings import parse_settings

    with pytest.raises(SystemExit, match="--metrics-listen 'nope': expected HOST:PORT"):
        parse_settings(["--config", str(tmp_path / "c.yaml"), "--metrics-listen", "nope"])
    assert parse_settings(["--config", "c.yaml", "--metrics-listen", "0.0.0.0:9464"]).metrics_listen == "0.0.0.0:9464"
    from cognitora import collector

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:  # the command configures the process's logging: put the test runner's back
        assert collector.main(["--config", str(tmp_path / "c.yaml"), "--metrics-listen", "nope"]) == 2
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
