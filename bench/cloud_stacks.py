"""A gateway with Cognitora bursting to the simulated cloud, started as its docs say, for the cloud fault benchmark
(bench/cloud_faults.py) and the cloud end-to-end tests (tests/e2e/test_cloud_envoy_e2e.py,
tests/e2e/test_cloud_litellm_e2e.py):

- ``envoy_stack``: a real Envoy on examples/envoy.yaml + examples/envoy_burst.yaml (added by
  ``burst_example.add_pieces``, moved to free ports), ``cognitora extproc``, the cloud over TLS (it checks the key the
  service injects); identity from the example's API keys (``cognitora.api_keys``, verified by Envoy's jwt_authn);
- ``litellm_stack``: the real LiteLLM proxy on examples/litellm_burst.yaml, the cloud as the group's
  ``cognitora_cloud`` deployment ``cloud-0``; identity from the example's own custom auth
  (``litellm_plugin.auth``: API keys listed with their teams);

each on one slow simulated engine (``mac``). Two priority classes: ``default`` (a 2 s TTFT SLO), and ``instant``,
whose SLO (1 ms) no local engine meets, so that every request of a team allowed to burst is sent out while the
cloud's breaker lets it. Team ``research`` may burst, ``ops`` may not, ``direct`` may name the cloud target.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.burst_load import CLOUD_MODEL, Answer, chat, closed_loop
from cognitora import api_keys
from cognitora_sim.cloud_launch import SimCloudProcess, start_cloud
from cognitora_sim.harness.envoy_launch import start_gateway
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from envoy_extproc.burst_example import add_burst

ROOT = Path(__file__).resolve().parent.parent
LITELLM_EXAMPLE = ROOT / "examples" / "litellm_burst.yaml"
LITELLM = Path(sys.executable).parent / "litellm"
INSTANT = "instant"
"""The class no local engine can serve in time (its requests of an allowed team always burst)."""
SLO_S = 2.0
PRIORITIES = {"default": {"ttft_slo_s": SLO_S}, INSTANT: {"ttft_slo_s": 0.001}}
HOLD_OFF_S = 5.0
"""burst.unhealthy_s: the breaker's hold-off (longer than the local retries of a wave take through Envoy on a shared
2-core machine, so a wave sent after it still finds the breaker open)."""
LITELLM_HOLD_OFF_S = 10.0
"""The same through the LiteLLM proxy: it takes seconds to retry a wave of failed requests on this machine."""
PROBE_INTERVAL_S = 1.0
SCRAPE_INTERVAL_S = 1.0
RELEASE_BOUND_S = SCRAPE_INTERVAL_S + PROBE_INTERVAL_S + 0.4 * SLO_S + 6.0
"""docs/burst.md, "Letting go": once the engine is idle, traffic is local within the scrape interval (for the
engine's idleness to be seen) + the probe interval + the probe's own answer (at most the exit threshold, 0.4 x the
SLO), plus 6 s of margin for this shared machine. The late cloud answers CI saw (8.1 s, then 12.1 s after the
engine went idle, through Envoy with nothing else running) were not slowness: the probe had released the class, but
the short-prompt floor learned under the load never came down (``kvstate.rates``, fixed), so the first request
that found the engine busy with the trickle's own requests entered burst again. Without the probes nothing came
back at all (docs/burst.md: 45 of 45 stayed out), which this bound still tells apart."""
LITELLM_RELEASE_EXTRA_S = 5.0
"""Through the LiteLLM proxy a probe of a non-streamed request is timed as its whole answer, through the proxy's own
queue: on this loaded 2-core machine several probes in a row read over the exit threshold (0.8 s), each costing a
probe interval. Two local CI runs saw the last cloud answer 5.4 and 6.4 s after the engine went idle."""


def release_bound_s(gateway: str) -> float:
    """How soon after the engine goes idle every request is local again, through ``gateway``."""
    return RELEASE_BOUND_S + (LITELLM_RELEASE_EXTRA_S if gateway == "litellm" else 0.0)


CLOUD_ARGS = ["--models", CLOUD_MODEL, "--ttft-ms", "100", "--rtt-ms", "20", "--retry-after-s", "10"]
"""A 429 asks for 10 s: through LiteLLM the breaker honours it (through Envoy the service sees a retried request,
not its status: the failure hold-off applies)."""
LITELLM_KEYS = {
    "sk-research-default-key": ("research", None),
    "sk-research-instant-key": ("research", INSTANT),
    "sk-ops-default-key-0000": ("ops", None),
    "sk-ops-instant-key-0000": ("ops", INSTANT),
    "sk-direct-default-key-0": ("direct", None),
}
"""API key -> (team, priority class the admin set on the key): ``general_settings.cognitora_api_keys``."""


def burst_settings(
    *, hold_off_s: float = HOLD_OFF_S, named_teams: list[str] | None = None, **target: Any
) -> dict[str, Any]:
    """The ``burst:`` section both gateways run with: research may burst; short hold-offs and probes."""
    return {
        "targets": [
            {
                "name": "sim-cloud",
                "input_usd_per_mtok": 0.15,
                "output_usd_per_mtok": 0.6,
                "max_concurrency": 16,
                "timeout_s": 30,
                "named_teams": named_teams or [],
                **target,
            }
        ],
        "teams": ["research"],
        "priorities": ["default", INSTANT],
        "enter_ratio": 0.7,
        "exit_ratio": 0.4,
        "min_dwell_s": 2,
        "unhealthy_s": hold_off_s,
        # No doubling (tests/burst/test_cloud_governance.py proves it): each failing-cloud test leaves the breaker
        # open, and the next one waits that hold-off out before it starts; doubled, that wait cost CI a minute.
        "unhealthy_max_s": hold_off_s,
        "probe_interval_s": PROBE_INTERVAL_S,
    }


@dataclass
class CloudStack:
    """A running gateway in front of the engine and the cloud."""

    gateway: str
    """``envoy`` or ``litellm``."""
    fleet: SimFleet
    cloud: SimCloudProcess
    url: str
    metrics_url: str
    hold_off_s: float
    model: str
    """The model name clients send."""
    jwks: str = ""
    """The signing key of the Envoy stack's API keys (``cognitora keys jwks``)."""

    @property
    def cloud_marks(self) -> frozenset[str]:
        """What an answer from the cloud is recognised by (``bench.burst_load.Answer.served_by``)."""
        if self.gateway == "envoy":
            return frozenset({f"127.0.0.1:{self.cloud.port}"})  # the address Envoy reached
        return frozenset({self.cloud.base_url, CLOUD_MODEL})

    def auth(self, team: str, priority: str | None = None) -> dict[str, str]:
        """The credentials of a client of ``team`` (and the admin-set class ``priority``)."""
        if self.gateway == "envoy":
            key = api_keys.mint(self.jwks, team=team, key_id=f"{team}-key", priority=priority, expires_in_s=3600)
            return {"Authorization": f"Bearer {key}"}
        key = next(k for k, (t, p) in LITELLM_KEYS.items() if (t, p) == (team, priority))
        return {"Authorization": f"Bearer {key}"}

    def metrics(self) -> str:
        return httpx.get(self.metrics_url, timeout=10).text

    def breaker(self) -> str:
        """The cloud target's breaker state on the gateway's page (``?``: no cloud request yet)."""
        found = re.findall(r'cognitora_cloud_breaker\{state="(\w+)",target="sim-cloud"\} 1\.0', self.metrics())
        return found[0] if found else "?"

    def counter(self, name: str) -> float:
        found = re.findall(rf'{name}\{{target="sim-cloud"\}} ([0-9.e+]+)', self.metrics())
        return float(found[0]) if found else 0.0

    def close_breaker(self) -> None:
        """Wait out a hold-off left by earlier traffic, and let one request close the breaker (the cloud is
        healthy)."""
        wait_until(lambda: self.breaker() != "open", 2 * self.hold_off_s + 5, "the cloud's hold-off to end")
        if self.breaker() == "half_open":
            test = wave(self, self.auth("research", INSTANT), 1, "close")
            if test.errors or test.cloud_calls != 1:
                raise RuntimeError(f"the breaker's test request failed: {test}")
        state = self.breaker()
        if state not in ("closed", "?"):
            raise RuntimeError(f"the breaker is {state} after a successful test request")


def _engine_config(fleet: SimFleet, tokenizer: Path) -> dict[str, Any]:
    return {
        "name": fleet.model,
        "tokenizer": str(tokenizer),
        "endpoints": [{"url": fleet.urls[0], "prefill_tokens_per_s": 1200}],
    }


@contextmanager
def envoy_stack(work: Path, tokenizer_dir: Path) -> Iterator[CloudStack]:
    """Envoy + ``cognitora extproc`` + the engine + the TLS cloud (which checks the key the service injects)."""
    cloud_key = "sk-cloud-" + secrets.token_hex(8)
    env = {"CLOUD_API_KEY": cloud_key}
    jwks = api_keys.new_jwks()
    tokenizer = tokenizer_dir / "tokenizer.json"
    # --accept-any-model: a cloud request Envoy retried on the engine carries the cloud's model name.
    with (
        start_fleet(1, profile="mac", tokenizer=tokenizer, log_dir=work, extra_args=["--accept-any-model"]) as fleet,
        start_cloud(log_dir=work, tls=True, args=[*CLOUD_ARGS, "--api-key-env", "CLOUD_API_KEY"], env=env) as cloud,
    ):
        assert cloud.ca_file is not None
        burst = burst_settings(
            base_url=f"https://cloud.sim.test:{cloud.port}/v1",
            credential_env="CLOUD_API_KEY",
            models={fleet.model: CLOUD_MODEL},
        )
        config = {
            "models": [_engine_config(fleet, tokenizer)],
            "scrape": {"interval_s": SCRAPE_INTERVAL_S, "timeout_s": 1.0},
            "placement": {"priorities": PRIORITIES},
            "burst": burst,
        }
        config_path = work / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        metrics = free_port()
        with start_gateway(
            config_path,
            fleet.endpoint_ids,
            work,
            extproc_args=["--metrics-listen", f"127.0.0.1:{metrics}"],
            env=env,
            jwks=jwks,
            edit=add_burst(cloud.port, cloud.ca_file),
            expose_upstream_host=True,  # who answered: the engine or the cloud
        ) as gateway:
            stack = CloudStack(
                "envoy", fleet, cloud, gateway.url, f"http://127.0.0.1:{metrics}/metrics", HOLD_OFF_S, fleet.model
            )
            stack.jwks = jwks
            _warm(stack)
            yield stack


def litellm_example_on(engine_url: str, cloud_url: str) -> dict[str, Any]:
    """examples/litellm_burst.yaml, parsed, on one engine at ``engine_url`` (the example's first, without KV events)
    and the cloud at ``cloud_url``: the rest of the file as it is."""
    config: dict[str, Any] = yaml.safe_load(LITELLM_EXAMPLE.read_text())
    engine, *_, cloud_dep = config["model_list"]
    config["model_list"] = [engine, cloud_dep]
    engine["litellm_params"]["api_base"] = f"{engine_url}/v1"
    engine["model_info"] = {"id": "engine-0", "cognitora_prefill_tokens_per_s": 1200}
    cloud_dep["litellm_params"]["api_base"] = cloud_url
    return config


@contextmanager
def litellm_stack(work: Path, tokenizer_dir: Path) -> Iterator[CloudStack]:
    """The LiteLLM proxy on examples/litellm_burst.yaml (its ports and paths filled in) + the engine + the cloud."""
    cloud_key = "sk-cloud-" + secrets.token_hex(8)
    env = {"CLOUD_API_KEY": cloud_key}
    with (
        start_fleet(1, profile="mac", tokenizer=tokenizer_dir / "tokenizer.json", log_dir=work) as fleet,
        start_cloud(log_dir=work, args=[*CLOUD_ARGS, "--api-key-env", "CLOUD_API_KEY"], env=env) as cloud,
    ):
        config = litellm_example_on(fleet.urls[0], cloud.base_url)
        cloud_dep = config["model_list"][-1]
        args = config["router_settings"]["routing_strategy_args"]
        args["models"][0]["tokenizer"] = str(tokenizer_dir / "tokenizer.json")
        args["scrape"] = {"interval_s": SCRAPE_INTERVAL_S, "timeout_s": 1.0}
        args["placement"]["priorities"] = PRIORITIES
        timeout_s = cloud_dep["litellm_params"]["timeout"]
        args["burst"] = burst_settings(hold_off_s=LITELLM_HOLD_OFF_S, named_teams=["direct"], timeout_s=timeout_s)
        # LiteLLM's own cooldown of a failing deployment would hide the cloud from the strategy for its own 5 s: the
        # breaker measured here is the core's, the same as through Envoy.
        config["router_settings"]["disable_cooldowns"] = True
        config["general_settings"]["cognitora_api_keys"] = [
            {"key": key, "team": team, "key_alias": f"{team}-{priority or 'default'}", "priority": priority}
            for key, (team, priority) in LITELLM_KEYS.items()
        ]
        path = work / "litellm_burst.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        proxy, url = start_litellm_proxy(path, work, env)
        try:
            stack = CloudStack("litellm", fleet, cloud, url, f"{url}/cognitora/metrics", LITELLM_HOLD_OFF_S, "chat")
            _warm(stack)
            yield stack
        finally:
            proxy.stop()


def start_litellm_proxy(config: Path, work: Path, env: dict[str, str]) -> tuple[ManagedProcess, str]:
    """The real LiteLLM proxy on ``config`` (run from ``work``, where a custom auth module may lie), once it answers;
    ``env``: more of its environment (the cloud's key). The caller stops it."""
    port = free_port()
    proxy_env = {
        "LITELLM_MASTER_KEY": "sk-master-" + secrets.token_hex(8),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    argv = [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    proc = ManagedProcess(argv, work / f"{config.stem}.log", env=proxy_env, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{url}/health/liveliness", timeout_s=120)
    except BaseException:
        proc.stop()
        raise
    return proc, url


def _warm(stack: CloudStack) -> None:
    """The gateway's first calls pay for its clients' set-up: not what is measured."""
    warm = wave(stack, stack.auth("ops"), 2, "warm")
    if warm.errors:
        raise RuntimeError(f"the {stack.gateway} stack does not answer: {warm.errors}")


# -- traffic ---------------------------------------------------------------------------------------------------------


@dataclass
class Wave:
    """Concurrent requests sent while the cloud did something, and what came of them."""

    answers: list[Answer]
    cloud_calls: int
    """Requests that reached the cloud during the wave (its own count)."""

    @property
    def errors(self) -> list[str]:
        return [f"{a.status} {a.error}" for a in self.answers if a.status != 200]

    def from_cloud(self, marks: frozenset[str]) -> int:
        return sum(1 for a in self.answers if a.cloud(marks))


def wave(stack: CloudStack, headers: dict[str, str], n: int, tag: str) -> Wave:
    """``n`` concurrent streamed requests (short prompts), counting what reached the cloud meanwhile."""
    before = stack.cloud.received()

    async def send() -> list[Answer]:
        async with httpx.AsyncClient(timeout=60) as client:
            sent = (chat(client, stack.url, headers, f"{tag}-{i}", 4, stack.model, words=20) for i in range(n))
            return list(await asyncio.gather(*sent))

    answers = asyncio.run(send())
    return Wave(answers, stack.cloud.received() - before)


def wait_idle(fleet: SimFleet) -> float:
    """Wait until the engine runs and queues nothing; when that was seen (monotonic)."""

    def quiet() -> bool:
        state = fleet.state(0)
        return state.get("running") == 0 and state.get("waiting") == 0

    wait_until(quiet, 90, "the engine to drain")
    return time.monotonic()


def mixed_load_step(stack: CloudStack) -> list[Answer]:
    """A load step that saturates the engine: research, which may burst (most of it goes out), and beside it ops,
    which may not (its requests all run locally, under load: what the engine's learned figures are made of)."""

    async def both() -> list[Answer]:
        out, _ = await asyncio.gather(
            closed_loop(stack.url, stack.auth("research"), 8, 48, "step", model=stack.model),
            closed_loop(stack.url, stack.auth("ops"), 8, 24, "ops-step", model=stack.model),
        )
        return out

    return asyncio.run(both())


def trickle(stack: CloudStack, headers: dict[str, str], seconds: float, rate: float) -> list[tuple[float, Answer]]:
    """Short prompts at ``rate`` a second for ``seconds``, open loop: (when each was sent, monotonic; its answer)."""

    async def run() -> list[tuple[float, Answer]]:
        sent: list[tuple[float, asyncio.Task[Answer]]] = []
        async with httpx.AsyncClient(timeout=60) as client:
            for i in range(int(seconds * rate)):
                task = asyncio.create_task(chat(client, stack.url, headers, f"trickle-{i}", 3, stack.model, words=2))
                sent.append((time.monotonic(), task))
                await asyncio.sleep(1 / rate)
            return [(at, await task) for at, task in sent]

    return asyncio.run(run())


def cloud_after(sent: list[tuple[float, Answer]], since: float, is_cloud: Callable[[Answer], bool]) -> list[str]:
    """The requests sent after ``since`` that went to the cloud, as readable lines."""
    return [f"+{at - since:.1f} s: {a.served_by}" for at, a in sent if at >= since and is_cloud(a)]
