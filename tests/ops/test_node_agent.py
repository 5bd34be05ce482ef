"""``cognitora node-agent``: only NVML is faked (a stand-in ``pynvml``) and powermetrics' output is a text sample;
the agent, its HTTP page, the config, and the collector's scraper that reads the page all run for real."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from aiohttp import web

from cognitora.collector import scrape_targets
from cognitora.config import ConfigError, config_from_dict
from cognitora.node_agent.cli import resolve_source
from cognitora.node_agent.exposition import GpuReading
from cognitora.node_agent.nvml import NvmlSource, NvmlUnavailable
from cognitora.node_agent.powermetrics import EnergyIntegrator, PowermetricsSource, parse_powermetrics
from cognitora.node_agent.server import NodeAgent
from kvstate.engines import parse_prometheus_text
from kvstate.memory_store import MemoryStore
from kvstate.scrape import Scraper

TESTS = Path(__file__).parents[1]
FAKE_PYNVML = TESTS / "support" / "fake_pynvml"
POWERMETRICS_SAMPLE = TESTS / "data" / "powermetrics_apple_silicon.txt"
REPO = TESTS.parent


@pytest.fixture
def pynvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh stand-in ``pynvml`` (two fake GPUs) in ``sys.modules``, where ``import pynvml`` finds it."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_PYNVML / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)  # before running it: its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


ENGINE_PAGE = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1\n'


@pytest.fixture
async def engines() -> AsyncIterator[list[str]]:
    """Two tiny vLLM-like engines (health and a load page without power): the power comes from the agent."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=ENGINE_PAGE)

    runners, urls = [], []
    for _ in range(2):
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    yield urls
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def nvml_agent(pynvml: ModuleType) -> AsyncIterator[NodeAgent]:
    source = NvmlSource()  # imports the stand-in through the real import path
    source.open()
    agent = NodeAgent(source, interval_s=60.0, hostname="gpu-node-1")  # samples on start; tests call sample()
    await agent.start("127.0.0.1:0")
    yield agent
    await agent.stop()
    source.close()


def fleet_config(engine_urls: list[str], power_url: str, gpus: list[list[int | str]]) -> dict[str, object]:
    endpoints = [
        {"url": url, "id": f"e{i}", "power": {"url": power_url, "gpus": mapped}}
        for i, (url, mapped) in enumerate(zip(engine_urls, gpus, strict=True))
    ]
    return {"models": [{"name": "m", "endpoints": endpoints}]}


async def test_the_scraper_reads_the_agent_as_it_reads_dcgm_and_sums_the_mapped_gpus(
    pynvml: ModuleType, nvml_agent: NodeAgent, engines: list[str]
) -> None:
    uuid0 = pynvml.GPUS[0]["uuid"]
    agent_url = f"http://127.0.0.1:{nvml_agent.port}"  # no path: the config adds /metrics
    config = config_from_dict(fleet_config(engines, agent_url, [[1], [uuid0, 1]]), source="test")
    store = MemoryStore()
    scraper = Scraper(store, scrape_targets(config))  # the collector's own targets, power page and GPUs included
    await scraper.scrape_all()
    snaps = await store.snapshots()
    assert snaps["e0"].power_watts == pytest.approx(310.5)  # GPU 1 only
    assert snaps["e0"].energy_joules == pytest.approx(7250.0)  # 7 250 000 mJ
    assert snaps["e1"].power_watts == pytest.approx(560.5)  # GPU 0 (by UUID) + GPU 1 (by index)
    assert snaps["e1"].energy_joules == pytest.approx(8250.0)
    assert snaps["e0"].running == 1  # load still comes from the engine's own page

    pynvml.GPUS[1]["mj"] += 400_000  # GPU 1 drew 400 J more
    pynvml.GPUS[1]["mw"] = 120_000
    await nvml_agent.sample()
    await scraper.scrape_all()
    await scraper.stop()
    snaps = await store.snapshots()
    assert (snaps["e0"].power_watts, snaps["e0"].energy_joules) == (pytest.approx(120.0), pytest.approx(7650.0))


async def test_the_page_has_dcgm_exporters_names_units_and_labels(pynvml: ModuleType, nvml_agent: NodeAgent) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(f"http://127.0.0.1:{nvml_agent.port}/metrics")
    assert response.status_code == 200
    text = response.text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text  # dcgm-exporter writes no _total suffix
    samples = parse_prometheus_text(text)
    by_gpu = {labels["gpu"]: (labels, value) for labels, value in samples.series("DCGM_FI_DEV_POWER_USAGE")}
    labels, watts = by_gpu["1"]
    assert watts == pytest.approx(310.5)
    assert labels == {
        "gpu": "1",
        "UUID": pynvml.GPUS[1]["uuid"],
        "pci_bus_id": "00000000:2A:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-node-1",
    }

    def value(name: str, gpu: str) -> float:
        return next(v for labels, v in samples.series(name) if labels["gpu"] == gpu)

    assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0") == 1_000_000  # mJ, as NVML and DCGM count
    assert value("DCGM_FI_DEV_GPU_UTIL", "1") == 87
    assert value("DCGM_FI_DEV_MEM_COPY_UTIL", "1") == 41
    assert value("DCGM_FI_DEV_FB_USED", "1") == 60 * 1024  # MiB
    assert value("DCGM_FI_DEV_FB_FREE", "1") == 20 * 1024


async def test_a_failing_nvml_call_leaves_the_gpus_other_readings(
    pynvml: ModuleType, engines: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # An older GPU without the energy counter, and a utilization read that fails on the other one.
    pynvml.FAIL.update({(1, "nvmlDeviceGetTotalEnergyConsumption"), (0, "nvmlDeviceGetUtilizationRates")})
    source = NvmlSource()
    source.open()
    first, second = source.read(), source.read()
    assert second == first
    gpu0, gpu1 = first
    assert (gpu1.power_w, gpu1.energy_mj, gpu1.gpu_util_pct) == (310.5, None, 87.0)
    assert (gpu0.power_w, gpu0.energy_mj, gpu0.gpu_util_pct) == (250.0, 1_000_000.0, None)
    failures = [r for r in caplog.records if r.getMessage().startswith("NVML call failed")]
    assert len(failures) == 2  # once per GPU and call, not once per read

    agent = NodeAgent(source, interval_s=60.0)
    await agent.start("127.0.0.1:0")
    try:
        config = config_from_dict(
            fleet_config(engines[:1], f"http://127.0.0.1:{agent.port}/metrics", [[1]]), source="test"
        )
        scraper = Scraper(MemoryStore(), scrape_targets(config))
        snap = await scraper.scrape("e0")
        await scraper.stop()
    finally:
        await agent.stop()
        source.close()
    assert snap is not None
    assert snap.power_watts == pytest.approx(310.5)
    assert snap.energy_joules == 0.0  # not measured (GPU 0's counter is not borrowed)


def test_a_gpu_without_a_handle_is_left_out(pynvml: ModuleType) -> None:
    pynvml.FAIL.add((0, "nvmlDeviceGetHandleByIndex"))
    source = NvmlSource()
    source.open()
    assert [r.index for r in source.read()] == [1]


def test_nvml_without_the_bindings_or_the_driver_says_what_to_do(
    pynvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(9)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    with pytest.raises(NvmlUnavailable, match="NVIDIA driver"):
        NvmlSource().open()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    with pytest.raises(NvmlUnavailable, match=r"cognitora-router\[nvml\]"):
        NvmlSource()


def _cli(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "cognitora.cli", "node-agent", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_cli_once_prints_one_page(tmp_path: Path) -> None:
    done = _cli("--source", "nvml", "--once", pythonpath=FAKE_PYNVML)
    assert done.returncode == 0, done.stderr
    samples = parse_prometheus_text(done.stdout)
    assert samples.gauge_sum("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(560.5)


def test_cli_without_pynvml_exits_2_with_the_install_hint(tmp_path: Path) -> None:
    (tmp_path / "pynvml.py").write_text("raise ImportError('not installed (test)')\n")
    done = _cli("--source", "nvml", "--once", pythonpath=tmp_path)
    assert done.returncode == 2
    assert "pip install 'cognitora-router[nvml]'" in done.stderr
    assert _cli("--interval-s", "0").returncode == 2


def test_auto_picks_powermetrics_on_macos_only() -> None:
    assert resolve_source("auto", "darwin") == "powermetrics"
    assert resolve_source("auto", "linux") == "nvml"
    assert resolve_source("nvml", "darwin") == "nvml"


# -- powermetrics ---------------------------------------------------------------------------------------------

SAMPLE_WATTS = [6.912, 9.512]  # "Combined Power (CPU + GPU + ANE)" of the two samples in the capture
SAMPLE_ELAPSED_S = [1.00352, 0.99810]


def test_a_powermetrics_capture_parses_to_the_right_watts() -> None:
    samples = parse_powermetrics(POWERMETRICS_SAMPLE.read_text())
    assert [s.total_mw / 1000 for s in samples if s.total_mw is not None] == pytest.approx(SAMPLE_WATTS)
    first = samples[0]
    assert (first.cpu_mw, first.gpu_mw, first.ane_mw) == (1234.0, 5678.0, 0.0)
    assert first.elapsed_ms == pytest.approx(1003.52)
    assert first.gpu_active_pct == pytest.approx(63.21)
    integrator = EnergyIntegrator()
    for sample in samples:
        integrator.add(sample)
    joules = math.fsum(w * s for w, s in zip(SAMPLE_WATTS, SAMPLE_ELAPSED_S, strict=True))
    assert integrator.energy_mj / 1000 == pytest.approx(joules)


def test_powermetrics_without_combined_line_sums_the_parts() -> None:
    text = "*** Sampled system activity (x) (500.00ms elapsed) ***\nCPU Power: 1.5 W\nGPU Power: 250 mW\n"
    (sample,) = parse_powermetrics(text)
    assert sample.total_mw == pytest.approx(1750.0)


@pytest.fixture
def replay_command() -> Iterator[list[str]]:
    """A stand-in for the powermetrics binary: prints the capture and exits, as ``-n 2`` would."""
    yield [sys.executable, "-c", f"import sys; sys.stdout.write(open({str(POWERMETRICS_SAMPLE)!r}).read())"]


async def test_the_scraper_reads_a_mac_through_the_agent(replay_command: list[str], engines: list[str]) -> None:
    source = PowermetricsSource(interval_s=1.0, command=replay_command)
    await source.start()
    await asyncio.wait_for(source.exited.wait(), 30)
    assert source.samples == 2
    agent = NodeAgent(source, interval_s=60.0)
    await agent.start("127.0.0.1:0")
    try:
        config = config_from_dict(fleet_config(engines[:1], f"http://127.0.0.1:{agent.port}", [[0]]), source="test")
        scraper = Scraper(MemoryStore(), scrape_targets(config))
        snap = await scraper.scrape("e0")
        await scraper.stop()
    finally:
        await agent.stop()
        await source.stop()
    assert snap is not None
    assert snap.power_watts == pytest.approx(SAMPLE_WATTS[-1])  # the latest sample
    energy = math.fsum(w * s for w, s in zip(SAMPLE_WATTS, SAMPLE_ELAPSED_S, strict=True))
    assert snap.energy_joules == pytest.approx(energy, abs=1e-3)  # the page rounds to whole mJ


# -- config -----------------------------------------------------------------------------------------------------


def test_power_config_keys() -> None:
    config = config_from_dict(fleet_config(["http://e:8000"], "http://node:9400", [["GPU-abc", 2]]), source="test")
    power = config.models[0].endpoints[0].power
    assert power is not None and power.url == "http://node:9400/metrics"
    (target,) = scrape_targets(config)
    assert (target.power_url, target.power_gpus) == ("http://node:9400/metrics", ("GPU-abc", "2"))
    for bad in ([-1], [0, "0"]):
        with pytest.raises(ConfigError, match=r"endpoints\[0\]\.power\.gpus"):
            config_from_dict(fleet_config(["http://e:8000"], "http://node:9400", [bad]), source="test")
    with pytest.raises(ConfigError, match=r"power\.url"):
        config_from_dict(fleet_config(["http://e:8000"], "node:9400", [[0]]), source="test")


def test_a_litellm_deployment_names_its_power_page_in_model_info() -> None:
    from litellm_plugin.fleet import build_fleet

    deployment = {
        "model_name": "chat",
        "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://gpu-node-1:8000/v1"},
        "model_info": {"id": "a", "cognitora_power": {"url": "http://gpu-node-1:9400", "gpus": [1]}},
    }
    (target,) = scrape_targets(build_fleet([deployment], {}).config)
    assert (target.power_url, target.power_gpus) == ("http://gpu-node-1:9400/metrics", ("1",))


class _FailingAfterFirst:
    """A power source whose driver stops answering after the first reading."""

    name = "flaky"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> list[GpuReading]:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("driver gone")
        return []


async def test_readyz_follows_the_readings_and_healthz_the_process(nvml_agent: NodeAgent) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{nvml_agent.port}", timeout=5) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["checks"] == {"source": "ok"}
    flaky = NodeAgent(_FailingAfterFirst(), interval_s=0.05, hostname="h")
    await flaky.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{flaky.port}", timeout=5) as client:
            deadline = asyncio.get_running_loop().time() + 10
            while (ready := await client.get("/readyz")).status_code == 200:
                assert asyncio.get_running_loop().time() < deadline, "never turned not ready"
                await asyncio.sleep(0.05)
            assert ready.status_code == 503
            assert ready.json()["checks"]["source"].startswith("last successful reading")
            assert (await client.get("/healthz")).status_code == 200
    finally:
        await flaky.stop()
