"""Who reaches the cloud through LiteLLM, what a failing cloud does to clients, and how a burst lets go: the real
LiteLLM proxy on examples/litellm_burst.yaml, one slow simulated engine (``mac``), and the simulated cloud as the
group's ``cognitora_cloud`` deployment (``cloud-0``), failing on command: bench/cloud_stacks.py. Issue 39; the Envoy
twin is tests/e2e/test_cloud_envoy_e2e.py.

- Naming the cloud deployment (``"model": "cloud-0"``) is no way around the burst policy: a team without burst
  rights, or one with them but not listed in ``named_teams``, is answered by the engine (the cloud counts no call);
  a team the operator listed is sent there, counted and charged like a burst.
- The cloud failing each way (500, 503, 429, reset, hang) costs the clients nothing, is held off after the first
  failure, and is tested by one request once the hold-off is over; a slow cloud is still used.
- After a load step that bursts, every request is local again within ``release_bound_s`` of the engine going idle.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.cloud_stacks import (
    INSTANT,
    CloudStack,
    litellm_stack,
)
from tests.support import cloud_checks

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[CloudStack]:
    with litellm_stack(tmp_path_factory.mktemp("cloud-litellm"), smollm2_dir) as s:
        yield s


def post(stack: CloudStack, headers: dict[str, str], model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def served_by(r: httpx.Response) -> str:
    return r.headers.get("x-litellm-model-api-base", "")


# -- naming the cloud deployment -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("team", "priority"), [("ops", None), ("ops", INSTANT), ("research", None)])
def test_naming_the_cloud_deployment_is_no_way_around_the_burst_policy(
    stack: CloudStack, team: str, priority: str | None
) -> None:
    # ops may not burst at all; research may when the fleet is saturated, but is not in named_teams.
    before = stack.cloud.received()
    r = post(stack, stack.auth(team, priority), "cloud-0")
    assert r.status_code == 200, r.text
    assert served_by(r) == f"{stack.fleet.urls[0]}/v1", served_by(r)
    assert stack.cloud.received() == before, "a team without the right reached the cloud by naming it"
    assert 'why="named_not_allowed"' in stack.metrics()


def test_a_team_the_operator_lists_may_name_it_and_is_counted_like_a_burst(stack: CloudStack) -> None:
    stack.close_breaker()
    before = stack.cloud.received()
    r = post(stack, stack.auth("direct"), "cloud-0")
    assert r.status_code == 200 and served_by(r) == stack.cloud.base_url, r.text
    assert stack.cloud.received() == before + 1
    page = stack.metrics()
    assert 'cognitora_burst_decisions_total{model="chat",priority="default",reason="named",target="sim-cloud"}' in page
    assert 'cognitora_cloud_cost_usd_total{target="sim-cloud",team="(other)"}' in page


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
