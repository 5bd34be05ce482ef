"""examples/litellm_burst.yaml started exactly as it says, from the top of the checkout: the README's fleet on slow
machines, the simulated cloud, the LiteLLM proxy with the file as it is and the two teams' API keys it lists.

Under a load step beyond what the four engines serve within the SLO, team research (allowed to burst) gets a share
of its answers from the cloud and the rest from the engines; team ops, sending at the same time, never reaches the
cloud (it is not in burst.teams); the proxy's page counts the research team's cloud spend.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from bench.burst_load import CLOUD_MODEL, Answer, closed_loop
from cognitora import api_keys
from cognitora_sim.cloud_launch import SimCloudProcess
from envoy_extproc.burst_example import add_pieces, example_pieces
from tests.support.example_commands import ROOT, documented, env, require_free, sim_fleet, start, wait_port

pytestmark = pytest.mark.e2e

EXAMPLE = "examples/litellm_burst.yaml"
FLEET_LINE = "cognitora sim fleet --engines 4 --base-port 8001 --events-base-port 5557 --profile mac"
"""The README's fleet on slow machines: a modest load step saturates it."""


async def step(url: str, research: str, ops: str) -> tuple[list[Answer], list[Answer]]:
    """Both teams at once: research's load step (enough for every engine's queue to pass the SLO), ops beside it."""
    return await asyncio.gather(
        closed_loop(url, {"Authorization": f"Bearer {research}"}, workers=40, requests=160, tag="research"),
        closed_loop(url, {"Authorization": f"Bearer {ops}"}, workers=6, requests=24, tag="ops"),
    )


def test_litellm_burst_example_bursts_for_the_team_allowed_to(tmp_path: Path) -> None:
    fleet_line = FLEET_LINE
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


def cloud_answers(cloud: SimCloudProcess) -> float:
    return cloud.metrics().get('sim_cloud_requests_total{status="200"}', 0.0)


def test_envoy_burst_example_bursts_for_the_team_allowed_to(tmp_path: Path) -> None:
    """examples/envoy_burst.yaml's header, from the top of the checkout: the README's fleet on slow machines, the
    simulated cloud with its CA where the pieces expect it, ``cognitora extproc --config
    examples/cognitora-burst.yaml --collector``, and Envoy on examples/envoy.yaml with the two pieces added as the
    steps say (nothing else changed). Team research's load step gets answers from the cloud; team ops', as heavy,
    none."""
    doc = "examples/envoy_burst.yaml"
    fleet_line = FLEET_LINE + " --accept-any-model"
    cloud_argv = documented(
        "cognitora sim cloud --port 9443 --tls-dir /tmp/cognitora-sim-cloud --api-key-env CLOUD_API_KEY "
        "--models gpt-4o-mini",
        doc,
    )
    extproc_argv = documented("cognitora extproc --config examples/cognitora-burst.yaml --collector", doc)
    documented("envoy -c envoy-with-burst.yaml", doc)
    require_free([9443, 9002, 9901, 10000], f"{doc} (the cloud on 9443, extproc 9002, Envoy 9901 and 10000)")
    config = yaml.safe_load((ROOT / "examples" / "envoy.yaml").read_text())
    add_pieces(config, example_pieces())
    envoy_yaml = tmp_path / "envoy-with-burst.yaml"
    envoy_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
    secrets_env = {"CLOUD_API_KEY": "sk-" + secrets.token_hex(16), "COGNITORA_JWKS": api_keys.new_jwks()}
    mint = documented("cognitora keys mint --team research --key-id alice", doc)
    research = subprocess.run(mint, env=env(**secrets_env), capture_output=True, text=True, check=True).stdout.strip()
    ops = api_keys.mint(secrets_env["COGNITORA_JWKS"], team="ops", key_id="ops-key")
    with (
        sim_fleet(tmp_path, fleet_line, doc),
        start(cloud_argv, tmp_path, "sim-cloud", **secrets_env) as cloud_process,
        start(extproc_argv, tmp_path, "extproc", **secrets_env) as extproc,
    ):
        wait_port(9443, cloud_process)
        wait_port(9002, extproc)
        cloud = SimCloudProcess(cloud_process, 9443, Path("/tmp/cognitora-sim-cloud"))
        with start(["envoy", "-c", str(envoy_yaml)], tmp_path, "envoy", **secrets_env) as envoy:
            envoy.wait_http("http://127.0.0.1:9901/ready", timeout_s=30)
            url = "http://127.0.0.1:10000"

            def load(key: str, tag: str) -> list[Answer]:
                headers = {"Authorization": f"Bearer {key}"}
                return asyncio.run(closed_loop(url, headers, workers=40, requests=160, tag=tag, model="smollm2"))

            before = cloud_answers(cloud)
            answers = load(ops, "ops")
            assert all(a.status == 200 for a in answers), [a.error for a in answers if a.status != 200]
            assert cloud_answers(cloud) == before, "team ops (not in burst.teams) reached the cloud"
            answers = load(research, "research")
            assert all(a.status == 200 for a in answers), [a.error for a in answers if a.status != 200]
            burst = cloud_answers(cloud) - before
            assert 0 < burst < len(answers), f"{burst:.0f} of {len(answers)} research answers from the cloud"
            print(f"envoy_burst example: {burst:.0f} of {len(answers)} research answers from the cloud")
