"""examples/litellm_burst.yaml started exactly as it says, from the top of the checkout: the README's fleet on slow
machines, the simulated cloud, the LiteLLM proxy with the file as it is and the two teams' API keys it lists.

Under a load step beyond what the four engines serve within the SLO, team research (allowed to burst) gets a share
of its answers from the cloud and the rest from the engines; team ops, sending at the same time, never reaches the
cloud (it is not in burst.teams); the proxy's page counts the research team's cloud spend.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import httpx
import pytest

from bench.burst_load import CLOUD_MODEL, Answer, closed_loop
from tests.example_commands import documented, require_free, sim_fleet, start, wait_port

pytestmark = pytest.mark.e2e

EXAMPLE = "examples/litellm_burst.yaml"


async def step(url: str, research: str, ops: str) -> tuple[list[Answer], list[Answer]]:
    """Both teams at once: research's load step (enough for every engine's queue to pass the SLO), ops beside it."""
    return await asyncio.gather(
        closed_loop(url, {"Authorization": f"Bearer {research}"}, workers=40, requests=160, tag="research"),
        closed_loop(url, {"Authorization": f"Bearer {ops}"}, workers=6, requests=24, tag="ops"),
    )


def test_litellm_burst_example_bursts_for_the_team_allowed_to(tmp_path: Path) -> None:
    fleet_line = "cognitora sim fleet --engines 4 --base-port 8001 --events-base-port 5557 --profile mac"
    cloud = documented("cognitora sim cloud --port 9443 --api-key-env CLOUD_API_KEY --models gpt-4o-mini", EXAMPLE)
    proxy_argv = documented(f"litellm --config {EXAMPLE} --port 4000", EXAMPLE)
    require_free([9443, 4000], f"{EXAMPLE} (the simulated cloud on 9443, the proxy on 4000)")
    keys = {name: "sk-" + secrets.token_hex(16) for name in ("LITELLM_MASTER_KEY", "CLOUD_API_KEY")}
    keys |= {name: "sk-" + secrets.token_hex(16) for name in ("RESEARCH_API_KEY", "OPS_API_KEY")}
    with (
        sim_fleet(tmp_path, fleet_line, EXAMPLE),
        start(cloud, tmp_path, "sim-cloud", **keys) as cloud_process,
        start(proxy_argv, tmp_path, "litellm", **keys) as proxy,
    ):
        wait_port(9443, cloud_process)
        url = "http://127.0.0.1:4000"
        proxy.wait_http(f"{url}/health/liveliness", timeout_s=120)
        warm = asyncio.run(closed_loop(url, {"Authorization": f"Bearer {keys['OPS_API_KEY']}"}, 1, 3, "warm"))
        assert all(a.status == 200 for a in warm), [a.error for a in warm]

        research, ops = asyncio.run(step(url, keys["RESEARCH_API_KEY"], keys["OPS_API_KEY"]))
        assert all(a.status == 200 for a in research + ops), [a.error for a in research + ops if a.status != 200]
        cloud_mark = frozenset({"http://127.0.0.1:9443/v1", CLOUD_MODEL})
        to_cloud = [a for a in research if a.cloud(cloud_mark)]
        served = sorted({a.served_by for a in research})
        assert to_cloud, f"team research never burst under the load step; served by {served}"
        assert len(to_cloud) < len(research), "every research request went to the cloud: the engines served none"
        assert not [a for a in ops if a.cloud(cloud_mark)], "team ops (not in burst.teams) reached the cloud"
        page = httpx.get(f"{url}/cognitora/metrics", headers={"Authorization": f"Bearer {keys['LITELLM_MASTER_KEY']}"})
        assert 'cognitora_cloud_cost_usd_total{target="sim-cloud",team="research"}' in page.text
        assert 'team="ops"' not in "".join(ln for ln in page.text.splitlines() if ln.startswith("cognitora_cloud_"))
        print(f"litellm_burst example: {len(to_cloud)} of {len(research)} research answers from the cloud")
