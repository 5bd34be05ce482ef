"""The doctor's fleet checks: each engine answers its health route and serves the metrics its kind is read by, and
each KV-event stream accepts a subscriber and carries batches that decode.

An idle engine publishes no KV events (vLLM and SGLang publish when their cache changes, and send no heartbeat), so
"nothing arrived in N seconds" is not by itself a failure: the stream check then asks the engine's replay socket,
whose buffer shows whether batches have been published at all. Only a publisher that cannot be reached, or that
sends what does not decode as its engine kind's events, FAILs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from cognitora.collector import event_decoder
from cognitora.config import CognitoraConfig, EndpointConfig
from cognitora.doctor.checks import Check, fail, ok, warn
from kvstate.engines import ENGINES, MetricsParseError, parse_prometheus_text
from kvstate.events.model import EventDecodeError
from kvstate.events.subscriber import END_SEQ, SEQ_BYTES, parse_replay_frames
from kvstate.scrape import base_url

__all__ = ["EndpointEntry", "endpoint_entries", "engine_check", "events_check", "fleet_checks"]


@dataclass(frozen=True)
class EndpointEntry:
    """One engine as configured: its first ``models[i].endpoints[j]`` entry (an engine under several models is
    checked once)."""

    endpoint: EndpointConfig
    where: str


def endpoint_entries(config: CognitoraConfig) -> list[EndpointEntry]:
    seen: dict[str, EndpointEntry] = {}
    for i, model in enumerate(config.models):
        for j, endpoint in enumerate(model.endpoints):
            seen.setdefault(endpoint.id, EndpointEntry(endpoint, f"models[{i}].endpoints[{j}]"))
    return list(seen.values())


# -- engines ------------------------------------------------------------------------------------------------------


async def engine_check(client: httpx.AsyncClient, entry: EndpointEntry) -> list[Check]:
    """The engine's health route, its metrics page (and its power page when one is configured)."""
    endpoint, name = entry.endpoint, f"engine {entry.endpoint.id}"
    spec = ENGINES.get(endpoint.engine.value)
    root = base_url(endpoint.url)
    health_url = root + spec.health_path
    started = time.monotonic()
    try:
        health = await client.get(health_url)
    except httpx.HTTPError as exc:
        return [fail(name, f"GET {health_url}: {_why(exc)}", f"start the engine, or correct {entry.where}.url")]
    took_ms = (time.monotonic() - started) * 1000
    if not spec.healthy_status(health.status_code):
        return [
            fail(
                name,
                f"GET {health_url}: HTTP {health.status_code}: it answers but is not healthy",
                "see the engine's log; placement skips it until its health route answers 2xx",
            )
        ]
    checks = [_metrics_check(name, entry, await _get(client, root + spec.metrics_path) if spec.metrics_path else None)]
    checks[0] = _with_health(checks[0], f"healthy (HTTP {health.status_code} in {took_ms:.0f} ms)")
    if endpoint.power is not None:
        checks.append(await _power_check(client, entry))
    return checks


def _with_health(check: Check, health: str) -> Check:
    return Check(check.status, check.name, f"{health}; {check.detail}", check.fix)


def _metrics_check(name: str, entry: EndpointEntry, page: httpx.Response | str | None) -> Check:
    spec = ENGINES.get(entry.endpoint.engine.value)
    if spec.metrics_path is None:
        return ok(name, f"{spec.kind} serves no /metrics: its load is what the routers count themselves")
    url = base_url(entry.endpoint.url) + spec.metrics_path
    fallback = "placement uses the priors (prefill_tokens_per_s) and the routers' own counts instead of its load"
    if isinstance(page, str):
        return warn(name, f"GET {url}: {page}", f"serve the engine's metrics; until then {fallback}")
    assert page is not None
    if not 200 <= page.status_code < 300:
        return warn(name, f"GET {url}: HTTP {page.status_code}", f"serve the engine's metrics; until then {fallback}")
    try:
        samples = parse_prometheus_text(page.text)
    except MetricsParseError as exc:
        return warn(name, f"{url} is not Prometheus text ({exc})", f"point {entry.where}.url at the engine itself")
    if not spec.recognizes(samples):
        return warn(
            name,
            f"{url} has none of {spec.kind}'s metric names ({len(samples.names())} other names)",
            f"set {entry.where}.engine to the engine's kind; until then {fallback}",
        )
    return ok(name, f"{url} has {spec.kind}'s metric names")


async def _power_check(client: httpx.AsyncClient, entry: EndpointEntry) -> Check:
    power = entry.endpoint.power
    assert power is not None
    name = f"power {entry.endpoint.id}"
    page = await _get(client, power.url)
    fix = f"start the node agent or dcgm-exporter there, or correct {entry.where}.power.url"
    if isinstance(page, str):
        return warn(name, f"GET {power.url}: {page}", fix)
    if not 200 <= page.status_code < 300:
        return warn(name, f"GET {power.url}: HTTP {page.status_code}", fix)
    try:
        names = parse_prometheus_text(page.text).names()
    except MetricsParseError as exc:
        return warn(name, f"{power.url} is not Prometheus text ({exc})", fix)
    if "DCGM_FI_DEV_POWER_USAGE" not in names:
        return warn(name, f"{power.url} has no DCGM_FI_DEV_POWER_USAGE", fix)
    return ok(name, f"{power.url} serves DCGM power")


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response | str:
    """The response, or why there is none."""
    try:
        return await client.get(url)
    except httpx.HTTPError as exc:
        return _why(exc)


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


# -- KV event streams ---------------------------------------------------------------------------------------------

_MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED


async def events_check(ctx: zmq.asyncio.Context, entry: EndpointEntry, wait_s: float) -> Check | None:
    """Subscribe to the engine's KV events for up to ``wait_s``; None when it has no ``kv_events``."""
    endpoint = entry.endpoint
    if endpoint.kv_events is None:
        return None
    name = f"kv events {endpoint.id}"
    address = endpoint.kv_events
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    monitor = sub.get_monitor_socket(_MONITORED)
    connected = handshake = False
    first: list[bytes] | None = None
    try:
        sub.connect(address)
        deadline = time.monotonic() + wait_s
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while first is None and (left := deadline - time.monotonic()) > 0:
            ready = dict(await poller.poll(timeout=left * 1000))
            if monitor in ready:
                event = parse_monitor_message(await monitor.recv_multipart())["event"]
                connected = True
                handshake = handshake or event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if sub in ready:
                first = await sub.recv_multipart()
    finally:
        sub.disable_monitor()
        monitor.close(linger=0)
        sub.close(linger=0)
    if first is not None:
        return _first_batch(name, entry, first, wait_s)
    if not connected:
        return fail(
            name,
            f"nothing accepted a connection at {address} within {wait_s:g} s",
            f"start the engine with KV events published there (vLLM --kv-events-config), or correct "
            f"{entry.where}.kv_events; until then it is placed on routing history only",
        )
    if not handshake:
        return fail(
            name,
            f"something listens at {address} but does not speak ZMQ (an HTTP port?)",
            f"set {entry.where}.kv_events to the engine's KV-event PUB address",
        )
    return await _idle_stream(ctx, name, entry, wait_s)


def _first_batch(name: str, entry: EndpointEntry, frames: list[bytes], wait_s: float) -> Check:
    kind = entry.endpoint.engine.value
    if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
        return fail(
            name,
            f"what arrived ({len(frames)} frames) is not a KV-event batch [topic, seq, payload]",
            f"set {entry.where}.kv_events to the engine's KV-event PUB address (not its HTTP port)",
        )
    try:
        batch = event_decoder(entry.endpoint.engine)(frames[2])
    except EventDecodeError as exc:
        return fail(
            name,
            f"a batch arrived that does not decode as {kind}'s KV events ({exc})",
            f"set {entry.where}.engine to the engine's kind",
        )
    seq = int.from_bytes(frames[1], "big")
    return ok(name, f"flowing: a batch (seq {seq}, {len(batch.events)} events) arrived within {wait_s:g} s")


async def _idle_stream(ctx: zmq.asyncio.Context, name: str, entry: EndpointEntry, wait_s: float) -> Check:
    """Connected, nothing arrived: ask the replay socket what the engine has published."""
    address = entry.endpoint.kv_events
    idle = f"subscribed to {address}; no batch arrived in {wait_s:g} s (an idle engine publishes nothing)"
    again = "send the engine one request and run `cognitora doctor` again"
    replay = entry.endpoint.kv_events_replay
    if replay is None:
        return warn(name, idle, again)
    buffered = await _replay_from_zero(ctx, replay, wait_s)
    if buffered is None:
        return warn(
            name,
            f"{idle}; the replay socket {replay} did not answer",
            f"correct {entry.where}.kv_events_replay (vLLM's replay_endpoint): without it a gap purges the "
            "engine's cached prefixes instead of replaying them",
        )
    if not buffered:
        return warn(name, f"{idle}; its replay buffer is empty: nothing published yet", again)
    return ok(name, f"{idle}; its replay buffer holds {len(buffered)} batches up to seq {max(buffered)}")


async def _replay_from_zero(ctx: zmq.asyncio.Context, address: str, wait_s: float) -> list[int] | None:
    """The sequence numbers the replay socket holds, or None when it does not answer within ``wait_s``."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    seqs: list[int] = []
    try:
        dealer.connect(address)
        await dealer.send_multipart([b"", (0).to_bytes(SEQ_BYTES, "big")])
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            if not await dealer.poll(left * 1000):
                return None
            reply = parse_replay_frames(await dealer.recv_multipart())
            if reply is None:
                continue
            if reply[0] == END_SEQ:
                return seqs
            seqs.append(int.from_bytes(reply[0], "big"))
        return None
    finally:
        dealer.close(linger=0)


async def fleet_checks(config: CognitoraConfig, timeout_s: float, events_wait_s: float) -> list[Check]:
    """Every engine and every KV-event stream, concurrently; in config order."""
    entries = endpoint_entries(config)
    ctx = zmq.asyncio.Context()
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            engines, events = await asyncio.gather(
                asyncio.gather(*(engine_check(client, e) for e in entries)),
                asyncio.gather(*(events_check(ctx, e, events_wait_s) for e in entries)),
            )
    finally:
        ctx.term()
    checks: list[Check] = []
    for engine, stream in zip(engines, events, strict=True):
        checks += engine
        if stream is not None:
            checks.append(stream)
    return checks
