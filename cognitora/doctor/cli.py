"""``cognitora doctor``: check this host's Cognitora setup; one line per check, exit status 1 when any FAILs.

    cognitora doctor [--config /etc/cognitora/cognitora.yaml] [--events-wait-s 3] [--timeout-s 2] [--format text]

Checks, in order: the config (it loads, each model's tokenizer and chat template compile, every engine's host
resolves and no engine is listed twice); Redis (answers, persists, and this host's clock against its ``TIME``);
the kernel's clock synchronization; a collector's heartbeat; every engine (health route, metrics page, power page);
every KV-event stream. A config that does not load stops there: nothing else can be checked without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from cognitora.config import CognitoraConfig, ConfigError, load_config
from cognitora.doctor.checks import Check, Status, fail, ok
from cognitora.doctor.fleet import fleet_checks
from cognitora.doctor.store import clock_sync_check, collector_check, redis_checks
from cognitora.preflight import prompt_keyers, resolve_engines, unresolved_problems

__all__ = ["main"]

DEFAULT_CONFIG = "/etc/cognitora/cognitora.yaml"
"""Where ``deploy/install.sh`` puts the starter config and the systemd units read it."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cognitora doctor",
        description="Check this host's Cognitora setup: config, Redis, clocks, collector, engines, KV events. "
        "One line per check (OK, WARN, FAIL) with what to do; exit status 1 when any check FAILs.",
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"cognitora.yaml (default {DEFAULT_CONFIG})")
    parser.add_argument(
        "--events-wait-s",
        type=float,
        default=3.0,
        help="how long to listen to each KV-event stream for a batch (default 3)",
    )
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per HTTP or Redis request (default 2)")
    parser.add_argument("--format", choices=["text", "json"], default="text", help="json: one object per line")
    return parser


def config_checks(path: Path) -> tuple[CognitoraConfig | None, list[Check]]:
    """The config loaded (None when it does not), and what was found."""
    fix = "fix the key the message names (docs/config.md has every key)"
    if not path.exists():
        return None, [
            fail(
                "config",
                f"{path} does not exist",
                "write one: deploy/install.sh puts a starter at /etc/cognitora/cognitora.yaml; examples/cognitora.yaml "
                "is a commented one",
            )
        ]
    try:
        config = load_config(path)
        keyers = prompt_keyers(config)  # each model's tokenizer and chat template, loaded and compiled
        engines = resolve_engines(config)  # an engine listed twice under two spellings
    except ConfigError as exc:
        return None, [fail("config", str(exc), fix)]
    checks = [ok("config", _summary(path, config, [name for name, k in keyers.items() if k.tokenizer is None]))]
    checks += [fail("dns", problem, "fix the name (or its DNS), or write the engine's IP address in the url")
               for problem in unresolved_problems(engines)]  # fmt: skip
    return config, checks


def _summary(path: Path, config: CognitoraConfig, approximate: list[str]) -> str:
    endpoints = {e.id for m in config.models for e in m.endpoints}
    store = "Redis Cluster" if config.redis_cluster else "Redis" if config.redis_url else "in-process store"
    text = f"{path} loads: {len(config.models)} model(s), {len(endpoints)} engine(s), {store}"
    if approximate:
        text += f"; text-approximate keys for {', '.join(approximate)} (no tokenizer)"
    return text


async def run_checks(path: Path, timeout_s: float, events_wait_s: float) -> list[Check]:
    """Every check, in report order."""
    config, checks = config_checks(path)
    if config is None:
        return checks
    checks += await asyncio.to_thread(redis_checks, config, timeout_s)
    checks.append(clock_sync_check())
    redis_up = all(c.status is not Status.FAIL for c in checks if c.name == "redis")
    collector = await collector_check(config) if redis_up else None
    if collector is not None:
        checks.append(collector)
    checks += await fleet_checks(config, timeout_s, events_wait_s)
    return checks


def report(checks: list[Check], fmt: str) -> str:
    if fmt == "json":
        return "\n".join(json.dumps(c.as_dict()) for c in checks)
    width = max(len(c.name) for c in checks)
    lines = [c.line(width) for c in checks]
    counts = {s: sum(c.status is s for c in checks) for s in Status}
    lines.append(f"{counts[Status.OK]} OK, {counts[Status.WARN]} WARN, {counts[Status.FAIL]} FAIL")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.events_wait_s <= 0 or args.timeout_s <= 0:
        print("cognitora doctor: --events-wait-s and --timeout-s must be positive", file=sys.stderr)
        return 2
    checks = asyncio.run(run_checks(Path(args.config), args.timeout_s, args.events_wait_s))
    print(report(checks, args.format), flush=True)
    return 1 if any(c.status is Status.FAIL for c in checks) else 0
