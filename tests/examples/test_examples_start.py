"""Every example starts exactly as its docs say, and serves the clients people use.

From the top of the checkout, with the files as they are (no placeholder, port or path rewritten), on their fixed
ports: the README's simulated fleet, then

- Envoy: ``cognitora collector`` and ``cognitora extproc --config examples/cognitora.yaml``, the API keys' signing
  key from ``cognitora keys jwks``, ``envoy -c examples/envoy.yaml``, a key minted with ``cognitora keys mint``, and
  the official ``openai`` SDK (and the documented curl) with that key;
- LiteLLM: ``litellm --config examples/litellm_config.yaml --port 4000`` and the ``openai`` SDK with the team key
  the config lists (``litellm_plugin.auth``).

What a user sees is asserted: answers, streamed answers with usage, the second request on a shared prompt served
from the cache (the router's block keys match the engines' own, so placement follows the KV events), a missing or
wrong key refused as OpenAI's SDK expects (401, JSON), and the router's prompt-token count equal to the engine's.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from cognitora_sim.harness.process import wait_until
from tests.support.example_commands import (
    ROOT,
    documented,
    env,
    example_redis,
    require_free,
    sim_fleet,
    start,
    wait_port,
)

pytestmark = pytest.mark.e2e

COGNITORA_YAML = "examples/cognitora.yaml"
ENVOY_YAML = "examples/envoy.yaml"
LITELLM_YAML = "examples/litellm_config.yaml"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with sim_fleet(tmp_path_factory.mktemp("fleet")):
        yield


def shared_prompt(salt: str) -> str:
    """A system prompt long enough to fill many KV blocks, unique to this run (the fleet may outlive a test)."""
    facts = " ".join(
        f"Fact {i} of run {salt}: the gateway places requests where their prefix is cached." for i in range(40)
    )
    return f"You are a careful assistant. {facts}"


def ask(client: openai.OpenAI, model: str, system: str, question: str) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=8,
    )


def assert_serves_from_cache(client: openai.OpenAI, model: str) -> None:
    system = shared_prompt(secrets.token_hex(4))
    first = ask(client, model, system, "What does the gateway do?")
    assert first.choices[0].message.content
    assert first.usage is not None and first.usage.prompt_tokens > 500
    second = ask(client, model, system, "And why?")
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    # The shared system prompt (hundreds of tokens) is on the engine the first request went to, and the second is
    # placed there: at least all its full blocks but the last partial one are a hit.
    assert cached >= first.usage.prompt_tokens - 64, (cached, first.usage.prompt_tokens)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Stream it."}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_envoy_example_serves_the_openai_sdk_with_a_minted_team_key(fleet: None, tmp_path: Path) -> None:
    require_free([9002, 9901, 10000], f"{ENVOY_YAML} (extproc 9002, admin 9901, listener 10000)")
    with example_redis():
        collector_argv = documented(f"cognitora collector --config {COGNITORA_YAML}", COGNITORA_YAML, ENVOY_YAML)
        extproc_argv = documented(f"cognitora extproc --config {COGNITORA_YAML}", COGNITORA_YAML, ENVOY_YAML)
        documented('export COGNITORA_JWKS="$(cognitora keys jwks)"', ENVOY_YAML)
        envoy_argv = documented(f"envoy -c {ENVOY_YAML}", ENVOY_YAML)
        mint = documented("cognitora keys mint --team research --key-id alice", ENVOY_YAML)
        jwks = subprocess.run(
            ["cognitora", "keys", "jwks"], env=env(), cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        with (
            start(collector_argv, tmp_path, "collector") as collector,
            start(extproc_argv, tmp_path, "extproc") as extproc,
        ):
            wait_port(9002, extproc)
            with start(envoy_argv, tmp_path, "envoy", COGNITORA_JWKS=jwks) as envoy:
                envoy.wait_http("http://127.0.0.1:9901/ready", timeout_s=30)
                key = subprocess.run(
                    mint, env=env(COGNITORA_JWKS=jwks), cwd=ROOT, capture_output=True, text=True, check=True
                ).stdout.strip()
                client = openai.OpenAI(base_url="http://127.0.0.1:10000/v1", api_key=key, max_retries=0)
                assert_serves_from_cache(client, "smollm2")

                # The documented curl, as written (its key from the environment, as the doc exports it).
                curl = [line.strip(" #\\") for line in (ROOT / ENVOY_YAML).read_text().splitlines()[:40]]
                start_at = next(i for i, line in enumerate(curl) if line.startswith("curl "))
                command = " ".join(curl[start_at : start_at + 2])
                answer = subprocess.run(
                    ["bash", "-c", command], env=env(OPENAI_API_KEY=key), capture_output=True, text=True, check=True
                )
                assert json.loads(answer.stdout)["choices"][0]["message"]["content"], answer.stdout

                for wrong in ("sk-not-a-jwt", key[:-4] + "AAAA"):
                    bad = openai.OpenAI(base_url="http://127.0.0.1:10000/v1", api_key=wrong, max_retries=0)
                    with pytest.raises(openai.AuthenticationError) as refused:
                        ask(bad, "smollm2", "hi", "hi")
                    assert "API key" in refused.value.message, refused.value.body
                no_key = httpx.post("http://127.0.0.1:10000/v1/chat/completions", json={"model": "smollm2"})
                assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
            assert "router counts" not in extproc.log_tail(400), extproc.log_tail(400)
            assert collector.alive() and extproc.alive()


def test_explain_example_line_prints_every_engine(fleet: None, tmp_path: Path) -> None:
    line = (
        'echo "Where would this prompt go?" | cognitora explain --config examples/cognitora.yaml --model smollm2 '
        "--prompt-file -"
    )
    documented(line, COGNITORA_YAML)
    with example_redis():
        out = subprocess.run(["bash", "-c", line], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for port in (8001, 8002, 8003, 8004):
        assert f"127.0.0.1:{port}" in out.stdout, out.stdout
    for port in (8001, 8002, 8003, 8004):  # the engines count the prompt as the router does: the examples agree
        assert f"tokenizer check: 127.0.0.1:{port} counts" in out.stdout and "as the router does" in out.stdout


def test_litellm_example_serves_the_openai_sdk_with_a_team_key(fleet: None, tmp_path: Path) -> None:
    require_free([4000], f"{LITELLM_YAML} (the proxy on 4000)")
    argv = documented(f"litellm --config {LITELLM_YAML} --port 4000", LITELLM_YAML)
    master, research = "sk-" + secrets.token_hex(16), "sk-" + secrets.token_hex(16)
    with start(argv, tmp_path, "litellm", LITELLM_MASTER_KEY=master, RESEARCH_API_KEY=research) as proxy:
        proxy.wait_http("http://127.0.0.1:4000/health/liveliness", timeout_s=120)
        client = openai.OpenAI(base_url="http://127.0.0.1:4000/v1", api_key=research, max_retries=0)
        assert_serves_from_cache(client, "chat")
        bad = openai.OpenAI(base_url="http://127.0.0.1:4000/v1", api_key="sk-" + secrets.token_hex(16), max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            ask(bad, "chat", "hi", "hi")
        admin = openai.OpenAI(base_url="http://127.0.0.1:4000/v1", api_key=master, max_retries=0)
        assert ask(admin, "chat", "hi", "hi").choices[0].message.content
        assert "router counts" not in proxy.log_tail(400)


def test_a_taken_port_fails_at_once_naming_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(AssertionError, match=rf"needs 127\.0\.0\.1 ports {port}, which something already"):
            require_free([port], "an example")


def test_litellm_example_with_a_key_variable_unset_refuses_to_start(tmp_path: Path) -> None:
    """The example lists os.environ/RESEARCH_API_KEY: not set, the proxy stops at start naming the entry, instead
    of answering every team's request with an error later."""
    require_free([4000], f"{LITELLM_YAML} (the proxy on 4000)")
    argv = documented(f"litellm --config {LITELLM_YAML} --port 4000", LITELLM_YAML)
    with start(argv, tmp_path, "litellm", LITELLM_MASTER_KEY="sk-" + secrets.token_hex(16)) as proxy:
        wait_until(lambda: "Application startup failed" in proxy.log_tail(200), 120, "the proxy to refuse to start")
        log = proxy.log_tail(200)
    expected = (
        "general_settings: cognitora_api_keys[0].key: os.environ/RESEARCH_API_KEY names the environment variable "
        "RESEARCH_API_KEY, which is not set"
    )
    assert expected in log, log
