"""Fault injection under load: what clients of the Envoy gateway see when each part of a Cognitora deployment fails.

    .venv/bin/python -m bench.fault_injection --out bench/results/fault_injection

Everything runs on loopback: a private ``redis-server`` on a free port, ``--engines`` simulated engines (each a
``cognitora sim`` process of its own, so that one can be killed), ``cognitora collector`` and ``cognitora extproc``
over that Redis, and Envoy configured by ``examples/envoy.yaml``. An open-loop client sends ``--rate`` chat
requests a second (shared system prompts, a quarter of them streamed, ``--client-timeout-s`` each) for the whole
run, while the phases below inject one fault each, in sequence, ``--lead-s`` into the phase, and heal it
``--down-s`` later:

| phase | fault | heal |
|---|---|---|
| baseline | none | |
| engine-crash | SIGKILL the process of the engine with the most traffic so far | start it again on its ports |
| engine-hang | ``/sim/fault hang`` on the busiest other engine: accepts connections, never answers | ``recover`` |
| redis-restart | SIGKILL redis-server (no persistence: its state is lost) | start it again on the same port |
| extproc-restart | SIGKILL ``cognitora extproc`` | start it again on the same port |
| collector-restart | SIGKILL ``cognitora collector`` | start it again |

Per phase, requests are counted by the time they were sent: served (HTTP 200 with a complete body) and failed by
what the client saw (HTTP status, timeout, connection error, cut stream), with sample error bodies. Recovery:

- ``first failure`` / ``last failure``: when the first and the last failing request of the phase was sent,
  seconds after the fault (the window in which a client could see an error);
- ``first success after heal``: seconds from the heal (restart command) to the first request that succeeded;
- for the engine faults, from Envoy's own per-host counters (admin ``/clusters``, polled every
  ``SAMPLE_INTERVAL_S``): how many requests Envoy sent to the failed engine after the fault and when the last
  one left (when it "stopped getting picks"), and when it got its first request again after the heal.

The run is bounded: its length is fixed by the phase plan (``--phase-s`` each, a phase running on to
``AFTER_HEAL_S`` past its healed part's restart when that ends later, so that every phase sees its recovery) and at
most ``--max-requests`` requests are sent. The report (``OUT.md``, ``OUT.json``) starts with the exact command.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import random
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis
import yaml

from bench.harness.redis_server import redis_server_argv
from cognitora_sim.harness.envoy_launch import render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import SimFleet, start_fleet
from cognitora_sim.tokenizer import SMOLLM2_DIR

MODEL = "smollm2"
SAMPLE_INTERVAL_S = 0.25
AFTER_HEAL_S = 1.5
"""A phase lasts at least this long after its heal finished: on a loaded 2-core CI machine an ext_proc restart took
3.6 s and ended past a 6 s phase, so no request after it was seen and its recovery read as none."""
PHASES = ("baseline", "engine-crash", "engine-hang", "redis-restart", "extproc-restart", "collector-restart")
SYSTEM_PROMPTS = 12
"""Distinct shared system prompts (prefix groups) two thirds of the client's requests are spread over; the other
third have a prompt of their own (no shared prefix), which load and ties place, so every engine gets some."""


# -- the deployment ------------------------------------------------------------------------------------------


class Deployment:
    """Redis, the engines (each in a process of its own, so one can be killed), collector, ext_proc and Envoy."""

    def __init__(self, workdir: Path, engines: int, time_scale: float) -> None:
        if engines < 3:
            raise ValueError("the fault plan needs at least 3 engines (one to crash, one to hang, one that serves)")
        self.workdir = workdir
        self.engines = engines
        self.time_scale = time_scale
        self.tokenizer = SMOLLM2_DIR / "tokenizer.json"
        self.redis_port = free_port()
        self.redis: ManagedProcess | None = None
        self.fleets: list[SimFleet] = []
        """One single-engine ``cognitora sim fleet`` process per engine, in config order."""
        self.collector: ManagedProcess | None = None
        self.extproc: ManagedProcess | None = None
        self.extproc_port = free_port()
        self.envoy: ManagedProcess | None = None
        self.listen_port = free_port()
        self.admin_port = free_port()
        self.config_path = workdir / "cognitora.yaml"
        self._restarts = 0

    @property
    def endpoint_ids(self) -> list[str]:
        return [f.endpoint_ids[0] for f in self.fleets]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def envoy_admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> None:
        self.start_redis()
        self.fleets = [self._start_engine(None) for _ in range(self.engines)]
        urls = [f.urls[0] for f in self.fleets]
        events = [f.events_addresses[0] for f in self.fleets]
        replays = [f.replay_addresses[0] for f in self.fleets]
        config = {
            "redis_url": f"redis://127.0.0.1:{self.redis_port}/0",
            "key_prefix": f"cogfault-{uuid.uuid4().hex[:6]}",
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(self.tokenizer),
                    "endpoints": [
                        {"url": u, "engine": "vllm", "kv_events": e, "kv_events_replay": r}
                        for u, e, r in zip(urls, events, replays, strict=True)
                    ],
                }
            ],
            "scrape": {"interval_s": 0.5, "timeout_s": 0.5},
        }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.start_collector()
        self.start_extproc()
        text = render_config(
            listen_port=self.listen_port,
            admin_port=self.admin_port,
            extproc_port=self.extproc_port,
            engines=self.endpoint_ids,
            expose_upstream_host=True,  # the per-engine table reads which engine answered
        )
        self.envoy = start_envoy(text, self.workdir / "envoy", self.admin_port)

    def stop(self) -> None:
        for proc in (self.envoy, self.extproc, self.collector):
            if proc is not None:
                proc.stop(grace_s=5)
        for fleet in self.fleets:
            fleet.stop()
        if self.redis is not None:
            self.redis.stop(grace_s=5)

    # -- each part, killed and started again --------------------------------------------------------------------
    def _spawn(self, label: str, argv: Sequence[str]) -> ManagedProcess:
        self._restarts += 1
        return ManagedProcess(argv, self.workdir / f"{label}-{self._restarts}.log")

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("no redis-server on PATH: install Redis (apt-get install redis-server)")
        self.redis = self._spawn("redis", redis_server_argv(binary, self.redis_port, str(self.workdir)))
        client = redis.Redis(port=self.redis_port, socket_timeout=0.5, socket_connect_timeout=0.5)
        wait_until(lambda: bool(client.ping()), 15, f"redis-server on port {self.redis_port}")

    def _start_engine(self, base_port: int | None) -> SimFleet:
        return start_fleet(
            1,
            model=MODEL,
            time_scale=self.time_scale,
            tokenizer=self.tokenizer,
            log_dir=self.workdir,
            base_port=base_port,
        )

    def engine_index(self, endpoint_id: str) -> int:
        return self.endpoint_ids.index(endpoint_id)

    def kill_engine(self, i: int) -> None:
        self.kill(self.fleets[i].process)

    def restart_engine(self, i: int) -> None:
        """Start engine ``i`` again at its old address (ports), as a restarted engine comes back."""
        old = self.fleets[i]
        old.stop()  # already dead (killed): this closes its log
        self.fleets[i] = self._start_engine(old.base_port)

    def start_collector(self) -> None:
        argv = [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(self.config_path)]
        self.collector = self._spawn("collector", [*argv, "--log-level", "warning"])

    def start_extproc(self) -> None:
        argv = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(self.config_path)]
        argv += ["--listen", f"127.0.0.1:{self.extproc_port}", "--log-level", "warning"]
        self.extproc = self._spawn("extproc", argv)
        wait_listening(self.extproc_port, self.extproc, timeout_s=60)

    @staticmethod
    def kill(proc: ManagedProcess | None) -> None:
        """SIGKILL, as the OOM killer or a power cut would: no shutdown handler runs."""
        assert proc is not None
        proc.signal(signal.SIGKILL)
        proc.proc.wait(timeout=10)


# -- the client ----------------------------------------------------------------------------------------------


@dataclass
class Sent:
    """One client request and what the client saw."""

    t: float
    """Sent, seconds since the run started."""
    stream: bool
    outcome: str = ""
    """``ok``, ``HTTP <status>``, ``timeout``, ``connection error`` or ``stream cut``."""
    status: int = 0
    detail: str = ""
    latency_s: float | None = None
    engine: str = ""
    attempts: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def _body(rng: random.Random, i: int, stream: bool) -> dict[str, Any]:
    group = rng.randrange(SYSTEM_PROMPTS) if i % 3 else f"unique-{i}"
    system = f"You are assistant {group} of the fault drill. " + " ".join(f"rule-{group}-{k}." for k in range(120))
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {i}: what is {rng.randrange(1000)} plus {rng.randrange(1000)}?"},
        ],
        "max_tokens": 12,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _send(session: aiohttp.ClientSession, url: str, body: dict[str, Any], sent: Sent, timeout_s: float) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            sent.status = resp.status
            sent.engine = resp.headers.get("x-cognitora-upstream-host", "")
            sent.attempts = int(resp.headers.get("x-envoy-attempt-count", "0") or 0)
            text = await resp.text()
            if resp.status != 200:
                sent.outcome, sent.detail = f"HTTP {resp.status}", text[:240]
                return
            usage = _usage(text, sent.stream)
            if usage is None:
                sent.outcome, sent.detail = "stream cut", text[-240:]
                return
            sent.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            sent.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            sent.outcome = "ok"
            sent.latency_s = time.perf_counter() - start
    except TimeoutError:
        sent.outcome, sent.detail = "timeout", f"no complete answer within {timeout_s:g} s"
    except aiohttp.ClientPayloadError as exc:
        sent.outcome, sent.detail = "stream cut", str(exc)[:240]
    except aiohttp.ClientError as exc:
        sent.outcome, sent.detail = "connection error", f"{type(exc).__name__}: {exc}"[:240]


def _usage(text: str, stream: bool) -> dict[str, Any] | None:
    """The response's usage; None when the answer is incomplete (a stream without its final chunk)."""
    if not stream:
        try:
            usage = json.loads(text).get("usage")
        except (ValueError, AttributeError):
            return None
        return usage if isinstance(usage, dict) else None
    found: dict[str, Any] | None = None
    done = False
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
        elif '"usage"' in data:
            chunk = json.loads(data)
            if isinstance(chunk.get("usage"), dict):
                found = chunk["usage"]
    return found if done else None


async def open_loop(
    base_url: str, rate: float, until: Callable[[], bool], t0: float, timeout_s: float, max_requests: int, seed: int
) -> list[Sent]:
    """Send requests at ``rate`` a second (evenly spaced) until ``until()``; wait for the last to finish."""
    rng = random.Random(seed)
    url = f"{base_url}/v1/chat/completions"
    sent: list[Sent] = []
    tasks: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        i = 0
        while not until() and i < max_requests:
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            stream = i % 4 == 3
            record = Sent(t=time.perf_counter() - t0, stream=stream)
            sent.append(record)
            tasks.append(asyncio.create_task(_send(session, url, _body(rng, i, stream), record, timeout_s)))
            i += 1
        await asyncio.gather(*tasks)
    return sent


# -- Envoy's per-host counters ---------------------------------------------------------------------------------


@dataclass
class HostSample:
    t: float
    picks: dict[str, int]
    """Per engine ``IP:port``: requests Envoy sent or tried to send there so far (rq_total + cx_connect_fail)."""


async def sample_envoy(admin: str, until: Callable[[], bool], t0: float, samples: list[HostSample]) -> None:
    """Append Envoy's per-engine counters to ``samples`` every ``SAMPLE_INTERVAL_S`` until ``until()``."""
    async with aiohttp.ClientSession() as session:
        while not until():
            try:
                async with session.get(f"{admin}/clusters?format=json", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    data = await r.json(content_type=None)
                samples.append(HostSample(time.perf_counter() - t0, _engine_picks(data)))
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
            await asyncio.sleep(SAMPLE_INTERVAL_S)


def _engine_picks(data: dict[str, Any]) -> dict[str, int]:
    picks: dict[str, int] = {}
    for cluster in data.get("cluster_statuses", []):
        if cluster.get("name") != "engines":
            continue
        for host in cluster.get("host_statuses", []):
            addr = host.get("address", {}).get("socket_address", {})
            stats = {s.get("name"): int(s.get("value", 0) or 0) for s in host.get("stats", [])}
            picks[f"{addr.get('address')}:{addr.get('port_value')}"] = stats.get("rq_total", 0) + stats.get(
                "cx_connect_fail", 0
            )
    return picks


# -- what the operator saw: warnings and errors the gateway and the collector logged ------------------------------


@dataclass
class LogLine:
    t: float
    """Seconds since the run started."""
    source: str
    """``extproc`` or ``collector``."""
    level: str
    message: str


_TEXT_LOG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) \S+: (.*)$")


def read_logs(workdir: Path, epoch0: float) -> list[LogLine]:
    """WARNING and ERROR lines of every ``cognitora extproc`` and ``cognitora collector`` log (JSON lines or the
    text format), timed against the run's start (``epoch0``, wall clock). Lines of other shapes are skipped."""
    lines: list[LogLine] = []
    for path in sorted(workdir.glob("*.log")):
        source = path.name.split("-", 1)[0]
        if source not in ("extproc", "collector"):
            continue
        for raw in path.read_text(errors="replace").splitlines():
            line = _log_line(raw, source, epoch0)
            if line is not None and line.level in ("WARNING", "ERROR", "CRITICAL"):
                lines.append(line)
    return sorted(lines, key=lambda line: line.t)


def _log_line(raw: str, source: str, epoch0: float) -> LogLine | None:
    if raw.startswith("{"):
        try:
            record = json.loads(raw)
            when = datetime.datetime.fromisoformat(str(record["ts"]).replace("Z", "+00:00")).timestamp()
            message = str(record.get("msg", ""))
            if "endpoint" in record and str(record["endpoint"]) not in message:
                message += f" {record['endpoint']}"
            return LogLine(when - epoch0, source, str(record.get("level", "")), message)
        except (ValueError, KeyError, TypeError):
            return None
    match = _TEXT_LOG.match(raw)
    if match is None:
        return None
    when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time
    return LogLine(when - epoch0, source, match.group(2), match.group(3))


def _log_kinds(lines: Sequence[LogLine], start: float, end: float, origin: float) -> list[dict[str, Any]]:
    """The phase's log lines by kind (source, level and the message up to its first detail): first seen (seconds
    after ``origin``), last seen, count."""
    kinds: dict[tuple[str, str, str], dict[str, Any]] = {}
    for line in lines:
        if not start <= line.t < end:
            continue
        text = re.sub(r"\(.*", "", line.message).strip()[:90]
        key = (line.source, line.level, text)
        kind = kinds.setdefault(
            key, {"source": line.source, "level": line.level, "message": text, "first_s": line.t - origin, "count": 0}
        )
        kind["count"] += 1
        kind["last_s"] = line.t - origin
    return list(kinds.values())


# -- the fault plan ---------------------------------------------------------------------------------------------


@dataclass
class PhaseLog:
    name: str
    start: float
    end: float = 0.0
    fault_at: float | None = None
    heal_at: float | None = None
    healed_at: float | None = None
    """When the healed part answered again (restart finished), seconds since the run started."""
    target: str = ""
    """What was failed: an engine's IP:port or a component."""
    fault: str = ""
    heal: str = ""


@dataclass
class Plan:
    phase_s: float
    lead_s: float
    down_s: float
    phases: Sequence[str]


def busiest(samples: Sequence[HostSample], engines: Sequence[str], exclude: Sequence[str] = ()) -> str:
    """The engine Envoy sent the most requests to so far (the one whose failure matters most), not in ``exclude``."""
    last = samples[-1].picks if samples else {}
    return max((e for e in engines if e not in exclude), key=lambda e: last.get(e, 0))


async def run_plan(dep: Deployment, plan: Plan, t0: float, samples: list[HostSample]) -> list[PhaseLog]:
    """Run the phases in order. Each engine fault hits the engine with the most traffic so far (the crash first,
    then the hang on another one): an idle engine's failure would show nothing."""
    logs: list[PhaseLog] = []
    hit: list[str] = []

    def crash() -> tuple[str, Callable[[], None], Callable[[], None]]:
        i = dep.engine_index(busiest(samples, dep.endpoint_ids, hit))
        return dep.endpoint_ids[i], lambda: dep.kill_engine(i), lambda: dep.restart_engine(i)

    def hang() -> tuple[str, Callable[[], None], Callable[[], None]]:
        i = dep.engine_index(busiest(samples, dep.endpoint_ids, hit))
        return (
            dep.endpoint_ids[i],
            lambda: dep.fleets[i].fault(0, "hang"),
            lambda: dep.fleets[i].fault(0, "recover"),
        )

    def part(
        name: str, proc: Callable[[], ManagedProcess | None], restart: Callable[[], None]
    ) -> Callable[[], tuple[str, Callable[[], None], Callable[[], None]]]:
        return lambda: (name, lambda: dep.kill(proc()), restart)

    actions: dict[str, tuple[str, str, Callable[[], tuple[str, Callable[[], None], Callable[[], None]]]]] = {
        "engine-crash": ("SIGKILL the engine's process", "start it again on the same ports", crash),
        "engine-hang": ("/sim/fault hang (accepts connections, never answers)", "/sim/fault recover", hang),
        "redis-restart": (
            "SIGKILL redis-server",
            "start it again, empty, on the same port",
            part("redis", lambda: dep.redis, dep.start_redis),
        ),
        "extproc-restart": (
            "SIGKILL cognitora extproc",
            "start it again on the same port",
            part("cognitora extproc", lambda: dep.extproc, dep.start_extproc),
        ),
        "collector-restart": (
            "SIGKILL cognitora collector",
            "start it again",
            part("cognitora collector", lambda: dep.collector, dep.start_collector),
        ),
    }

    def now() -> float:
        return time.perf_counter() - t0

    async def until(t: float) -> None:
        await asyncio.sleep(max(0.0, t - now()))

    for name in plan.phases:
        log = PhaseLog(name=name, start=now())
        end = log.start + plan.phase_s
        logs.append(log)
        action = actions.get(name)
        if action is not None:
            log.fault, log.heal, choose = action
            await until(log.start + plan.lead_s)
            log.target, inject, heal = choose()
            hit.append(log.target)
            log.fault_at = now()
            await asyncio.to_thread(inject)
            await until(log.fault_at + plan.down_s)
            log.heal_at = now()
            await asyncio.to_thread(heal)
            log.healed_at = now()
            end = max(end, log.healed_at + AFTER_HEAL_S)
        await until(end)
        log.end = now()
    return logs


# -- the report ---------------------------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    name: str
    target: str
    fault: str
    heal: str
    sent: int
    served: int
    failed: dict[str, int]
    """Failed requests by what the client saw."""
    client_saw: dict[str, str]
    """One sample body or error per kind of failure."""
    retried: int
    """Served requests Envoy had to send more than once (its pick unreachable, a runner-up answered)."""
    latency_p50_s: float | None
    latency_p99_s: float | None
    cache_hit_rate: float | None
    """Cached over prompt tokens of the served requests (what the engines reported)."""
    fault_at_s: float | None = None
    heal_at_s: float | None = None
    heal_took_s: float | None = None
    """How long the restart itself took (until the part answered)."""
    first_failure_after_fault_s: float | None = None
    last_failure_after_fault_s: float | None = None
    first_success_after_heal_s: float | None = None
    """From the heal command to the first request sent after it that succeeded."""
    target_picks_after_fault: int | None = None
    """Requests Envoy sent (or tried to send) to the failed engine between the fault and the heal."""
    target_last_pick_after_fault_s: float | None = None
    """When the failed engine got its last request before the heal, seconds after the fault."""
    target_first_pick_after_heal_s: float | None = None
    """When the healed engine got a request again, seconds after it answered again."""
    window: dict[str, int] = field(default_factory=dict)
    """Sent / served between the fault and the heal."""
    served_by: dict[str, int] = field(default_factory=dict)
    """Served requests per engine that answered (Envoy's ``x-cognitora-upstream-host``)."""
    logged: list[dict[str, Any]] = field(default_factory=list)
    """Warnings and errors ``cognitora extproc`` and ``cognitora collector`` logged in the phase, by kind, timed
    from the fault (from the phase start when there is none)."""


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def summarize(log: PhaseLog, sent: list[Sent], samples: list[HostSample], lines: Sequence[LogLine]) -> PhaseResult:
    mine = [s for s in sent if log.start <= s.t < log.end]
    failed: dict[str, int] = {}
    saw: dict[str, str] = {}
    for s in mine:
        if not s.ok:
            failed[s.outcome] = failed.get(s.outcome, 0) + 1
            saw.setdefault(s.outcome, s.detail)
    served = [s for s in mine if s.ok]
    prompt = sum(s.prompt_tokens for s in served)
    result = PhaseResult(
        name=log.name,
        target=log.target,
        fault=log.fault,
        heal=log.heal,
        sent=len(mine),
        served=len(served),
        failed=dict(sorted(failed.items())),
        client_saw=saw,
        retried=sum(1 for s in served if s.attempts > 1),
        latency_p50_s=_percentile([s.latency_s for s in served if s.latency_s is not None], 50),
        latency_p99_s=_percentile([s.latency_s for s in served if s.latency_s is not None], 99),
        cache_hit_rate=sum(s.cached_tokens for s in served) / prompt if prompt else None,
    )
    for s in served:
        result.served_by[s.engine or "?"] = result.served_by.get(s.engine or "?", 0) + 1
    result.served_by = dict(sorted(result.served_by.items()))
    result.logged = _log_kinds(lines, log.start, log.end, log.fault_at if log.fault_at is not None else log.start)
    if log.fault_at is None or log.heal_at is None or log.healed_at is None:
        return result
    fault, heal, healed = log.fault_at, log.heal_at, log.healed_at
    result.fault_at_s, result.heal_at_s = fault - log.start, heal - log.start
    result.heal_took_s = healed - heal
    failures = [s.t - fault for s in mine if not s.ok and s.t >= fault]
    if failures:
        result.first_failure_after_fault_s, result.last_failure_after_fault_s = min(failures), max(failures)
    after = [s.t - heal for s in mine if s.ok and s.t >= heal]
    result.first_success_after_heal_s = min(after) if after else None
    during = [s for s in mine if fault <= s.t < heal]
    result.window = {"sent": len(during), "served": sum(1 for s in during if s.ok)}
    if ":" in log.target:
        result.target_picks_after_fault, result.target_last_pick_after_fault_s = _picks(
            samples, log.target, fault, heal
        )
        _, first_after = _first_pick(samples, log.target, healed, log.end)
        result.target_first_pick_after_heal_s = first_after
    return result


def _picks(samples: list[HostSample], host: str, start: float, end: float) -> tuple[int, float | None]:
    """Requests to ``host`` in [start, end), and when the last one was seen (seconds after ``start``)."""
    inside = [s for s in samples if start <= s.t < end and host in s.picks]
    before = [s for s in samples if s.t < start and host in s.picks]
    if not inside:
        return 0, None
    base = before[-1].picks[host] if before else inside[0].picks[host]
    total, last = 0, None
    previous = base
    for s in inside:
        if s.picks[host] > previous:
            last = s.t - start
        previous = max(previous, s.picks[host])
    total = previous - base
    return total, last


def _first_pick(samples: list[HostSample], host: str, start: float, end: float) -> tuple[int, float | None]:
    inside = [s for s in samples if start <= s.t < end and host in s.picks]
    if not inside:
        return 0, None
    base = inside[0].picks[host]
    for s in inside:
        if s.picks[host] > base:
            return s.picks[host] - base, s.t - start
    return 0, None


def _fmt(value: float | None, unit: str = " s") -> str:
    return "—" if value is None else f"{value:.2f}{unit}"


def render_markdown(command: str, settings: dict[str, Any], results: list[PhaseResult]) -> str:
    lines = [
        "# Fault injection under load (Envoy + cognitora extproc over Redis, cognitora collector)",
        "",
        "```",
        command,
        "```",
        "",
        "Machine: {machine} (1-minute load average {load[before]} before, {load[after]} after). Fleet: {engines} "
        "simulated engines (`cognitora sim`, time scale {time_scale:g}); one open-loop client at {rate:g} "
        "requests/s, {client_timeout_s:g} s timeout, a quarter streamed; each phase {phase_s:g} s, fault {lead_s:g} s "
        "in, healed {down_s:g} s later. Requests count in the phase they were sent in. Times in seconds.".format(
            load=settings["load_average_1m"], **settings
        ),
        "",
        "| phase | fault | sent | served | failed (what the client saw) | retried by Envoy | p50 / p99 latency | "
        "cache hit rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        failed = ", ".join(f"{n} x {k}" for k, n in r.failed.items()) or "0"
        hit = "—" if r.cache_hit_rate is None else f"{r.cache_hit_rate:.0%}"
        lines.append(
            f"| {r.name} | {r.fault or '—'} | {r.sent} | {r.served} | {failed} | {r.retried} | "
            f"{_fmt(r.latency_p50_s, '')} / {_fmt(r.latency_p99_s, '')} | {hit} |"
        )
    lines += [
        "",
        "## Recovery",
        "",
        "| phase | failed part | served during the fault | failures sent (after the fault) | restart took | "
        "first success after the heal | engine: requests to it after the fault, last one | engine: first request "
        "after it is back |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.fault_at_s is None:
            continue
        window = f"{r.window.get('served', 0)} of {r.window.get('sent', 0)}"
        if r.first_failure_after_fault_s is None:
            failures = "none"
        else:
            failures = f"+{r.first_failure_after_fault_s:.2f} … +{r.last_failure_after_fault_s:.2f}"
        picks = "—"
        if r.target_picks_after_fault is not None:
            picks = f"{r.target_picks_after_fault}, last at {_fmt(r.target_last_pick_after_fault_s)}"
        lines.append(
            f"| {r.name} | {r.target} | {window} | {failures} | {_fmt(r.heal_took_s)} | "
            f"{_fmt(r.first_success_after_heal_s)} | {picks} | {_fmt(r.target_first_pick_after_heal_s)} |"
        )
    engines: list[str] = settings["endpoints"]
    lines += [
        "",
        "## Served per engine (the engine that answered)",
        "",
        "| phase | " + " | ".join(engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    for r in results:
        lines.append(f"| {r.name} | " + " | ".join(str(r.served_by.get(e, 0)) for e in engines) + " |")
    lines += [
        "",
        "## What the operator saw (warnings and errors logged by `cognitora extproc` and `cognitora collector`)",
        "",
        "Times in seconds after the fault. The message is cut at its first detail.",
        "",
        "| phase | process | level | message | count | first, last |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for k in r.logged:
            lines.append(
                f"| {r.name} | {k['source']} | {k['level']} | {k['message'].replace('|', '/')} | {k['count']} | "
                f"{k['first_s']:+.2f}, {k['last_s']:+.2f} |"
            )
    lines += ["", "## What the client saw", ""]
    for r in results:
        for kind, body in r.client_saw.items():
            lines.append(f"- {r.name}, {kind}: `{body.strip()[:200]}`")
    if not any(r.client_saw for r in results):
        lines.append("- no failure reached a client")
    lines.append("")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.fault_injection", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/results/fault_injection"), help="OUT.md and OUT.json")
    p.add_argument("--engines", type=int, default=4, help="simulated engines (at least 3; default 4)")
    p.add_argument("--rate", type=float, default=8.0, help="requests per second (default 8)")
    p.add_argument("--phase-s", type=float, default=30.0, help="seconds per phase (default 30)")
    p.add_argument("--lead-s", type=float, default=5.0, help="seconds into a phase the fault comes (default 5)")
    p.add_argument("--down-s", type=float, default=12.0, help="seconds the part stays failed (default 12)")
    p.add_argument("--client-timeout-s", type=float, default=10.0, help="client timeout per request (default 10)")
    p.add_argument("--max-requests", type=int, default=2000, help="hard cap on requests sent (default 2000)")
    p.add_argument("--time-scale", type=float, default=1.0, help="sim time scale (default 1: real engine timings)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--workdir", type=Path, default=None, help="logs of every process (default: a temp folder)")
    return p


async def run(args: argparse.Namespace, dep: Deployment) -> tuple[list[PhaseResult], dict[str, Any]]:
    phases = [p for p in args.phases.split(",") if p]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"unknown phases {unknown}; known: {', '.join(PHASES)}")
    plan = Plan(args.phase_s, args.lead_s, args.down_s, phases)
    done = False

    def finished() -> bool:
        return done

    t0, epoch0 = time.perf_counter(), time.time()
    samples: list[HostSample] = []
    sampler = asyncio.create_task(sample_envoy(dep.envoy_admin, finished, t0, samples))
    load = asyncio.create_task(
        open_loop(dep.base_url, args.rate, finished, t0, args.client_timeout_s, args.max_requests, args.seed)
    )
    try:
        logs = await run_plan(dep, plan, t0, samples)
    finally:
        done = True
    sent = await load
    await sampler
    lines = read_logs(dep.workdir, epoch0)
    results = [summarize(log, sent, samples, lines) for log in logs]
    totals = {"sent": len(sent), "served": sum(1 for s in sent if s.ok), "wall_s": time.perf_counter() - t0}
    return results, totals


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "python -m bench.fault_injection " + shlex.join(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cognitora-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    dep = Deployment(workdir, args.engines, args.time_scale)
    load_before = _loadavg()
    try:
        dep.start()
        endpoints = dep.endpoint_ids
        wait_until(lambda: _answers(dep.base_url), 60, "the gateway to serve a first request")
        results, totals = asyncio.run(run(args, dep))
    finally:
        dep.stop()
    settings = {
        "engines": args.engines,
        "rate": args.rate,
        "phase_s": args.phase_s,
        "lead_s": args.lead_s,
        "down_s": args.down_s,
        "client_timeout_s": args.client_timeout_s,
        "time_scale": args.time_scale,
        "machine": f"{platform.machine()}, {_cpus()} CPUs, shared",
        "load_average_1m": {"before": load_before, "after": _loadavg()},
        "workdir": str(workdir),
        "endpoints": endpoints,
    }
    report = {"command": command, "settings": settings, "totals": totals, "phases": [asdict(r) for r in results]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(command, settings, results))
    print(render_markdown(command, settings, results))
    return 0


def _loadavg() -> float | None:
    import os

    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def _answers(base_url: str) -> bool:
    import httpx

    body = _body(random.Random(0), 0, False)
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=10).status_code == 200


if __name__ == "__main__":
    raise SystemExit(main())
