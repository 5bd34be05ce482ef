"""``cognitora doctor`` against real parts: the simulated fleet (real HTTP, real ZMQ KV events and replay), a real
Redis of the test's own (its persistence switched with CONFIG SET), a real ``cognitora collector``; and the ways a
host is wrong: Redis down, a refused password, an engine down, KV events pointed at an HTTP port, a bad config.

Each test runs the command as an operator does (``python -m cognitora.cli doctor``) and reads its lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from bench.harness.redis_server import private_redis
from cognitora.config import config_from_dict
from cognitora.doctor.checks import Status
from cognitora.doctor.store import redis_checks
from cognitora_sim.harness.process import ManagedProcess, free_port
from cognitora_sim.launch import SimFleet, start_fleet

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with start_fleet(2, time_scale=20, log_dir=tmp_path_factory.mktemp("fleet")) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def own_redis() -> Iterator[str]:
    """A Redis of this module's own: its persistence is changed with CONFIG SET."""
    with private_redis() as url:
        yield url


def fleet_config(fleet: SimFleet, smollm2_dir: Path, redis_url: str | None, **extra: Any) -> dict[str, Any]:
    endpoints = [
        {"url": url, "engine": "vllm", "kv_events": pub, "kv_events_replay": replay}
        for url, pub, replay in zip(fleet.urls, fleet.events_addresses, fleet.replay_addresses, strict=True)
    ]
    data: dict[str, Any] = {
        "key_prefix": f"doctor-{uuid.uuid4().hex[:8]}",
        "models": [
            {
                "name": fleet.model,
                "tokenizer": str(smollm2_dir / "tokenizer.json"),
                "chat_template": str(smollm2_dir / "chat_template.jinja"),
                "endpoints": endpoints,
            }
        ],
        **extra,
    }
    if redis_url is not None:
        data["redis_url"] = redis_url
    return data


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "cognitora.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def doctor(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cognitora.cli", "doctor", "--config", str(config), "--events-wait-s", "1", *extra]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)


def lines_by_check(out: str) -> dict[str, tuple[str, str]]:
    """check name -> (status, the rest of its line), from ``--format json``."""
    found = {}
    for line in out.splitlines():
        record = json.loads(line)
        found[record["check"]] = (record["status"], f"{record['detail']} -> {record['fix']}")
    return found


def chat(url: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": f"hello {uuid.uuid4()}"}], "max_tokens": 2}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200


def set_persistence(url: str, appendonly: str, save: str) -> None:
    client = redis.Redis.from_url(url)
    client.config_set("appendonly", appendonly)
    client.config_set("save", save)
    client.close()


def test_a_healthy_host_passes_every_check(fleet: SimFleet, own_redis: str, smollm2_dir: Path, tmp_path: Path) -> None:
    set_persistence(own_redis, "yes", "")
    config = write(tmp_path, fleet_config(fleet, smollm2_dir, own_redis, budgets={"teams": {}}))
    for url in fleet.urls:  # engines publish KV events when their cache changes: give each one a request
        chat(url, fleet.model)
    collector_argv = [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(config)]
    with ManagedProcess(collector_argv, tmp_path / "collector.log", cwd=ROOT) as collector:
        deadline = time.monotonic() + 60
        while "collector started" not in collector.log_tail() and time.monotonic() < deadline:
            assert collector.alive(), collector.log_tail()
            time.sleep(0.1)
        done = doctor(config, "--format", "json")
    checks = lines_by_check(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    expected_ok = ["config", "redis", "redis persistence", "clock", "collector"]
    expected_ok += [f"engine {e}" for e in fleet.endpoint_ids] + [f"kv events {e}" for e in fleet.endpoint_ids]
    for name in expected_ok:
        assert checks[name][0] == "OK", (name, checks[name])
    assert "AOF on" in checks["redis persistence"][1]
    assert "has vllm's metric names" in checks[f"engine {fleet.endpoint_ids[0]}"][1]
    # No live batch while doctor listened (nothing was sent then): the replay buffer shows the stream has flowed.
    assert "replay buffer holds" in checks[f"kv events {fleet.endpoint_ids[0]}"][1]
    assert checks["clock sync"][0] in {"OK", "WARN"}  # the kernel's NTP state: this machine's, not the project's


def test_a_batch_published_while_doctor_listens_reads_as_flowing(
    fleet: SimFleet, smollm2_dir: Path, tmp_path: Path
) -> None:
    config = write(tmp_path, fleet_config(fleet, smollm2_dir, None))
    argv = [sys.executable, "-m", "cognitora.cli", "doctor", "--config", str(config), "--events-wait-s", "30"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        while proc.poll() is None:  # new prompts, each a cache change, until doctor has seen a batch from each
            for url in fleet.urls:
                chat(url, fleet.model)
            time.sleep(0.2)
        out, err = proc.communicate()
    assert proc.returncode == 0, out + err
    for endpoint in fleet.endpoint_ids:
        line = next(line for line in out.splitlines() if f"kv events {endpoint}" in line)
        assert line.startswith("OK") and "flowing: a batch (seq" in line, line
    assert "redis" in out and "no redis_url: the in-process store" in out


def test_redis_down_fails_and_the_engines_are_still_checked(fleet: SimFleet, smollm2_dir: Path, tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    done = doctor(write(tmp_path, fleet_config(fleet, smollm2_dir, dead)), "--format", "json")
    checks = lines_by_check(done.stdout)
    assert done.returncode == 1
    status, text = checks["redis"]
    assert status == "FAIL" and dead in text and "start Redis, or correct redis_url" in text
    assert "collector" not in checks  # nothing to read the heartbeat from; the redis line says why
    assert checks[f"engine {fleet.endpoint_ids[0]}"][0] == "OK"


def test_a_refused_password_fails_without_printing_it(
    fleet: SimFleet, smollm2_dir: Path, redis_with_password_url: str, tmp_path: Path
) -> None:
    wrong = redis_with_password_url.replace("://:", "://:not-", 1)
    secret = wrong.split("://:", 1)[1].split("@", 1)[0]
    done = doctor(write(tmp_path, fleet_config(fleet, smollm2_dir, wrong)))
    assert done.returncode == 1
    line = next(line for line in done.stdout.splitlines() if line.startswith("FAIL") and " redis " in line)
    assert "refused" in line
    assert secret not in done.stdout + done.stderr


def test_an_engine_down_fails_with_its_url_and_what_to_do(fleet: SimFleet, smollm2_dir: Path, tmp_path: Path) -> None:
    data = fleet_config(fleet, smollm2_dir, None)
    down_port, events_port = free_port(), free_port()
    data["models"][0]["endpoints"].append(
        {"url": f"http://127.0.0.1:{down_port}", "engine": "vllm", "kv_events": f"tcp://127.0.0.1:{events_port}"}
    )
    done = doctor(write(tmp_path, data), "--format", "json")
    checks = lines_by_check(done.stdout)
    assert done.returncode == 1
    status, text = checks[f"engine 127.0.0.1:{down_port}"]
    assert status == "FAIL"
    assert f"GET http://127.0.0.1:{down_port}/health" in text and "models[0].endpoints[2].url" in text
    status, text = checks[f"kv events 127.0.0.1:{down_port}"]
    assert status == "FAIL" and "nothing accepted a connection" in text
    assert checks[f"engine {fleet.endpoint_ids[1]}"][0] == "OK"  # one engine down says nothing of the others


def test_kv_events_pointed_at_the_http_port_fail(fleet: SimFleet, smollm2_dir: Path, tmp_path: Path) -> None:
    data = fleet_config(fleet, smollm2_dir, None)
    data["models"][0]["endpoints"][0]["kv_events"] = f"tcp://127.0.0.1:{fleet.ports[0]}"
    done = doctor(write(tmp_path, data), "--format", "json")
    status, text = lines_by_check(done.stdout)[f"kv events {fleet.endpoint_ids[0]}"]
    assert done.returncode == 1
    # libzmq reads an HTTP answer as the old ZMTP 1.0 framing (or fails the handshake): either way, said as such.
    assert status == "FAIL" and ("not a KV-event batch" in text or "does not speak ZMQ" in text), text
    assert "not its HTTP port" in text or "PUB address" in text


def test_a_wrong_engine_kind_warns_on_its_metrics(fleet: SimFleet, smollm2_dir: Path, tmp_path: Path) -> None:
    data = fleet_config(fleet, smollm2_dir, None)
    del data["models"][0]["endpoints"][0]["kv_events"], data["models"][0]["endpoints"][0]["kv_events_replay"]
    data["models"][0]["endpoints"][0]["engine"] = "sglang"
    done = doctor(write(tmp_path, data), "--format", "json")
    status, text = lines_by_check(done.stdout)[f"engine {fleet.endpoint_ids[0]}"]
    assert status == "WARN" and "none of sglang's metric names" in text and "models[0].endpoints[0].engine" in text


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("models: [{name: m, endpoints: [{url: http://127.0.0.1:1}]}]\nredis_ulr: redis://x\n", "redis_ulr"),
        ("models: [{name: m, tokenizer: nowhere.json, endpoints: [{url: http://127.0.0.1:1}]}]\n", "models[0]"),
        ("models: [\n", "not valid YAML"),
    ],
)
def test_a_wrong_config_fails_alone_and_names_the_key(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "cognitora.yaml"
    path.write_text(content)
    done = doctor(path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FAIL  config") and says in lines[0], lines
    assert lines[-1] == "0 OK, 0 WARN, 1 FAIL"  # nothing else can be checked without a config


def test_a_missing_config_says_where_a_starter_is(tmp_path: Path) -> None:
    done = doctor(tmp_path / "absent.yaml")
    assert done.returncode == 1
    assert "does not exist" in done.stdout and "deploy/install.sh" in done.stdout


# -- persistence and clock, against the module's own Redis (in-process: the rules, one by one) ------------------


def _check(url: str, name: str, **extra: Any) -> tuple[Status, str]:
    config = config_from_dict(
        {"redis_url": url, "models": [{"name": "m", "endpoints": [{"url": "http://h:1"}]}]} | extra
    )
    found = {c.name: c for c in redis_checks(config, timeout_s=2.0)}
    return found[name].status, f"{found[name].detail} -> {found[name].fix}"


def test_persistence_rules(own_redis: str) -> None:
    budgets = {"budgets": {"teams": {}}}
    set_persistence(own_redis, "no", "")
    assert _check(own_redis, "redis persistence", **budgets)[0] is Status.FAIL  # budget counters die with Redis
    status, text = _check(own_redis, "redis persistence")
    assert status is Status.WARN and "appendonly yes" in text  # no budgets: only the rebuilt KV index is lost
    set_persistence(own_redis, "no", "3600 1")
    status, text = _check(own_redis, "redis persistence", **budgets)
    assert status is Status.WARN and "RDB snapshots only" in text
    set_persistence(own_redis, "yes", "")
    assert _check(own_redis, "redis persistence", **budgets)[0] is Status.OK


def test_a_clock_off_redis_by_half_the_staleness_bound_fails(own_redis: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import cognitora.doctor.store as doctor_store

    real = time.time
    assert _check(own_redis, "clock")[0] is Status.OK
    monkeypatch.setattr(doctor_store.time, "time", lambda: real() + 1.0)
    status, text = _check(own_redis, "clock")
    assert status is Status.WARN and "ahead of Redis's TIME" in text
    monkeypatch.setattr(doctor_store.time, "time", lambda: real() - 6.0)  # snapshot_max_age_s 10 by default
    status, text = _check(own_redis, "clock")
    assert status is Status.FAIL and "behind Redis's TIME" in text and "stale" in text


def test_no_collector_heartbeat_warns(fleet: SimFleet, own_redis: str, smollm2_dir: Path, tmp_path: Path) -> None:
    set_persistence(own_redis, "yes", "")
    done = doctor(write(tmp_path, fleet_config(fleet, smollm2_dir, own_redis)), "--format", "json")
    status, text = lines_by_check(done.stdout)["collector"]
    assert status == "WARN" and "no collector heartbeat" in text and "cognitora collector" in text
