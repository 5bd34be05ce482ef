"""``cognitora extproc`` run as a service behind the real Envoy (examples/envoy.yaml, two replicas in its
``cognitora_extproc`` cluster, Redis between them): the gRPC health service Envoy's ``grpc_health_check`` reads, a
config reload (the file changed, or SIGHUP) that takes effect (endpoints, priority classes, budgets) and a bad one
that is refused with the old config kept, and a SIGTERM under load that loses no request (docs/operations.md). One
Envoy, one fleet, for the whole module."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cognitora_sim.harness.envoy_launch import EXAMPLE_CONFIG, render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.reload_files import reload_to, write_seen

pytestmark = pytest.mark.e2e

ROOT = EXAMPLE_CONFIG.parent.parent


@dataclass
class Stack:
    receiver: OtlpReceiver
    fleet: SimFleet
    config_path: Path
    config: dict[str, object]
    url: str
    admin_url: str
    replicas: list[ManagedProcess]
    ports: list[int]


def _lb(port: int) -> dict[str, object]:
    return {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server_url: str, smollm2_dir: Path) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("ops")
    with (
        OtlpReceiver() as receiver,
        start_fleet(2, tokenizer=smollm2_dir / "tokenizer.json", log_dir=work) as fleet,
    ):
        config: dict[str, object] = {
            "redis_url": redis_server_url,
            "key_prefix": f"ops{free_port()}",
            "models": [fleet.model_config(smollm2_dir / "tokenizer.json")],
        }
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        cli = [sys.executable, "-m", "cognitora.cli"]
        collector = ManagedProcess([*cli, "collector", "--config", str(config_path)], work / "collector.log", cwd=ROOT)
        ports = [free_port(), free_port()]
        flags = ["--watch-config-s", "0.2", "--drain-timeout-s", "20"]
        # Traces to the receiver, exported every 0.1 s (the SDK's default is 5 s).
        # Logs in the OpenTelemetry data model (stdout: the same log file here).
        otel = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "COGNITORA_LOG_FORMAT": "otel",
        }
        replicas = [
            ManagedProcess(
                [*cli, "extproc", "--config", str(config_path), "--listen", f"127.0.0.1:{port}", *flags],
                work / f"extproc{i}.log",
                env=otel,
                cwd=ROOT,
            )
            for i, port in enumerate(ports)
        ]
        envoy = None
        try:
            for port, replica in zip(ports, replicas, strict=True):
                wait_listening(port, replica)
            listen, admin = free_port(), free_port()

            def two_replicas(envoy_config: dict[str, object]) -> None:
                for cluster in envoy_config["static_resources"]["clusters"]:  # type: ignore[index]
                    if cluster["name"] == "cognitora_extproc":
                        cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [_lb(p) for p in ports]}]

            rendered = render_config(
                listen_port=listen,
                admin_port=admin,
                extproc_port=ports[0],
                engines=fleet.endpoint_ids,
                edit=two_replicas,
                expose_upstream_host=True,
            )
            envoy = start_envoy(rendered, work / "envoy", admin)
            yield Stack(
                receiver,
                fleet,
                config_path,
                config,
                f"http://127.0.0.1:{listen}",
                f"http://127.0.0.1:{admin}",
                replicas,
                ports,
            )
        finally:
            for replica in replicas:  # before Envoy: its health check lets their drains end at once
                replica.stop()
            if envoy is not None:
                envoy.stop()
            collector.stop()


def healthy_replicas(admin_url: str) -> int:
    """Hosts of the ext_proc cluster Envoy's health check calls healthy (admin ``/clusters``)."""
    text = httpx.get(f"{admin_url}/clusters", timeout=5).text
    return sum(
        1 for line in text.splitlines() if line.startswith("cognitora_extproc::") and "::health_flags::healthy" in line
    )


def health_checks_passed(admin_url: str) -> int:
    """Envoy's count of passed health checks on the ext_proc cluster, over its hosts (admin ``/stats``)."""
    text = httpx.get(f"{admin_url}/stats", params={"filter": "cognitora_extproc.health_check.success"}, timeout=5).text
    counts = (line.partition(": ")[2] for line in text.splitlines())
    return sum(int(count) for count in counts if count.isdigit())


def chat(url: str, i: int) -> httpx.Response:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_each_replica_serves_grpc_health_and_envoy_checks_it(stack: Stack) -> None:
    for port in stack.ports:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
                answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    wait_until(lambda: healthy_replicas(stack.admin_url) == 2, 15, "Envoy's health check passing on both replicas")


def test_a_config_change_reloads_and_a_bad_one_is_refused_keeping_the_old(stack: Stack) -> None:
    first, second = stack.fleet.endpoint_ids
    narrowed = yaml.safe_load(yaml.safe_dump(stack.config))
    narrowed["models"][0]["endpoints"] = [{"url": f"http://{first}"}]
    stack.config_path.write_text(yaml.safe_dump(narrowed))
    for replica in stack.replicas:
        wait_until(lambda r=replica: "config reloaded" in r.log_tail(200), 20, "the file change reloaded")  # type: ignore[misc]
    answers = [chat(stack.url, i) for i in range(8)]
    assert [a.status_code for a in answers] == [200] * 8, answers[0].text
    assert {a.headers["x-cognitora-upstream-host"] for a in answers} == {first}

    # Invalid (an unknown key, a negative weight): refused, the log says why, the narrowed config stays.
    broken = yaml.safe_load(yaml.safe_dump(narrowed))
    broken["placement"] = {"not_a_setting": 1}
    stack.config_path.write_text(yaml.safe_dump(broken))
    for replica in stack.replicas:
        wait_until(lambda r=replica: "config reload refused" in r.log_tail(200), 20, "the bad file refused")  # type: ignore[misc]
        assert "not_a_setting" in replica.log_tail(200)
    answers = [chat(stack.url, 100 + i) for i in range(8)]
    assert [a.status_code for a in answers] == [200] * 8
    assert {a.headers["x-cognitora-upstream-host"] for a in answers} == {first}

    # SIGHUP on a good file (the other engine alone): in force at once.
    moved = yaml.safe_load(yaml.safe_dump(stack.config))
    moved["models"][0]["endpoints"] = [{"url": f"http://{second}"}]
    stack.config_path.write_text(yaml.safe_dump(moved))
    for replica in stack.replicas:
        replica.signal(signal.SIGHUP)
    for replica in stack.replicas:
        wait_until(lambda r=replica: r.log_tail(200).count("config reloaded") >= 2, 20, "the SIGHUP reload")  # type: ignore[misc]
    hosts = {chat(stack.url, 200 + i).headers["x-cognitora-upstream-host"] for i in range(8)}
    assert hosts == {second}
    stack.config_path.write_text(yaml.safe_dump(stack.config))  # both again, for the next test
    for replica in stack.replicas:
        wait_until(lambda r=replica: r.log_tail(300).count("config reloaded") >= 3, 20, "the restoring reload")  # type: ignore[misc]


def with_(base: dict[str, object], **sections: object) -> dict[str, object]:
    config = yaml.safe_load(yaml.safe_dump(base))
    config.update(sections)
    return config


def test_a_reload_changes_priorities_and_budgets_by_the_file_watch_and_by_sighup(stack: Stack) -> None:
    write_seen(stack.config_path, stack.config)  # padded (tests.support.reload_files); nothing changes
    assert chat(stack.url, 300).status_code == 200

    # Priorities: the default class made sheddable with an SLO no engine meets, idle or not: shed (429); back to
    # the shipped classes by SIGHUP alone (the watch cannot see that write): placed again.
    strict = {"default": {"ttft_slo_s": 1e-9, "sheddable": True}, "batch": {"ttft_slo_s": 30, "sheddable": True}}
    reload_to(stack.config_path, with_(stack.config, placement={"priorities": strict}), stack.replicas, sighup=False)
    shed = [chat(stack.url, 310 + i) for i in range(4)]
    assert [a.status_code for a in shed] == [429] * 4, shed[0].text
    assert shed[0].headers.get("retry-after"), shed[0].headers
    reload_to(stack.config_path, stack.config, stack.replicas, sighup=True)
    assert all(r.alive() for r in stack.replicas)
    assert [chat(stack.url, 320 + i).status_code for i in range(4)] == [200] * 4

    # Budgets (on Redis, shared by both replicas): requests without a team (this Envoy authenticates nobody) get a
    # small day's limit by the watch: a few are served, then 429 naming the limit; raised by SIGHUP: served again.
    low = {"anonymous": [{"window": "day", "total_tokens": 300}]}
    reload_to(stack.config_path, with_(stack.config, budgets=low), stack.replicas, sighup=False)
    statuses: list[int] = []
    while 429 not in statuses:
        answer = chat(stack.url, 330 + len(statuses))
        statuses.append(answer.status_code)
        assert len(statuses) <= 20, statuses
    assert statuses[0] == 200 and set(statuses) == {200, 429}, statuses
    assert "budgets.anonymous" in answer.text, answer.text
    high = {"anonymous": [{"window": "day", "total_tokens": 1_000_000}]}
    reload_to(stack.config_path, with_(stack.config, budgets=high), stack.replicas, sighup=True)
    assert [chat(stack.url, 360 + i).status_code for i in range(4)] == [200] * 4
    reload_to(stack.config_path, stack.config, stack.replicas, sighup=False)  # as the module's other tests expect it


def test_the_decision_is_a_span_of_the_gateways_trace_and_the_engine_continues_it(stack: Stack) -> None:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 8}
    answer = httpx.post(
        f"{stack.url}/v1/chat/completions",
        json=body,
        headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    span = stack.receiver.wait_for(lambda s: s.trace_id == trace_id, 20)
    assert (span.name, span.service, span.parent_span_id) == ("cognitora.decide", "cognitora-extproc", parent)
    engine = answer.headers["x-cognitora-upstream-host"]
    attrs = span.attributes
    assert attrs["gen_ai.request.model"] == "smollm2" and attrs["cognitora.endpoint"] == engine, attrs
    assert attrs["cognitora.prompt_tokens"] > 0 and "cognitora.predicted_ttft_s" in attrs and attrs["cognitora.reason"]
    assert "trace me" not in str(attrs)  # never the prompt
    # The engine got the request as a child of the decision's span.
    seen = httpx.get(f"http://{engine}/sim/traceparents", timeout=5).json()
    assert f"00-{trace_id}-{span.span_id}-01" in seen, seen
    # The decision's log line, in the OpenTelemetry log data model, carries the same trace and span.
    lines = [json.loads(line) for r in stack.replicas for line in r.log_tail(400).splitlines() if trace_id in line]
    (logged,) = [line for line in lines if line["Body"] == "decision"]
    assert (logged["TraceId"], logged["SpanId"], logged["SeverityText"]) == (trace_id, span.span_id, "INFO")
    assert (
        logged["Attributes"]["endpoint"] == engine and logged["InstrumentationScope"]["Name"] == "cognitora.decisions"
    )


CLIENTS = 8
"""Concurrent clients of the load under which replicas stop."""


async def _load(url: str, stop: asyncio.Event, statuses: Counter[int], errors: list[str]) -> None:
    async def worker(client: httpx.AsyncClient, w: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            body = {"model": "smollm2", "messages": [{"role": "user", "content": f"drain {w} {i}"}], "max_tokens": 16}
            try:
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                statuses[r.status_code] += 1
                if r.status_code != 200:
                    errors.append(r.text[:300])
            except httpx.HTTPError as exc:
                statuses[-1] += 1
                errors.append(repr(exc))

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(worker(client, w) for w in range(CLIENTS)))


def host_requests(admin_url: str, port: int) -> int:
    """Streams Envoy opened on the ext_proc replica on ``port`` (admin ``/clusters``: the host's ``rq_total``)."""
    prefix = f"cognitora_extproc::127.0.0.1:{port}::rq_total::"
    text = httpx.get(f"{admin_url}/clusters", timeout=5).text
    return sum(int(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


def stream_retries(admin_url: str) -> int:
    """Envoy's retried ext_proc streams (admin ``/stats``: the cluster's ``upstream_rq_retry``)."""
    only = r"^cluster\.cognitora_extproc\.upstream_rq_retry$"
    text = httpx.get(f"{admin_url}/stats", params={"filter": only}, timeout=5).text
    counts = (line.partition(": ")[2] for line in text.splitlines())
    return sum(int(count) for count in counts if count.isdigit())


@pytest.mark.alone  # a stop under load, as the drain test below
def test_a_replica_stopped_before_the_health_check_sees_it_loses_no_request_through_the_stream_retry(
    stack: Stack, tmp_path: Path
) -> None:
    """examples/envoy.yaml's ``grpc_service.retry_policy`` on its own: this Envoy checks its replicas once an hour,
    so it goes on opening streams on a replica that stops (and, once it has exited, on its closed port); each one
    refused is opened again on the other replica. A third replica is stopped, so the module's two stay up. SIGTERM,
    not SIGKILL: a killed replica's streams that had already answered are lost (Envoy retries a stream only before
    its response starts), and finishing those is the drain's part."""
    port = free_port()
    cli = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(stack.config_path)]
    doomed = ManagedProcess(
        [*cli, "--listen", f"127.0.0.1:{port}", "--drain-timeout-s", "20"], tmp_path / "doomed.log", cwd=ROOT
    )
    survivor = stack.ports[1]
    envoy = None
    try:
        wait_listening(port, doomed)
        listen, admin = free_port(), free_port()

        def checked_hourly(envoy_config: dict[str, object]) -> None:
            for cluster in envoy_config["static_resources"]["clusters"]:  # type: ignore[index]
                if cluster["name"] == "cognitora_extproc":
                    cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [_lb(port), _lb(survivor)]}]
                    for check in cluster["health_checks"]:
                        check["interval"] = check["no_traffic_interval"] = "3600s"

        rendered = render_config(
            listen_port=listen,
            admin_port=admin,
            extproc_port=port,
            engines=stack.fleet.endpoint_ids,
            edit=checked_hourly,
        )
        envoy = start_envoy(rendered, tmp_path / "envoy", admin)
        url, admin_url = f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{admin}"
        wait_until(lambda: healthy_replicas(admin_url) == 2, 15, "Envoy's first health check passing on both")
        statuses: Counter[int] = Counter()
        errors: list[str] = []

        async def run() -> tuple[int, int]:
            stop = asyncio.Event()
            load = asyncio.create_task(_load(url, stop, statuses, errors))
            while statuses[200] < 40:  # both replicas busy before the signal
                await asyncio.sleep(0.05)
            doomed.signal(signal.SIGTERM)
            while doomed.alive():
                await asyncio.sleep(0.05)
            before, on_survivor = statuses[200], host_requests(admin_url, survivor)
            while statuses[200] < before + 40:  # Envoy still picks the dead replica for half the streams
                await asyncio.sleep(0.05)
            stop.set()
            await load
            return statuses[200] - before, host_requests(admin_url, survivor) - on_survivor

        served_after, survivor_streams = asyncio.run(asyncio.wait_for(run(), 90))
        log = doomed.log_tail(50)
        assert doomed.stop() == 0, log
        assert errors == [] and set(statuses) == {200}, f"{dict(statuses)}: {errors[:3]}"
        # Envoy never marked the stopped replica: the retry, not the health check, moved its streams.
        assert healthy_replicas(admin_url) == 2
        assert stream_retries(admin_url) > 0
        # Every request served after the stop had its stream on the remaining replica (but those in flight at the
        # count's start, one per client at most).
        assert survivor_streams >= served_after - CLIENTS, (survivor_streams, served_after)
    finally:
        if envoy is not None:
            envoy.stop()
        doomed.stop()


@pytest.mark.alone  # a drain under load: it refused requests once beside the other worker's load
def test_sigterm_drains_under_load_and_envoy_loses_no_request(stack: Stack) -> None:
    statuses: Counter[int] = Counter()
    errors: list[str] = []
    draining = stack.replicas[0]
    # The drain waits for the checker as long as twice the interval it has seen it check at (its whole announce
    # bound when it has been checked once); a replica never checked does not wait, and would refuse Envoy's next
    # streams. Both replicas healthy and checked a few times each first, as in any gateway that has run a while.
    wait_until(
        lambda: healthy_replicas(stack.admin_url) == 2 and health_checks_passed(stack.admin_url) >= 6,
        30,
        "Envoy's health check passing on both replicas, three times each",
    )

    async def run() -> float:
        stop = asyncio.Event()
        load = asyncio.create_task(_load(stack.url, stop, statuses, errors))
        await asyncio.sleep(0)
        while statuses[200] < 40:  # both replicas busy before the signal
            await asyncio.sleep(0.05)
        draining.signal(signal.SIGTERM)
        started = time.monotonic()
        while draining.alive():
            await asyncio.sleep(0.05)
        stopped_after = time.monotonic() - started
        before = statuses[200]
        while statuses[200] < before + 40:  # and the remaining replica carries on alone
            await asyncio.sleep(0.05)
        stop.set()
        await load
        return stopped_after

    stopped_after = asyncio.run(asyncio.wait_for(run(), 90))
    log = draining.log_tail(50)
    code = draining.stop()
    assert code == 0, log
    assert errors == [] and set(statuses) == {200}, f"{dict(statuses)}: {errors[:3]}"
    assert '"checker_saw_not_serving": true' in log, log
    assert stopped_after < 20, stopped_after
    assert healthy_replicas(stack.admin_url) == 1
