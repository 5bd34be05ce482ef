"""Who reaches the cloud through LiteLLM, what a failing cloud does to clients, and how a burst lets go: the real
LiteLLM proxy on examples/litellm_burst.yaml, one slow simulated engine (``mac``), and the simulated cloud as the
group's ``cognitora_cloud`` deployment (``cloud-0``), failing on command. Issue 39; the Envoy twin is
tests/test_cloud_envoy_e2e.py.

- Naming the cloud deployment (``"model": "cloud-0"``) is no way around the burst policy: a team without burst
  rights, or one with them but not listed in ``named_teams``, is answered by the engine (the cloud counts no call);
  a team the operator listed is sent there, counted and charged like a burst.
- The cloud failing each way (500, 503, 429, reset, hang) costs the clients nothing, is held off after the first
  failure, and is tested by one request once the hold-off is over; a slow cloud is still used.
- After a load step that bursts, every request is local again within ``RELEASE_BOUND_S`` of the engine going idle.
"""

from __future__ import annotations

import re
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.burst_load import CLOUD_MODEL
from cognitora.process import ManagedProcess, free_port, wait_until
from cognitora.sim.cloud_launch import SimCloudProcess, start_cloud
from cognitora.sim.launch import SimFleet, start_fleet
from tests.cloud_stack import (
    CLOUD_ARGS,
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

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "litellm_burst.yaml"
LITELLM = Path(sys.executable).parent / "litellm"
CLOUD_KEY = "sk-cloud-" + secrets.token_hex(8)
LITELLM_HOLD_OFF_S = 10.0
"""The breaker's first hold-off here: the proxy takes seconds to retry a wave of failed requests on this machine."""
KEYS = {
    "sk-research": ("research", None),
    "sk-research-instant": ("research", INSTANT),
    "sk-ops": ("ops", None),
    "sk-ops-instant": ("ops", INSTANT),
    "sk-direct": ("direct", None),
}
"""API key -> (team, priority class the admin set on the key)."""

# A static key -> team map stands in for LiteLLM's virtual keys (no database here).
AUTH_MODULE = f"""
import os
from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

KEYS = {KEYS!r}

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key not in KEYS:
        raise HTTPException(status_code=401, detail="unknown key")
    team, priority = KEYS[key]
    metadata = {{}} if priority is None else {{"cognitora_priority": priority}}
    return UserAPIKeyAuth(api_key=key, team_id=team, metadata=metadata)
"""


class Stack:
    def __init__(self, fleet: SimFleet, cloud: SimCloudProcess, url: str) -> None:
        self.fleet, self.cloud, self.url = fleet, cloud, url
        self.cloud_marks = frozenset({cloud.base_url, CLOUD_MODEL})

    def auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def post(self, key: str, model: str) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=self.auth(key), timeout=60)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/cognitora/metrics", timeout=10).text


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("cloud-litellm")
    env = {"CLOUD_API_KEY": CLOUD_KEY}
    with (
        start_fleet(1, profile="mac", tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp) as fleet,
        start_cloud(log_dir=tmp, args=[*CLOUD_ARGS, "--api-key-env", "CLOUD_API_KEY"], env=env) as cloud,
    ):
        config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
        engine, cloud_dep = config["model_list"]
        engine["litellm_params"]["api_base"] = f"{fleet.urls[0]}/v1"
        cloud_dep["litellm_params"]["api_base"] = cloud.base_url
        args = config["router_settings"]["routing_strategy_args"]
        args["models"][0]["tokenizer"] = str(smollm2_dir / "tokenizer.json")
        args["scrape"] = {"interval_s": SCRAPE_INTERVAL_S, "timeout_s": 1.0}
        args["placement"]["priorities"] = PRIORITIES
        args["burst"] = burst_settings(
            hold_off_s=LITELLM_HOLD_OFF_S, named_teams=["direct"], timeout_s=cloud_dep["litellm_params"]["timeout"]
        )
        # LiteLLM's own cooldown of a failing deployment would hide the cloud from the strategy for its own 5 s: the
        # breaker measured here is the core's, the same through Envoy.
        config["router_settings"]["disable_cooldowns"] = True
        (tmp / "cloud_auth.py").write_text(AUTH_MODULE)
        config["general_settings"]["custom_auth"] = "cloud_auth.user_api_key_auth"
        path = tmp / "litellm_burst.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        proxy_env = {
            "LITELLM_MASTER_KEY": "sk-master-" + secrets.token_hex(8),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        argv = [str(LITELLM), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
        proxy = ManagedProcess(argv, tmp / "litellm.log", env=proxy_env, cwd=tmp)
        try:
            url = f"http://127.0.0.1:{port}"
            proxy.wait_http(f"{url}/health/liveliness", timeout_s=90)
            stack = Stack(fleet, cloud, url)
            warm = stack.post("sk-ops", "chat")
            assert warm.status_code == 200, warm.text
            yield stack
        finally:
            proxy.stop()


def served_by(r: httpx.Response) -> str:
    return r.headers.get("x-litellm-model-api-base", "")


# -- naming the cloud deployment -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["sk-ops", "sk-ops-instant", "sk-research"])
def test_naming_the_cloud_deployment_is_no_way_around_the_burst_policy(stack: Stack, key: str) -> None:
    # ops may not burst at all; research may burst when saturated, but is not in named_teams.
    before = stack.cloud.received()
    r = stack.post(key, "cloud-0")
    assert r.status_code == 200, r.text
    assert served_by(r) == f"{stack.fleet.urls[0]}/v1", served_by(r)
    assert stack.cloud.received() == before, "a team without the right reached the cloud by naming it"
    assert 'why="named_not_allowed"' in stack.metrics()


def test_a_team_the_operator_lists_may_name_it_and_is_counted_like_a_burst(stack: Stack) -> None:
    close_breaker(stack)
    before = stack.cloud.received()
    r = stack.post("sk-direct", "cloud-0")
    assert r.status_code == 200 and served_by(r) == stack.cloud.base_url, r.text
    assert stack.cloud.received() == before + 1
    page = stack.metrics()
    assert 'cognitora_burst_decisions_total{model="chat",priority="default",reason="named",target="sim-cloud"}' in page
    assert 'cognitora_cloud_cost_usd_total{target="sim-cloud",team="(other)"}' in page


# -- the cloud failing each way ------------------------------------------------------------------------------------


def breaker_state(stack: Stack) -> str:
    found = re.findall(r'cognitora_cloud_breaker\{state="(\w+)",target="sim-cloud"\} 1\.0', stack.metrics())
    return found[0] if found else "?"


def counter(stack: Stack, name: str) -> float:
    found = re.findall(rf'{name}\{{target="sim-cloud"\}} ([0-9.e+]+)', stack.metrics())
    return float(found[0]) if found else 0.0


def close_breaker(stack: Stack) -> None:
    """Wait out a hold-off left by an earlier test, and let one request close the breaker (the cloud is healthy)."""
    wait_until(lambda: breaker_state(stack) != "open", 2 * LITELLM_HOLD_OFF_S + 5, "the cloud's hold-off to end")
    if breaker_state(stack) == "half_open":
        test = wave(stack.cloud, stack.url, stack.auth("sk-research-instant"), 1, "close", "chat")
        assert test.errors == [] and test.cloud_calls == 1
    assert breaker_state(stack) in ("closed", "?")  # "?": no cloud request yet


@pytest.mark.parametrize("fault", ["500", "503", "429", "reset", "hang"])
def test_a_failing_cloud_costs_the_clients_nothing_and_is_held_off(stack: Stack, fault: str) -> None:
    research = stack.auth("sk-research-instant")
    close_breaker(stack)
    opened = counter(stack, "cognitora_cloud_breaker_opened_total")
    stack.cloud.fault(fault)
    try:
        first = wave(stack.cloud, stack.url, research, 6, f"{fault}-1", "chat")
        assert first.errors == [], first.errors
        assert first.from_cloud(stack.cloud_marks) == 0  # every answer is the engine's
        assert first.cloud_calls >= 1  # it was tried: this test proves something
        assert counter(stack, "cognitora_cloud_breaker_opened_total") == opened + 1
        held = wave(stack.cloud, stack.url, research, 6, f"{fault}-2", "chat")
        assert held.errors == [] and held.cloud_calls == 0  # the hold-off: no call to the failing cloud
        wait_until(lambda: breaker_state(stack) == "half_open", 2 * LITELLM_HOLD_OFF_S + 5, "the hold-off to end")
        tested = wave(stack.cloud, stack.url, research, 6, f"{fault}-3", "chat")
        assert tested.errors == [] and tested.cloud_calls == 1  # one request tests it; it fails again
        assert breaker_state(stack) == "open"
    finally:
        stack.cloud.fault("none")
    assert counter(stack, "cognitora_cloud_inflight") == 0  # every slot given back


def test_a_slow_cloud_is_still_used_and_nobody_sees_an_error(stack: Stack) -> None:
    close_breaker(stack)
    stack.cloud.fault("slow", slow_ms=1500)
    try:
        slow = wave(stack.cloud, stack.url, stack.auth("sk-research-instant"), 4, "slow", "chat")
    finally:
        stack.cloud.fault("none")
    assert slow.errors == [] and slow.from_cloud(stack.cloud_marks) == 4
    assert all(a.ttft_s is not None and a.ttft_s >= 1.5 for a in slow.answers)
    assert breaker_state(stack) == "closed"


# -- burst lets go -------------------------------------------------------------------------------------------------


def test_a_burst_lets_go_once_the_load_step_is_over(stack: Stack) -> None:
    close_breaker(stack)
    wait_idle(stack.fleet)
    step = mixed_load_step(stack.url, stack.auth("sk-research"), stack.auth("sk-ops"), "chat")
    assert all(a.status == 200 for a in step), [a.error for a in step if a.status != 200]
    assert sum(a.cloud(stack.cloud_marks) for a in step) >= 5, "the load step did not burst: this proves nothing"
    idle_at = wait_idle(stack.fleet)
    sent = trickle(stack.url, stack.auth("sk-research"), RELEASE_BOUND_S + 4, 3.0, "chat")
    assert all(a.status == 200 for _, a in sent), [a.error for _, a in sent if a.status != 200]
    late = local_after(sent, idle_at + RELEASE_BOUND_S, lambda a: a.cloud(stack.cloud_marks))
    assert late == [], f"still sent to the cloud {RELEASE_BOUND_S:.1f} s after the engine went idle: {late}"
    assert 'result="released"' in stack.metrics()
