"""Who reaches the cloud through Envoy, what a failing cloud does to clients, and how a burst lets go: a real Envoy on
examples/envoy.yaml + examples/envoy_burst.yaml, ``cognitora extproc``, one slow simulated engine (``mac``), and the
simulated cloud over TLS (it checks the key the service injects, and fails on command): bench/cloud_stacks.py.
Issue 39; the LiteLLM twin is tests/e2e/test_cloud_litellm_e2e.py.

- No client header reaches the cloud: every header the example's routes or the service read (enumerated from
  examples/envoy*.yaml and envoy_extproc/headers.py), alone and all together, from an anonymous client (the auth
  filter refuses it: a 401, nothing reaches an engine or the cloud) and from a team without burst rights, in the
  class whose requests of an allowed team always go out: the cloud counts none.
- The cloud failing each way (500, 503, 429, reset, hang) costs the clients nothing: every answer is a 200 from the
  engine; after the first failure the breaker holds the cloud off (no call during the hold-off) and one request
  tests it once the hold-off is over; a slow cloud is still used.
- After a load step that bursts (the engine loaded beside it by a team that may not burst), the idle engine keeps
  a stale prediction; within ``release_bound_s`` of the engine going idle, every request is local again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.burst_load import CLOUD_MODEL
from bench.cloud_stacks import (
    INSTANT,
    CloudStack,
    envoy_stack,
)
from cognitora_sim.harness.envoy_launch import EXAMPLE_CONFIG
from envoy_extproc import headers as wire
from envoy_extproc.burst_example import EXAMPLE as BURST_EXAMPLE
from tests.support import cloud_checks

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[CloudStack]:
    with envoy_stack(tmp_path_factory.mktemp("cloud-envoy"), smollm2_dir) as s:
        yield s


def post(stack: CloudStack, headers: dict[str, str]) -> httpx.Response:
    body = {"model": stack.model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


# -- no client header reaches the cloud --------------------------------------------------------------------------


def client_headers() -> list[str]:
    """Every header name the example's routes, filters or the service read or set: the constants of
    envoy_extproc/headers.py, and each name in examples/envoy.yaml and examples/envoy_burst.yaml."""
    names = {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z-]+", v)}
    for example in (EXAMPLE_CONFIG, BURST_EXAMPLE):
        text = example.read_text()
        names |= set(re.findall(r"(?:remove|name|key|header_name): (x-[a-z-]+)", text))
        names |= set(re.findall(r"\b(x-(?:cognitora|envoy|gateway)-[a-z-]+)", text))
    names -= {"content-type", "content-length", "retry-after"}
    return sorted(names)


FORGED_VALUES = {
    wire.DEFAULT_TEAM_HEADER: "research",
    wire.DEFAULT_PRIORITY_HEADER: INSTANT,
    wire.DEFAULT_KEY_HEADER: "key-of-research",
    wire.DEFAULT_USER_HEADER: "admin",
    wire.DEFAULT_INTENT_HEADER: "code",
    wire.CLOUD_TARGET: "sim-cloud",
    wire.AUTHORIZATION: "Bearer sk-not-a-token",
}


def forged(stack: CloudStack, name: str) -> str:
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
def test_no_client_header_sends_a_request_to_the_cloud(stack: CloudStack, who: str) -> None:
    # The control: research's own (signed) request of the class goes out. The same class, claimed by headers.
    stack.close_breaker()
    before = stack.cloud.received()
    control = post(stack, stack.auth("research", INSTANT))
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
        r = post(stack, headers)
        seen[name] = f"{r.status_code} {r.headers.get('x-cognitora-upstream-host')}"
        if name == wire.AUTHORIZATION or not base:
            # No key, or a token the auth filter does not accept: refused there, before any route is used.
            assert r.status_code == 401, (name, r.text)
            continue
        assert r.status_code == 200, (name, r.text)
        assert r.headers["x-cognitora-upstream-host"] in stack.fleet.endpoint_ids, (name, seen)
        assert r.json()["model"] == stack.fleet.model, (name, r.json()["model"])
    assert stack.cloud.received() == before, f"a client header reached the cloud: {seen}"


# -- the cloud failing each way ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["500", "503", "429", "reset", "hang"])
def test_a_failing_cloud_costs_the_clients_nothing_and_is_held_off(stack: CloudStack, fault: str) -> None:
    cloud_checks.failing_cloud_costs_nothing_and_is_held_off(stack, fault)


def test_a_slow_cloud_is_still_used_and_nobody_sees_an_error(stack: CloudStack) -> None:
    cloud_checks.slow_cloud_is_still_used(stack)


# -- burst lets go -------------------------------------------------------------------------------------------------


@pytest.mark.alone  # a bound in seconds after the engine goes idle: another worker's load broke it once
def test_a_burst_lets_go_once_the_load_step_is_over(stack: CloudStack) -> None:
    cloud_checks.burst_lets_go_after_a_load_step(stack)


def test_the_cloud_metrics_count_every_cloud_request(stack: CloudStack) -> None:
    # A cloud request of its own: under xdist this test may be the first of the module its worker runs.
    stack.close_breaker()
    sent = post(stack, stack.auth("research", INSTANT))
    assert sent.status_code == 200 and sent.json()["model"] == CLOUD_MODEL, sent.text
    page = stack.metrics()
    assert 'cognitora_cloud_attempts_total{result="ok",target="sim-cloud"}' in page
    assert "cognitora_cloud_breaker_opened_total" in page
