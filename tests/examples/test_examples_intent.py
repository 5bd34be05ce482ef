"""examples/cognitora-intent.yaml and examples/intent.yaml started exactly as their header says, from the top of the
checkout: the README's four engines as two simulated fleets (``code`` on 8001-8002, ``small`` on 8003-8004),
``cognitora extproc --config examples/cognitora-intent.yaml --collector`` and ``envoy -c examples/envoy.yaml``.

With a minted API key, the ``openai`` SDK asks for ``auto``: a coding question is answered by ``code`` (its engines,
the ``x-cognitora-model`` header and the answer's ``model`` say so), small talk by ``small``; a named model is kept.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.example_commands import ENGINE_PORTS, EVENT_PORTS, documented, env, require_free, start, wait_port

pytestmark = pytest.mark.e2e

CONFIG = "examples/cognitora-intent.yaml"
FLEET_OF_TWO = "cognitora sim fleet --engines 2"
CODING_QUESTION = "Why does this raise a KeyError?\n```python\ndef f(d):\n    return d['x']\n```"
SMALL_TALK = "hey there, how are you doing today?"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[openai.OpenAI]:
    fleets = [
        documented(
            f"cognitora sim fleet --engines 2 --base-port {port} --events-base-port {events} --model {model}", CONFIG
        )
        for port, events, model in ((8001, 5557, "code"), (8003, 5561, "small"))
    ]
    extproc = documented(f"cognitora extproc --config {CONFIG} --collector", CONFIG)
    documented('export COGNITORA_JWKS="$(cognitora keys jwks)"; envoy -c examples/envoy.yaml', CONFIG)
    require_free([*ENGINE_PORTS, *EVENT_PORTS, 9002, 9901, 10000], CONFIG)
    jwks = subprocess.run(["cognitora", "keys", "jwks"], env=env(), capture_output=True, text=True, check=True).stdout
    key = subprocess.run(
        ["cognitora", "keys", "mint", "--team", "research", "--key-id", "alice"],
        env=env(COGNITORA_JWKS=jwks.strip()),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with (
        start(fleets[0], tmp_path, "fleet-code") as code,
        start(fleets[1], tmp_path, "fleet-small") as small,
    ):
        for port, fleet in zip(ENGINE_PORTS, (code, code, small, small), strict=True):
            fleet.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60)
        with start(extproc, tmp_path, "extproc") as service:
            wait_port(9002, service)
            with start(["envoy", "-c", "examples/envoy.yaml"], tmp_path, "envoy", COGNITORA_JWKS=jwks.strip()) as envoy:
                envoy.wait_http("http://127.0.0.1:9901/ready", timeout_s=30)
                yield openai.OpenAI(base_url="http://127.0.0.1:10000/v1", api_key=key, max_retries=0)


def ask(client: openai.OpenAI, model: str, question: str) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=8
    )
    answer = raw.parse()
    assert answer.choices[0].message.content
    return answer.model, raw.headers.get("x-cognitora-model", "")


def test_auto_is_rewritten_by_intent_and_a_named_model_is_kept(client: openai.OpenAI) -> None:
    assert ask(client, "auto", CODING_QUESTION) == ("code", "code")
    assert ask(client, "auto", SMALL_TALK) == ("small", "small")
    assert ask(client, "small", CODING_QUESTION)[0] == "small"  # only `auto` is rewritten (rewrite: [auto])
