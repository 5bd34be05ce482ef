"""examples/cognitora-pd.yaml started exactly as its header says, from the top of the checkout: the README's four
engines with prefill/decode roles, the decode sidecars, ``cognitora extproc --config examples/cognitora-pd.yaml
--collector``, and Envoy on examples/envoy.yaml with the one edit the header asks for (its ``engines`` cluster
listing the file's endpoints: a decode pick is its sidecar).

With a minted API key, the ``openai`` SDK sends a long prompt: it is split (prefilled on a prefill engine, decoded
behind a sidecar, ``x-cognitora-pd: split``); the same prefix again has all but its last partial block served from
the engines' caches, however it is placed.
"""

from __future__ import annotations

import random
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from tests.support.example_commands import (
    ENGINE_PORTS,
    EVENT_PORTS,
    ROOT,
    documented,
    env,
    require_free,
    start,
    wait_port,
)

pytestmark = pytest.mark.e2e

CONFIG = "examples/cognitora-pd.yaml"
ENDPOINTS = ("127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:9003", "127.0.0.1:9004")


def envoy_for_pd(path: Path) -> Path:
    """examples/envoy.yaml, its engines cluster listing the P/D endpoints (the header's one edit); nothing else."""
    edit = 'examples/envoy.yaml with its "engines" cluster listing this file\'s endpoints (127.0.0.1:8001, '
    assert edit in (ROOT / CONFIG).read_text(), f"{CONFIG} no longer asks for this edit: update it and this test"
    config = yaml.safe_load((ROOT / "examples" / "envoy.yaml").read_text())
    (engines,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "engines"]
    engines["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": int(a[10:])}}}}
                for a in ENDPOINTS
            ]
        }
    ]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def client(tmp_path: Path) -> Iterator[openai.OpenAI]:
    fleet = documented(
        "cognitora sim fleet --engines 4 --base-port 8001 --events-base-port 5557 --profile h100,h100,mac,mac "
        "--roles prefill,prefill,decode,decode",
        CONFIG,
    )
    sidecars = documented(
        "cognitora pd-sidecar --listen 127.0.0.1:9003 --engine http://127.0.0.1:8003 --listen 127.0.0.1:9004 "
        "--engine http://127.0.0.1:8004",
        CONFIG,
    )
    extproc = documented(f"cognitora extproc --config {CONFIG} --collector", CONFIG)
    require_free([*ENGINE_PORTS, *EVENT_PORTS, 9002, 9003, 9004, 9901, 10000], CONFIG)
    jwks = subprocess.run(["cognitora", "keys", "jwks"], env=env(), capture_output=True, text=True, check=True)
    keys = env(COGNITORA_JWKS=jwks.stdout.strip())
    mint = ["cognitora", "keys", "mint", "--team", "research", "--key-id", "alice"]
    key = subprocess.run(mint, env=keys, capture_output=True, text=True, check=True).stdout.strip()
    envoy_yaml = envoy_for_pd(tmp_path / "envoy.yaml")
    with start(fleet, tmp_path, "fleet") as engines, start(sidecars, tmp_path, "pd-sidecar") as sidecar:
        for port in ENGINE_PORTS:
            engines.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60)
        wait_port(9004, sidecar)
        with start(extproc, tmp_path, "extproc") as service:
            wait_port(9002, service)
            with start(["envoy", "-c", str(envoy_yaml)], tmp_path, "envoy", COGNITORA_JWKS=keys["COGNITORA_JWKS"]) as e:
                e.wait_http("http://127.0.0.1:9901/ready", timeout_s=30)
                yield openai.OpenAI(base_url="http://127.0.0.1:10000/v1", api_key=key, max_retries=0)


def long_prompt() -> str:
    rng = random.Random(secrets.token_hex(4))
    return "Reference notes. " + " ".join(f"item{rng.randrange(100_000)}" for _ in range(300))


def test_a_long_prompt_is_split_then_its_prefix_served_whole_from_the_decode_cache(client: openai.OpenAI) -> None:
    system = long_prompt()

    def ask(question: str) -> tuple[str, openai.types.chat.ChatCompletion]:
        raw = client.chat.completions.with_raw_response.create(
            model="smollm2",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=8,
        )
        return raw.headers.get("x-cognitora-pd", ""), raw.parse()

    how, first = ask("What is item one?")
    assert how == "split" and first.choices[0].message.content
    assert first.usage is not None and first.usage.prompt_tokens > 1000
    how, again = ask("And item two?")
    assert how in ("split", "local")  # whichever is predicted faster: both hold the prefix now
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert (again.usage.prompt_tokens_details.cached_tokens or 0) >= again.usage.prompt_tokens - 64
