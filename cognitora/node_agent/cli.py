"""``cognitora node-agent``: serve this node's measured power under the DCGM exporter's names.

    cognitora node-agent [--listen 0.0.0.0:9400] [--source auto|nvml|powermetrics] [--interval-s 1] [--once]

``--source auto`` (the default) is ``powermetrics`` on macOS and ``nvml`` elsewhere. ``--once`` prints one page
to stdout and exits (what to commit from a machine, or to check a node by hand). Exit status 2: a bad option or a
source that cannot be used here (the message says why and what to do); 1: the source died while serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys

from cognitora import jsonlog, sd_notify
from cognitora.metrics.serve import parse_listen
from cognitora.node_agent.exposition import dcgm_page
from cognitora.node_agent.nvml import NvmlSource, NvmlUnavailable
from cognitora.node_agent.powermetrics import PowermetricsSource, PowermetricsUnavailable
from cognitora.node_agent.server import DEFAULT_LISTEN, NodeAgent

__all__ = ["main", "resolve_source"]

log = logging.getLogger("cognitora.node_agent")

SOURCES = ("auto", "nvml", "powermetrics")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cognitora node-agent",
        description="Serve this node's GPU (NVML) or Mac (powermetrics) power under the DCGM exporter's metric names.",
    )
    parser.add_argument(
        "--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve /metrics on (default {DEFAULT_LISTEN})"
    )
    parser.add_argument(
        "--source", choices=SOURCES, default="auto", help="auto: powermetrics on macOS, nvml elsewhere (default auto)"
    )
    parser.add_argument("--interval-s", type=float, default=1.0, help="seconds between two samples (default 1)")
    parser.add_argument("--once", action="store_true", help="print one sample's page to stdout and exit")
    parser.add_argument("--log-level", default="INFO")
    return parser


def resolve_source(name: str, platform: str = sys.platform) -> str:
    if name != "auto":
        return name
    return "powermetrics" if platform == "darwin" else "nvml"


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    jsonlog.configure(args.log_level)
    if args.interval_s <= 0:
        log.error("--interval-s must be positive", extra={"got": args.interval_s})
        return 2
    try:
        parse_listen(args.listen)
    except ValueError as exc:
        log.error(f"--listen {exc}")
        return 2
    source = resolve_source(args.source)
    try:
        if source == "nvml":
            return _run_nvml(args)
        return asyncio.run(_run_powermetrics(args))
    except (NvmlUnavailable, PowermetricsUnavailable) as exc:
        log.error(str(exc))
        return 2


def _run_nvml(args: argparse.Namespace) -> int:
    nvml = NvmlSource()
    nvml.open()
    try:
        if args.once:
            sys.stdout.write(dcgm_page(nvml.read(), socket.gethostname()))
            return 0
        return asyncio.run(_serve(NodeAgent(nvml, args.interval_s), args.listen, None))
    finally:
        nvml.close()


async def _run_powermetrics(args: argparse.Namespace) -> int:
    if sys.platform != "darwin":
        raise PowermetricsUnavailable("--source powermetrics runs only on macOS (use --source nvml for NVIDIA GPUs)")
    if os.geteuid() != 0:
        raise PowermetricsUnavailable(
            "powermetrics needs root: run sudo cognitora node-agent --source powermetrics (the agent drops nothing "
            "else; it only reads powermetrics' output)"
        )
    source = PowermetricsSource(args.interval_s, count=1 if args.once else None)
    await source.start()
    try:
        if args.once:
            await source.exited.wait()
            if source.latest is None:
                return 1
            sys.stdout.write(dcgm_page(source.read(), socket.gethostname()))
            return 0
        return await _serve(NodeAgent(source, args.interval_s), args.listen, source.exited)
    finally:
        await source.stop()


async def _serve(agent: NodeAgent, listen: str, source_died: asyncio.Event | None) -> int:
    """Serve until SIGINT/SIGTERM (0) or until the source's process dies (1)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await agent.start(listen)
    except OSError as exc:
        log.error(f"--listen {listen}: cannot listen: {exc}")
        return 2
    sd_notify.ready(f"serving power on {listen}")  # systemd Type=notify (deploy/systemd/)
    waits = [asyncio.create_task(stop.wait())]
    if source_died is not None:
        waits.append(asyncio.create_task(source_died.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        await agent.stop()
    if source_died is not None and source_died.is_set() and not stop.is_set():
        log.error("the power source stopped; the agent stops with it")
        return 1
    return 0
