"""A router whose tokenizer is not the engines' is loud about it, through both gateways.

The engines run the simulator's file-free ``builtin`` tokenizer; the router is configured with SmolLM2's (the
examples' model): every answer's ``usage.prompt_tokens`` disagrees with the router's count. The warning names both
counts and the likely cause, ``/metrics`` counts it, and a matching pair (the examples' fleet,
tests/examples/test_examples_start.py) stays quiet.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web

from cognitora.metrics.cors import CorsPolicy
from cognitora.token_agreement import TokenAgreement, mismatch_message
from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.harness.process import free_port, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from tests.support.chromium import Chromium
from tests.support.example_commands import BIN, ROOT
from tests.support.litellm_proxy import LiteLLMProxy

DASHBOARD = ROOT / "dashboard" / "index.html"
TOKENIZER = "HuggingFaceTB/SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Count the tokens of this prompt, please, and place it well."}]


def test_agreement_counts_and_rate_limits_its_warning(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    agreement = TokenAgreement(clock=lambda: now[0])
    assert agreement.observe("m", "e:1", 20, 20)
    with caplog.at_level("WARNING", logger="cognitora.tokens"):
        assert not agreement.observe("m", "e:1", 20, 23)
        assert not agreement.observe("m", "e:1", 20, 23)  # within the minute: counted, not logged again
        now[0] = 61.0
        assert not agreement.observe("m", "e:1", 21, 25)
    tally = agreement.tallies[("m", "e:1")]
    assert (tally.checks, tally.mismatches, tally.last_difference) == (4, 3, 4)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert warnings[0] == mismatch_message("m", "e:1", 20, 23)
    assert "models[].tokenizer the engine's tokenizer and chat template" in warnings[0]
    assert "(1 more since the last report)" in warnings[1]
    assert agreement.observe("m", "e:1", 5, 5) and agreement.mismatched() == {}


@pytest.fixture(scope="module")
def builtin_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with start_fleet(2, time_scale=10.0, tokenizer="builtin", log_dir=tmp_path_factory.mktemp("sim")) as fleet:
        yield fleet


def metric(page: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + "{"))


@pytest.mark.e2e
def test_envoy_reports_a_tokenizer_that_is_not_the_engines(builtin_fleet: SimFleet, tmp_path: Path) -> None:
    config = {"models": [builtin_fleet.model_config(tokenizer=Path(TOKENIZER))]}  # the id, as a config names it
    path = tmp_path / "cognitora.yaml"
    path.write_text(yaml.safe_dump(config))
    metrics = free_port()
    args = ["--metrics-listen", f"127.0.0.1:{metrics}"]
    with start_gateway(path, builtin_fleet.endpoint_ids, tmp_path, extproc_args=args) as gateway:
        for _ in range(2):
            body = {"model": builtin_fleet.model, "messages": MESSAGES, "max_tokens": 4}
            r = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        url = f"http://127.0.0.1:{metrics}/metrics"
        wait_until(lambda: metric(httpx.get(url).text, "cognitora_prompt_token_mismatches_total") >= 2, 10, "count")
        page = httpx.get(url).text
        assert metric(page, "cognitora_prompt_token_checks_total") == 2
        assert metric(page, "cognitora_prompt_token_mismatch_last") != 0
        log = gateway.extproc.log_tail(200)
        assert "router counts" in log and "is models[].tokenizer the engine's tokenizer and chat template?" in log
        assert log.count("router counts") == 1  # rate-limited: once a minute per model and endpoint


@pytest.mark.e2e
def test_litellm_reports_a_tokenizer_that_is_not_the_engines(builtin_fleet: SimFleet, tmp_path: Path) -> None:
    config = {
        "model_list": [
            {
                "model_name": "chat",
                "litellm_params": {"model": f"hosted_vllm/{builtin_fleet.model}", "api_base": f"{url}/v1"},
            }
            for url in builtin_fleet.urls
        ],
        "router_settings": {
            "routing_strategy": "cognitora",
            "routing_strategy_args": {"models": [{"name": "chat", "tokenizer": TOKENIZER}]},
        },
        "litellm_settings": {"callbacks": ["litellm_plugin.callbacks.cognitora"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }
    path = tmp_path / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    with LiteLLMProxy(path, tmp_path, key_prefix="sk-", ready_s=120) as launched:
        proxy, port, key = launched.process, launched.port, launched.key
        headers = {"Authorization": f"Bearer {key}"}
        for _ in range(2):
            body = {"model": "chat", "messages": MESSAGES, "max_tokens": 4}
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers, timeout=60)
            assert r.status_code == 200, r.text
        url = f"http://127.0.0.1:{port}/cognitora/metrics"

        def counted() -> bool:
            return metric(httpx.get(url, headers=headers).text, "cognitora_prompt_token_mismatches_total") >= 2

        wait_until(counted, 10, "the mismatches on the proxy's page")
        assert "is models[].tokenizer the engine's tokenizer and chat template?" in proxy.log_tail(300)


def test_dashboard_shows_the_disagreement_in_chromium() -> None:
    """The page served by a gateway that saw a mismatch (the families as the exporter writes them): a visible
    banner with the model, endpoint, difference and the question to ask; none for a page where they agree."""
    pages = {
        "bad": (
            "# TYPE cognitora_prompt_token_mismatch_last gauge\n"
            'cognitora_prompt_token_mismatch_last{model="smollm2",endpoint="127.0.0.1:8001"} -151\n'
            "# TYPE cognitora_prompt_token_mismatches_total counter\n"
            'cognitora_prompt_token_mismatches_total{model="smollm2",endpoint="127.0.0.1:8001"} 7\n'
            "# TYPE cognitora_prompt_token_checks_total counter\n"
            'cognitora_prompt_token_checks_total{model="smollm2",endpoint="127.0.0.1:8001"} 7\n'
        ),
        "good": (
            "# TYPE cognitora_prompt_token_mismatch_last gauge\n"
            'cognitora_prompt_token_mismatch_last{model="smollm2",endpoint="127.0.0.1:8001"} 0\n'
        ),
    }

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.match_info["which"]], headers=CorsPolicy().headers(request.headers))

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204, headers=CorsPolicy().headers(request.headers, preflight=True))

    async def banner(port: int, which: str) -> dict[str, Any]:
        async with Chromium() as browser:  # one browser per page: no answer read from the page before
            return await read_banner(browser, port, which)

    async def read_banner(browser: Chromium, port: int, which: str) -> dict[str, Any]:
        await browser.open(f"{DASHBOARD.as_uri()}?metrics=http://127.0.0.1:{port}/{which}/metrics&interval=300")
        deadline = time.monotonic() + 30
        while True:
            got: dict[str, Any] = await browser.evaluate(
                """(() => { const b = document.getElementById('token-mismatch');
                  if (!b || !document.body) return {ready: false};
                  return {ready: document.body.dataset.ready === '1', hidden: b.hidden, text: b.innerText,
                          shown: b.getBoundingClientRect().height > 0}; })()"""
            )
            if got["ready"]:
                return got
            assert time.monotonic() < deadline, "the page never rendered"
            await asyncio.sleep(0.1)

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        app = web.Application()
        app.router.add_get("/{which}/metrics", page)
        app.router.add_route("OPTIONS", "/{which}/metrics", preflight)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            return await banner(port, "bad"), await banner(port, "good")
        finally:
            await runner.cleanup()

    bad, good = asyncio.run(run())
    assert not bad["hidden"] and bad["shown"], bad
    assert "smollm2 on 127.0.0.1:8001: engine -151 tokens (7 of 7 answers)" in bad["text"], bad["text"]
    assert "models[].tokenizer" in bad["text"]
    assert good["hidden"] and not good["shown"], good


@pytest.mark.e2e
def test_explain_asks_the_engines_and_names_the_mismatch(builtin_fleet: SimFleet, tmp_path: Path) -> None:
    path = tmp_path / "cognitora.yaml"
    path.write_text(yaml.safe_dump({"models": [builtin_fleet.model_config(tokenizer=Path(TOKENIZER))]}))
    prompt = "A prompt long enough for a few full KV blocks of sixteen tokens each, " * 4
    argv = [str(BIN / "cognitora"), "explain", "--config", str(path), "--model", builtin_fleet.model]
    out = subprocess.run([*argv, "--prompt-file", "-"], input=prompt, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for endpoint in builtin_fleet.endpoint_ids:
        assert "tokenizer check: router counts" in out.stdout and f"endpoint {endpoint})" in out.stdout, out.stdout
    assert "is models[].tokenizer the engine's tokenizer and chat template?" in out.stdout
