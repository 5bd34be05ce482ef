"""bench.flow_bench through LiteLLM: each request sends the API key of its team and class, the proxy's config lists
one key per (team, class) as the auth hook reads them, and no key reaches a file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from bench import flow_bench
from bench import workloads as wl
from bench.flow_bench import (
    PRIORITY_HEADER,
    TEAM_HEADER,
    FlowWorkload,
    flow_identities,
    flow_schedule,
    with_api_keys,
)
from bench.loadgen import run_load
from bench.report import Slo, TargetRun
from bench.targets import (
    API_KEY_TARGETS,
    CognitoraLiteLLMTarget,
    Target,
    all_targets,
    make_target,
    mint_api_keys,
    takes_api_keys,
)
from cognitora.config import resolve_env
from litellm_plugin.auth import SETTINGS_KEY, identify

SMALL = FlowWorkload(warmup_s=1, alone_s=1, noisy_s=1, gap_s=0, over_s=2)


class FakeFleet:
    urls = ("http://127.0.0.1:9001", "http://127.0.0.1:9002")
    events_addresses = ("tcp://127.0.0.1:9101", "tcp://127.0.0.1:9103")
    replay_addresses = ("tcp://127.0.0.1:9102", "tcp://127.0.0.1:9104")
    tokenizer_path = None


def test_a_key_is_minted_per_team_and_class_of_the_schedule() -> None:
    schedule = flow_schedule(SMALL, seed=3)
    keys = mint_api_keys(flow_identities(schedule))
    assert [(k.team, k.priority) for k in keys] == [
        ("A", "default"),
        ("B", "default"),
        ("C", "default"),
        ("D", "batch"),
    ]
    assert len({k.key for k in keys}) == len(keys)
    assert all(k.key not in repr(k) for k in keys)
    assert {k.key for k in mint_api_keys(flow_identities(schedule))}.isdisjoint(k.key for k in keys)  # per run


async def test_each_request_sends_the_key_of_its_team_and_class_over_the_runs_master_key() -> None:
    seen: list[tuple[str, str, str]] = []

    async def chat(request: web.Request) -> web.Response:
        h = request.headers
        seen.append((h.get("Authorization", ""), h.get(TEAM_HEADER, ""), h.get(PRIORITY_HEADER, "")))
        return web.Response(text="data: [DONE]\n\n", content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    schedule = flow_schedule(SMALL, seed=3)
    keys = mint_api_keys(flow_identities(schedule))
    try:
        port = runner.addresses[0][1]
        master = {"Authorization": "Bearer sk-bench-master"}  # what LiteLLMTarget.headers sends on every request
        await run_load(
            f"http://127.0.0.1:{port}",
            with_api_keys(schedule, keys),
            "m",
            time_scale=10.0,
            headers=master,
            drain_wall_s=10,
        )
    finally:
        await runner.cleanup()
    identity_of = {f"Bearer {k.key}": (k.team, k.priority) for k in keys}
    assert len(seen) == len(schedule.requests)
    assert all(identity_of.get(auth) == (team, cls) for auth, team, cls in seen), seen
    assert {(team, cls) for _, team, cls in seen} == set(identity_of.values())
    # Peers and Envoy targets: the schedule as it was, identity headers only.
    assert with_api_keys(schedule, ()) is schedule


def test_the_litellm_targets_config_lists_each_key_as_the_auth_hook_reads_it_without_its_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = make_target("cognitora-litellm@flow_control={}", "m", tmp_path / "work")
    assert isinstance(target, CognitoraLiteLLMTarget)
    keys = mint_api_keys([("A", "default"), ("D", "batch")])
    target.api_keys = keys
    text = target.write_config(FakeFleet()).read_text()
    assert not any(k.key in text for k in keys)
    general = yaml.safe_load(text)["general_settings"]
    assert general["custom_auth"] == "litellm_plugin.auth.user_api_key_auth"
    # The proxy resolves os.environ/NAME from its environment: what the target starts it with.
    for name, value in target.env().items():
        monkeypatch.setenv(name, value)
    listed = resolve_env({SETTINGS_KEY: general[SETTINGS_KEY]}, "general_settings")[SETTINGS_KEY]
    for k in keys:
        entry = identify(k.key, listed)
        assert entry is not None and (entry.team, entry.priority) == (k.team, k.priority)
    assert not any(k.key in p.read_text() for p in (tmp_path / "work").rglob("*") if p.is_file() for k in keys)


def test_exactly_the_cognitora_litellm_targets_take_keys(tmp_path: Path) -> None:
    for i, name in enumerate(all_targets()):
        target = make_target(name, "m", tmp_path / str(i))
        assert takes_api_keys(name) == isinstance(target, CognitoraLiteLLMTarget), name
    assert takes_api_keys("cognitora-litellm@flow_control={}")
    assert set(all_targets()) >= API_KEY_TARGETS


def test_the_bench_keys_the_litellm_targets_requests_and_writes_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[str, Target, wl.Schedule]] = []

    def run_target(
        name: str,
        schedule: wl.Schedule,
        spec: Any,
        args: argparse.Namespace,
        slo: Slo,
        raw: list[dict[str, Any]] | None = None,
        configure: Callable[[Target], None] | None = None,
    ) -> TargetRun:
        # bench.run_all's run_target, less the fleet and the proxy: the target configured and its config written
        target = make_target(name, spec.model, tmp_path / "work" / str(len(runs)))
        assert configure is not None and raw is not None
        configure(target)
        if isinstance(target, CognitoraLiteLLMTarget):
            target.write_config(FakeFleet())
        runs.append((name, target, schedule))
        raw.extend({"stage": r.stage, "status": 200, "error": "", "ttft_s": 0.1} for r in schedule.requests)
        n = len(schedule.requests)
        return TargetRun(target=name, settings=target.settings, total_requests=n, total_ok=n)

    monkeypatch.setattr(flow_bench, "run_target", run_target)
    out = tmp_path / "out" / "flow"
    out.parent.mkdir()
    targets = "cognitora-envoy@flow_control={},cognitora-litellm@flow_control={}"
    argv = ["--seeds", "1", "--phase", "noisy", "--targets", targets, "--out", str(out), "--raw"]
    assert flow_bench.main(argv) == 0
    (envoy, _, envoy_schedule), (litellm, target, schedule) = runs
    assert envoy == "cognitora-envoy@flow_control={}" and litellm == "cognitora-litellm@flow_control={}"
    assert all("Authorization" not in dict(r.headers) for r in envoy_schedule.requests)
    assert isinstance(target, CognitoraLiteLLMTarget)
    keys = target.api_keys
    assert {(k.team, k.priority) for k in keys} == flow_identities(schedule) == {("A", "default"), ("B", "default")}
    bearer = {(k.team, k.priority): f"Bearer {k.key}" for k in keys}
    assert all(
        dict(r.headers)["Authorization"] == bearer[dict(r.headers)[TEAM_HEADER], dict(r.headers)[PRIORITY_HEADER]]
        for r in schedule.requests
    )
    assert f"| {litellm} |" in out.with_suffix(".md").read_text()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"flow.md", "flow.json", "flow.raw.jsonl", f"{litellm}.yaml"}
    assert not [p for p in written for k in keys if k.key in p.read_text()]
