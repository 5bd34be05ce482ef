"""The commands the docs show work as written.

- Every documented ``curl`` that sends a JSON body says ``Content-Type: application/json``: without it curl sends
  ``application/x-www-form-urlencoded`` and the LiteLLM proxy answers 400 (docs/litellm.md's once did).
- Every documented ``curl`` to the LiteLLM proxy (port 4000) that needs no key but the master key runs, as written
  (only its address moved to the test proxy's port), against a real proxy with Cognitora placing on a simulated
  engine; its answer is what a user expects (a completion; the metrics line grep finds).
- The engine-side config of docs/events.md (vLLM and SGLang with KV events) is a valid ``cognitora.yaml``.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cognitora.config import config_from_dict
from cognitora_sim.harness.process import wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.litellm_proxy import LiteLLMProxy

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED_PROXY = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1):4000\b")
JSON_HEADER = re.compile(r"""-H\s*["']content-type:\s*application/json["']""", re.I)
SENDS_DATA = re.compile(r"\s(?:-d|--data(?:-raw|-binary)?)\s")


@dataclass(frozen=True)
class Curl:
    where: str
    command: str


def doc_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "examples").iterdir()),
        ROOT / "bench" / "README.md",
    ]


def documented_curls() -> list[Curl]:
    """Every ``curl`` command in the docs and examples, continuation lines joined, an inline one cut at its
    closing backtick; a commented example line (``#   curl ...``) counts."""
    found: list[Curl] = []
    for path in doc_files():
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            start = i
            match = re.search(r"(?:^|[\s`(])(curl\s.*)$", lines[i])
            if not match:
                i += 1
                continue
            command = match.group(1)
            while command.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command.rstrip()[:-1] + " " + lines[i].strip().lstrip("#").strip()
            if "`" in command and not lines[start].lstrip().startswith("curl"):
                command = command.split("`")[0]
            found.append(Curl(f"{path.relative_to(ROOT)}:{start + 1}", command.strip()))
            i += 1
    return found


def test_every_documented_curl_with_a_json_body_says_it_is_json() -> None:
    curls = documented_curls()
    with_body = [c for c in curls if SENDS_DATA.search(f" {c.command} ")]
    assert any(c.where.startswith("docs/litellm.md") for c in with_body), "the scan no longer finds docs/litellm.md's"
    missing = [f"{c.where}: {c.command}" for c in with_body if not JSON_HEADER.search(c.command)]
    assert missing == [], "curl sends a form without -H 'Content-Type: application/json' (the proxy answers 400)"


def test_the_kv_events_config_of_docs_events_md_is_a_valid_config(smollm2_dir: Path) -> None:
    text = (ROOT / "docs" / "events.md").read_text()
    section = text.split("## Turning KV events on in vLLM and SGLang", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    data = yaml.safe_load(blocks[0])
    # The doc's tokenizer path is the reader's model; the structure, engines and addresses are what is checked.
    data["models"][0]["tokenizer"] = str(smollm2_dir / "tokenizer.json")
    config = config_from_dict(data, source="docs/events.md")
    endpoints = config.models[0].endpoints
    assert [e.engine for e in endpoints] == ["vllm", "sglang"]
    assert all(e.kv_events and e.kv_events_replay for e in endpoints)
    # The engines' flags in the same section bind what Cognitora connects to: the same ports, a wildcard host.
    for endpoint in endpoints:
        port = endpoint.kv_events.rsplit(":", 1)[1] if endpoint.kv_events else ""
        assert f'"endpoint": "tcp://*:{port}"' in section
    assert config.models[0].block_size == 16 and "--block-size 16" in section and "--page-size 16" in section


@dataclass(frozen=True)
class Proxy:
    port: int
    key: str


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[SimFleet]:
    with start_fleet(1, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path_factory.mktemp("sim")) as f:
        yield f


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fleet: SimFleet, smollm2_dir: Path) -> Iterator[Proxy]:
    """The LiteLLM proxy serving model ``chat`` (the docs' name) through Cognitora, master key only."""
    tmp = tmp_path_factory.mktemp("proxy")
    config = {
        "model_list": [
            {
                "model_name": "chat",
                "litellm_params": {"model": f"hosted_vllm/{fleet.model}", "api_base": f"{fleet.urls[0]}/v1"},
                "model_info": {
                    "cognitora_kv_events": fleet.events_addresses[0],
                    "cognitora_kv_events_replay": fleet.replay_addresses[0],
                },
            }
        ],
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {"models": [{"name": "chat", "tokenizer": str(smollm2_dir / "tokenizer.json")}]},
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }
    path = tmp / "litellm_config.yaml"
    path.write_text(yaml.safe_dump(config))
    with LiteLLMProxy(path, tmp, key_prefix="sk-docs-", ready_s=120) as launched:
        yield Proxy(launched.port, launched.key)


def proxy_curls() -> list[Curl]:
    """The documented curls to the LiteLLM proxy that a reader runs with the master key (or no key)."""
    return [
        c
        for c in documented_curls()
        if DOCUMENTED_PROXY.search(c.command) and re.findall(r"\$\{?(\w+)", c.command) in ([], ["LITELLM_MASTER_KEY"])
    ]


def run_as_documented(curl: Curl, proxy: Proxy) -> subprocess.CompletedProcess[str]:
    command = DOCUMENTED_PROXY.sub(f"http://127.0.0.1:{proxy.port}", curl.command)
    env = {"PATH": "/usr/bin:/bin", "LITELLM_MASTER_KEY": proxy.key}
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], env=env, capture_output=True, text=True, timeout=60
    )


def test_documented_curls_to_the_litellm_proxy_work_as_written(proxy: Proxy) -> None:
    curls = proxy_curls()
    where = {c.where.split(":")[0] for c in curls}
    assert {"docs/litellm.md", "docs/metrics.md"} <= where, curls
    for curl in sorted(curls, key=lambda c: "/metrics" in c.command):  # a completion first: the metrics it makes
        if "/metrics" in curl.command:
            # The page's gauges appear once the core has scraped the engine: wait for it, then run the line as is.
            wait_until(lambda c=curl: run_as_documented(c, proxy).returncode == 0, 30.0, f"{curl.where} answers")
        done = run_as_documented(curl, proxy)
        assert done.returncode == 0, f"{curl.where}: `{curl.command}` exited {done.returncode}: {done.stderr}"
        if "/chat/completions" in curl.command:
            body = json.loads(done.stdout)
            assert "error" not in body, f"{curl.where}: {body}"
            assert body["choices"][0]["message"]["content"], body
        else:
            assert done.stdout.strip(), f"{curl.where}: `{curl.command}` printed nothing"


def test_without_the_header_the_proxy_refuses_the_same_request(proxy: Proxy) -> None:
    """Why the header is in every curl: the documented request without it gets a 400."""
    documented = next(c for c in proxy_curls() if "/chat/completions" in c.command)
    bare = Curl(documented.where, JSON_HEADER.sub("", documented.command) + ' -o /dev/null -w "%{http_code}"')
    assert run_as_documented(bare, proxy).stdout.strip() == "400"
