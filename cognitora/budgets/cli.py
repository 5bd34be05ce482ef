"""``cognitora budgets report|show|reset``: budget usage and limits from the store alone (no gateway running).

cognitora budgets report --config cognitora.yaml [--team T] [--window day|month] [--since DATE] [--format F]
cognitora budgets show   --config cognitora.yaml [--team T] [--format F]      # limits: used, cap, left, reset
cognitora budgets reset  --config cognitora.yaml (--team T | --key K | --user U) --yes
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from zoneinfo import ZoneInfo

from cognitora.budgets.config import BudgetsConfig
from cognitora.budgets.gate import open_ledger
from cognitora.budgets.ledger import BudgetLedger
from cognitora.budgets.plan import escape
from cognitora.budgets.report import days_between, format_report, limit_rows, usage_rows
from cognitora.config import ConfigError, load_config
from cognitora.redaction import redact, redact_url
from kvstate.store import StoreRefused, StoreUnavailable

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cognitora budgets", description="token budget reports and resets")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("report", "usage per team, key, user and model, and what is left of each limit"),
        ("show", "each limit now: used, cap, left, when it resets"),
        ("reset", "zero a team's, key's or user's counters (history is kept)"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--config", required=True, help="cognitora.yaml (its redis_url and budgets section)")
        p.add_argument("--team")
        if name != "reset":
            p.add_argument("--format", choices=("table", "csv", "json"), default="table")
        if name == "report":
            p.add_argument("--window", choices=("day", "month"), default="day", help="one row per day or month")
            p.add_argument("--since", type=dt.date.fromisoformat, help="first day (YYYY-MM-DD); default: the window's")
        if name == "reset":
            p.add_argument("--key")
            p.add_argument("--user")
            p.add_argument("--yes", action="store_true", help="really delete the counters")
    return parser


async def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    budgets = config.budgets
    if budgets is None:
        raise ConfigError(f"{args.config}: has no budgets section")
    if config.redis_url is None:
        raise ConfigError(
            f"{args.config}: no redis_url: budgets are counted in the gateway's own memory, so there is nothing to "
            "read from outside it; set redis_url (the gateways and this command share it)"
        )
    ledger = open_ledger(config.redis_url, config.key_prefix, budgets.history_days, config.redis_cluster)
    try:
        return await _command(ledger, args, budgets)
    except StoreRefused as exc:
        _error(f"{exc} (redis_url {redact_url(config.redis_url)} in {args.config})")
        return 1
    except StoreUnavailable as exc:
        _error(
            f"cannot read the budget store at {redact_url(config.redis_url)} ({exc}); start Redis there, or point "
            f"redis_url in {args.config} at the Redis the gateways use"
        )
        return 1
    finally:
        await ledger.close()


async def _command(ledger: BudgetLedger, args: argparse.Namespace, budgets: BudgetsConfig) -> int:
    if args.command == "reset":
        return await _reset(ledger, args)
    zone = ZoneInfo(budgets.time_zone)
    today = dt.datetime.now(zone).date()
    usage = None
    if args.command == "report":
        since = args.since or (today if args.window == "day" else today.replace(day=1))
        oldest = today - dt.timedelta(days=budgets.history_days)
        usage = await usage_rows(ledger, days_between(max(since, oldest), today), by=args.window, team=args.team)
    seen = sorted({(u.kind, u.subject) for u in usage or ()})
    limits = await limit_rows(ledger, budgets, seen, team=args.team)
    print(format_report(usage, limits, args.format))
    return 0


async def _reset(ledger: BudgetLedger, args: argparse.Namespace) -> int:
    chosen = [(kind, value) for kind, value in (("team", args.team), ("key", args.key), ("user", args.user)) if value]
    if len(chosen) != 1:
        print("cognitora budgets reset: name exactly one of --team, --key, --user", file=sys.stderr)
        return 2
    kind, value = chosen[0]
    if not args.yes:
        print(f"would reset every budget counter of {kind} {value!r}: add --yes to do it", file=sys.stderr)
        return 2
    deleted = await ledger.reset(f"{kind}:{escape(value)}:")
    print(f"reset {kind} {value}: {deleted} counters deleted (usage history kept)")
    return 0


def _error(message: str) -> None:
    """One line on stderr, secrets masked: what went wrong and what to do."""
    print(f"cognitora budgets: {redact(' '.join(message.split()))}", file=sys.stderr)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except ConfigError as exc:
        _error(str(exc))
        return 2
