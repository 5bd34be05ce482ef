"""Flow control through Envoy (docs/flow_control.md): a real Envoy on examples/envoy.yaml with ``cognitora
extproc``, API keys signed by the example's issuer carrying each client's class, and one simulated engine whose one
seat (as Cognitora knows it) a long stream holds. The shared scenario is tests/support/flow_e2e.py: the burst is
served in band order, a short-wait class gets 429 with Retry-After, a client that gives up leaves the queue. The
waits last longer than the example's 2 s ``message_timeout``: the queued request's own extension carries them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from cognitora import api_keys
from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.harness.process import free_port
from cognitora_sim.launch import start_fleet
from tests.support.flow_e2e import FLOW_CONTROL, PRIORITIES, burst_behind_a_held_seat, check

pytestmark = pytest.mark.e2e

JWKS = api_keys.new_jwks()


def headers_of(priority: str) -> dict[str, str]:
    token = api_keys.mint(JWKS, team="ops", key_id="ops-key", priority=priority, expires_in_s=3600)
    return {"Authorization": f"Bearer {token}"}


def test_flow_control_through_envoy(smollm2_dir: Path, tmp_path: Path) -> None:
    with start_fleet(1, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet:
        model = fleet.model_config(smollm2_dir / "tokenizer.json")
        for endpoint in model["endpoints"]:  # type: ignore[attr-defined]
            endpoint["cost"] = {"max_num_seqs": 1}
        config = {"models": [model], "placement": {"priorities": PRIORITIES}, "flow_control": FLOW_CONTROL}
        path = tmp_path / "cognitora.yaml"
        path.write_text(yaml.safe_dump(config))
        metrics = free_port()
        with start_gateway(
            path, fleet.endpoint_ids, tmp_path, extproc_args=["--metrics-listen", f"127.0.0.1:{metrics}"], jwks=JWKS
        ) as stack:
            seen = asyncio.run(
                burst_behind_a_held_seat(stack.url, fleet.model, f"http://127.0.0.1:{metrics}/metrics", headers_of)
            )
    check(seen)
