"""Who reaches the cloud through Envoy, what a failing cloud does to clients, and how a burst lets go: a real Envoy on
examples/envoy.yaml + examples/envoy_burst.yaml, ``cognitora extproc``, one slow simulated engine (``mac``), and the
simulated cloud over TLS (it checks the key the service injects, and fails on command). Issue 39.

- No client header reaches the cloud: every header the example's routes or the service read (enumerated from
  examples/envoy*.yaml and envoy_extproc/headers.py), alone and all together, from an anonymous client and from a
  team without burst rights, in the class whose requests of an allowed team always go out: the cloud counts none.
- The cloud failing each way (500, 503, 429, reset, hang) costs the clients nothing: every answer is a 200 from the
  engine; after the first failure the breaker holds the cloud off (no call during the hold-off) and one request
  tests it once the hold-off is over; when the cloud recovers, it is used again.
- After a load step that bursts (the engine loaded beside it by a team that may not burst), the idle engine keeps
  a stale prediction; within ``RELEASE_BOUND_S`` of the engine going idle, every request is local again.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.burst_load import CLOUD_MODEL
from cognitora.process import free_port, wait_until
from cognitora.sim.cloud_launch import SimCloudProcess, start_cloud
from cognitora.sim.launch import SimFleet, start_fleet
from envoy_extproc import headers as wire
from envoy_extproc.burst_example import EXAMPLE as BURST_EXAMPLE
from envoy_extproc.burst_example import add_burst
from envoy_extproc.launch import EXAMPLE_CONFIG, start_gateway
from tests.cloud_stack import (
    CLOUD_ARGS,
    HOLD_OFF_S,
    INSTANT,
    PRIORITIES,
    RELEASE_BOUND_S,
    SCRAPE_INTERVAL_S,
    burst_settings,
    local_after,
    mixed_load_step,
    trickle,
    wait_idle,
    wave,
)
from tests.example_jwt import example_jwt

pytestmark = pytest.mark.e2e

JWT_SECRET = secrets.token_bytes(32)
CLOUD_KEY = "sk-cloud-" + secrets.token_hex(8)


class Stack:
    def __init__(self, fleet: SimFleet, cloud: SimCloudProcess, url: str, metrics_url: str) -> None:
        self.fleet, self.cloud, self.url, self.metrics_url = fleet, cloud, url, metrics_url
        self.cloud_marks = frozenset({f"127.0.0.1:{cloud.port}"})  # the address Envoy reached

    def auth(self, team: str, priority: str | None = None) -> dict[str, str]:
        claims: dict[str, Any] = {"team": team} if priority is None else {"team": team, "priority": priority}
        return {"Authorization": f"Bearer {example_jwt(JWT_SECRET, claims)}"}

    def post(self, headers: dict[str, str]) -> httpx.Response:
        body = {"model": self.fleet.model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=60)

    def metrics(self) -> str:
        return httpx.get(self.metrics_url, timeout=10).text


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("cloud-envoy")
    env = {"CLOUD_API_KEY": CLOUD_KEY}
    # --accept-any-model: a cloud request Envoy retried on the engine carries the cloud's model name.
    with (
        start_fleet(
            1, profile="mac", tokenizer=smollm2_dir / "tokenizer.json", log_dir=work, extra_args=["--accept-any-model"]
        ) as fleet,
        start_cloud(log_dir=work, tls=True, args=[*CLOUD_ARGS, "--api-key-env", "CLOUD_API_KEY"], env=env) as cloud,
    ):
        assert cloud.ca_file is not None
        burst = burst_settings(
            base_url=f"https://cloud.sim.test:{cloud.port}/v1",
            credential_env="CLOUD_API_KEY",
            models={fleet.model: CLOUD_MODEL},
        )
        config = {
            "models": [
                {
                    "name": fleet.model,
                    "tokenizer": str(smollm2_dir / "tokenizer.json"),
                    "endpoints": [{"url": fleet.urls[0], "prefill_tokens_per_s": 1200}],
                }
            ],
            "scrape": {"interval_s": SCRAPE_INTERVAL_S, "timeout_s": 1.0},
            "placement": {"priorities": PRIORITIES},
            "burst": burst,
        }
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        metrics = free_port()
        with start_gateway(
            config_path,
            fleet.endpoint_ids,
            work,
            extproc_args=["--metrics-listen", f"127.0.0.1:{metrics}"],
            env=env,
            jwt_secret=JWT_SECRET,
            edit=add_burst(cloud.port, cloud.ca_file),
            expose_upstream_host=True,  # the test reads who answered
        ) as gateway:
            stack = Stack(fleet, cloud, gateway.url, f"http://127.0.0.1:{metrics}/metrics")
            warm = stack.post(stack.auth("ops"))
            assert warm.status_code == 200, warm.text
            yield stack


# -- no client header reaches the cloud --------------------------------------------------------------------------


def client_headers() -> list[str]:
    """Every header name the example's routes, filters or the service read or set: the constants of
    envoy_extproc/headers.py, and each name in examples/envoy.yaml and examples/envoy_burst.yaml."""
    names = {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z-]+", v)}
    for example in (EXAMPLE_CONFIG, BURST_EXAMPLE):
        text = example.read_text()
        names |= set(re.findall(r"(?:remove|name|key|header_name): (x-[a-z-]+)", text))
        names |= set(re.findall(r"\b(x-(?:cognitora|envoy|gateway)-[a-z-]+)", text))
    names -= {"content-type", "content-length", "retry-after", "text/event-stream"}
    return sorted(n for n in names if "/" not in n)


FORGED_VALUES = {
    wire.DEFAULT_TEAM_HEADER: "research",
    wire.DEFAULT_PRIORITY_HEADER: INSTANT,
    wire.DEFAULT_KEY_HEADER: "key-of-research",
    wire.DEFAULT_USER_HEADER: "admin",
    wire.DEFAULT_INTENT_HEADER: "code",
    wire.CLOUD_TARGET: "sim-cloud",
    wire.AUTHORIZATION: "Bearer sk-not-a-token",
}


def forged(stack: Stack, name: str) -> str:
    """The value a client would send to be taken for research, or to reach the cloud's address."""
    if name in FORGED_VALUES:
        return FORGED_VALUES[name]
    if name == wire.PREFILL_ENDPOINT:
        return stack.cloud.url
    if "destination" in name or "host" in name:
        return f"127.0.0.1:{stack.cloud.port}"
    if name.startswith("x-envoy-"):
        return "5xx" if "retry" in name else "1"
    return "sim-cloud"


def test_the_enumeration_covers_the_headers_that_matter() -> None:
    names = client_headers()
    for must in (
        wire.CLOUD_TARGET,
        wire.DEFAULT_TEAM_HEADER,
        wire.DEFAULT_PRIORITY_HEADER,
        wire.DESTINATION_ENDPOINT,
        wire.DESTINATION_ENDPOINTS,
        wire.PREFILL_ENDPOINT,
        wire.AUTHORIZATION,
    ):
        assert must in names, names


@pytest.mark.parametrize("who", ["anonymous", "ops"])
def test_no_client_header_sends_a_request_to_the_cloud(stack: Stack, who: str) -> None:
    # The control: research's own (signed) request of the class goes out. The same class, claimed by headers.
    before = stack.cloud.received()
    control = stack.post(stack.auth("research", INSTANT))
    assert control.status_code == 200 and control.json()["model"] == CLOUD_MODEL, control.text
    assert stack.cloud.received() == before + 1
    base = {} if who == "anonymous" else stack.auth("ops")
    names = client_headers()
    tries: list[tuple[str, dict[str, str]]] = [
        (name, {**base, name: forged(stack, name)}) for name in names if not (base and name == wire.AUTHORIZATION)
    ]
    tries.append(("all", {**{n: forged(stack, n) for n in names if n != wire.AUTHORIZATION}, **base}))
    before = stack.cloud.received()
    seen: dict[str, str] = {}
    for name, headers in tries:
        r = stack.post(headers)
        seen[name] = f"{r.status_code} {r.headers.get('x-cognitora-upstream-host')}"
        if name == wire.AUTHORIZATION:
            assert r.status_code == 401, r.text  # a token the auth filter does not accept: refused there
            continue
        assert r.status_code == 200, (name, r.text)
        assert r.headers["x-cognitora-upstream-host"] in stack.fleet.endpoint_ids, (name, seen)
        assert r.json()["model"] == stack.fleet.model, (name, r.json()["model"])
    assert stack.cloud.received() == before, f"a client header reached the cloud: {seen}"


# -- the cloud failing each way ------------------------------------------------------------------------------------


def breaker_state(stack: Stack) -> str:
    found = re.findall(r'cognitora_cloud_breaker\{state="(\w+)",target="sim-cloud"\} 1\.0', stack.metrics())
    return found[0] if found else "?"


def counter(stack: Stack, name: str) -> float:
    found = re.findall(rf'{name}\{{target="sim-cloud"\}} ([0-9.e+]+)', stack.metrics())
    return float(found[0]) if found else 0.0


def close_breaker(stack: Stack) -> None:
    """Wait out a hold-off left by an earlier test, and let one request close the breaker (the cloud is healthy)."""
    wait_until(lambda: breaker_state(stack) != "open", 2 * HOLD_OFF_S + 5, "the cloud's hold-off to end")
    if breaker_state(stack) == "half_open":
        test = wave(stack.cloud, stack.url, stack.auth("research", INSTANT), 1, "close", stack.fleet.model)
        assert test.errors == [] and test.cloud_calls == 1
    assert breaker_state(stack) == "closed"


@pytest.mark.parametrize("fault", ["500", "503", "429", "reset", "hang"])
def test_a_failing_cloud_costs_the_clients_nothing_and_is_held_off(stack: Stack, fault: str) -> None:
    research = stack.auth("research", INSTANT)
    close_breaker(stack)
    opened = counter(stack, "cognitora_cloud_breaker_opened_total")
    stack.cloud.fault(fault)
    try:
        first = wave(stack.cloud, stack.url, research, 6, f"{fault}-1", stack.fleet.model)
        assert first.errors == [], first.errors
        assert first.from_cloud(stack.cloud_marks) == 0  # every answer is the engine's
        assert first.cloud_calls >= 1  # it was tried: this test proves something
        assert counter(stack, "cognitora_cloud_breaker_opened_total") == opened + 1
        held = wave(stack.cloud, stack.url, research, 6, f"{fault}-2", stack.fleet.model)
        assert held.errors == [] and held.cloud_calls == 0  # the hold-off: no call to the failing cloud
        wait_until(lambda: breaker_state(stack) == "half_open", 2 * HOLD_OFF_S + 5, "the hold-off to end")
        tested = wave(stack.cloud, stack.url, research, 6, f"{fault}-3", stack.fleet.model)
        assert tested.errors == [] and tested.cloud_calls == 1  # one request tests it; it fails again
        assert breaker_state(stack) == "open"
    finally:
        stack.cloud.fault("none")
    page = stack.metrics()
    assert re.search(r'cognitora_cloud_attempts_total\{result="(failed|rate_limited)",target="sim-cloud"\}', page)


def test_a_slow_cloud_is_still_used_and_nobody_sees_an_error(stack: Stack) -> None:
    research = stack.auth("research", INSTANT)
    close_breaker(stack)
    stack.cloud.fault("slow", slow_ms=1500)
    try:
        slow = wave(stack.cloud, stack.url, research, 4, "slow", stack.fleet.model)
    finally:
        stack.cloud.fault("none")
    assert slow.errors == [] and slow.from_cloud(stack.cloud_marks) == 4
    assert all(a.ttft_s is not None and a.ttft_s >= 1.5 for a in slow.answers)
    assert breaker_state(stack) == "closed"


# -- burst lets go -------------------------------------------------------------------------------------------------


def test_a_burst_lets_go_once_the_load_step_is_over(stack: Stack) -> None:
    close_breaker(stack)
    wait_idle(stack.fleet)
    step = mixed_load_step(stack.url, stack.auth("research"), stack.auth("ops"), stack.fleet.model)
    assert all(a.status == 200 for a in step), [a.error for a in step if a.status != 200]
    assert sum(a.cloud(stack.cloud_marks) for a in step) >= 5, "the load step did not burst: this proves nothing"
    idle_at = wait_idle(stack.fleet)
    sent = trickle(stack.url, stack.auth("research"), RELEASE_BOUND_S + 4, 3.0, stack.fleet.model)
    assert all(a.status == 200 for _, a in sent), [a.error for _, a in sent if a.status != 200]
    late = local_after(sent, idle_at + RELEASE_BOUND_S, lambda a: a.cloud(stack.cloud_marks))
    assert late == [], f"still sent to the cloud {RELEASE_BOUND_S:.1f} s after the engine went idle: {late}"
    assert 'result="released"' in stack.metrics()


def test_the_cloud_metrics_count_every_cloud_request(stack: Stack) -> None:
    page = stack.metrics()
    assert 'cognitora_cloud_attempts_total{result="ok",target="sim-cloud"}' in page
    assert "cognitora_cloud_breaker_opened_total" in page
