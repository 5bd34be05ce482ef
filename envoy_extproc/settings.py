"""``cognitora extproc`` settings: the command line, parsed once at the entry point into a frozen dataclass.

The settings are flags, not a section of ``cognitora.yaml``: they describe how this Envoy deployment talks to the
service (which headers its auth filter sets, where to listen), which differs per gateway, while ``cognitora.yaml``
describes the fleet and is shared with the LiteLLM adapter and the collector.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from cognitora.metrics.serve import parse_listen
from cognitora.ops.drain import DrainBounds
from envoy_extproc import headers

__all__ = ["ExtprocSettings", "TrustedHeaders", "parse_settings"]

DEFAULT_LISTEN = "127.0.0.1:9002"
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
"""Above Envoy's buffer limit in ``examples/envoy.yaml`` (16 MiB), so Envoy's 413 is what a client sees, never a
gRPC "message too large" turned into a 500 (grpcio's own default is 4 MiB)."""


@dataclass(frozen=True)
class TrustedHeaders:
    """Request headers that carry identity. Only the operator's auth filter may set them; Envoy strips client copies.

    An empty name turns that identity off (the request gets none).
    """

    team: str = headers.DEFAULT_TEAM_HEADER
    key: str = headers.DEFAULT_KEY_HEADER
    priority: str = headers.DEFAULT_PRIORITY_HEADER
    user: str = headers.DEFAULT_USER_HEADER
    intent: str = headers.DEFAULT_INTENT_HEADER

    @cached_property
    def names(self) -> frozenset[str]:
        """The header names to read (the ones turned on)."""
        return frozenset({self.team, self.key, self.priority, self.user, self.intent} - {""})


@dataclass(frozen=True)
class ExtprocSettings:
    config_path: Path
    listen: str = DEFAULT_LISTEN
    trusted: TrustedHeaders = TrustedHeaders()
    usage: str = "all"
    """Which responses have their body read: ``all`` (usage and achieved cache hits for every request), ``streamed``
    (only SSE, where the end of the stream is otherwise unknown), ``none`` (headers only: cheapest)."""
    fallbacks: int = 2
    """Ranked runner-ups sent after the pick, for Envoy to retry on when the pick cannot be reached."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    collector: bool = False
    """Run the collector (KV events and /metrics into the store) inside this process: one-gateway deployments."""
    without_collector: bool = False
    """Start with the in-process store and no collector on purpose (nothing feeds the fleet's state: placement
    rests on this process's own routing history and in-flight counts). Refused otherwise: see ``server._run``."""
    placed_paths: tuple[str, ...] = tuple(sorted(headers.PLACED_PATHS))
    """Request paths that are placed, each also under any route prefix; every other request passes through."""
    workers: int = 1
    """Service processes sharing the listen port (SO_REUSEPORT): one Python process tops out at one core."""
    reuse_port: bool = False
    """Bind with SO_REUSEPORT (set for the worker processes of ``--workers``; never for a single process, so that
    a second instance started by mistake fails instead of silently taking half the streams)."""
    log_level: str = "info"
    metrics_listen: str | None = None
    """``HOST:PORT`` of the metrics page (docs/metrics.md); None: no page. With ``workers`` > 1 the supervisor
    serves it, merged from the workers' pages."""
    metrics_socket: str | None = None
    """Set by the ``--workers`` supervisor: the unix socket this worker serves its own page on."""
    drain: DrainBounds = field(default_factory=DrainBounds)
    """SIGTERM: how long to wait for Envoy's health check to see NOT_SERVING, and for open streams to finish."""
    watch_config_s: float = 2.0
    """Seconds between two looks at the config file's modification time (a change reloads it, as SIGHUP does);
    0: SIGHUP only."""

    def placed(self, path: str) -> bool:
        """Whether a request to ``path`` (no query string) is placed: it is a placed path, or ends with one after a
        route prefix (``/api/v1/chat/completions``). Each placed path starts with ``/``, so a match is always at a
        path segment boundary (``/v1/chat/completions`` never matches ``/xv1/chat/completions``)."""
        return path.endswith(self.placed_paths)


USAGE_MODES = ("all", "streamed", "none")


def check_placed_path(path: str) -> str:
    """A ``--placed-path`` value, or ``ValueError`` saying what is wrong with it."""
    if not path.startswith("/") or "?" in path:
        raise ValueError(f"{path!r} must be a URL path starting with '/', without a query string")
    if not path.endswith(headers.SURFACE_SUFFIXES):
        raise ValueError(
            f"{path!r} must end with one of {', '.join(headers.SURFACE_SUFFIXES)}: the body's surface (chat, "
            "completions, Anthropic Messages, Responses, embeddings) is read from the path"
        )
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cognitora extproc",
        description="Envoy ext_proc service: places each OpenAI request on an engine of the fleet (docs/envoy.md).",
    )
    p.add_argument("--config", required=True, type=Path, help="cognitora.yaml (models, endpoints, Redis)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help=f"gRPC address to serve on (default {DEFAULT_LISTEN})")
    p.add_argument(
        "--trusted-team-header",
        default=headers.DEFAULT_TEAM_HEADER,
        help=f"header your auth filter sets to the caller's team (default {headers.DEFAULT_TEAM_HEADER}; '' = off)",
    )
    p.add_argument(
        "--trusted-key-header",
        default=headers.DEFAULT_KEY_HEADER,
        help=f"header carrying the authenticated API key id (default {headers.DEFAULT_KEY_HEADER}; '' = off)",
    )
    p.add_argument(
        "--trusted-priority-header",
        default=headers.DEFAULT_PRIORITY_HEADER,
        help=f"header carrying the priority class (default {headers.DEFAULT_PRIORITY_HEADER}; '' = off)",
    )
    p.add_argument(
        "--trusted-user-header",
        default=headers.DEFAULT_USER_HEADER,
        help=f"header carrying the end user id (default {headers.DEFAULT_USER_HEADER}; '' = off)",
    )
    p.add_argument(
        "--trusted-intent-header",
        default=headers.DEFAULT_INTENT_HEADER,
        help=f"header carrying an intent hint for intent rules (default {headers.DEFAULT_INTENT_HEADER}; '' = off)",
    )
    p.add_argument(
        "--usage",
        choices=USAGE_MODES,
        default="all",
        help="which response bodies to read for token usage and cache hits (default all; see docs/envoy.md)",
    )
    p.add_argument(
        "--fallbacks",
        type=int,
        default=2,
        help="runner-up endpoints handed to Envoy for retries when the pick is unreachable (default 2)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest gRPC message accepted; keep it above Envoy's buffer limit (default 64 MiB)",
    )
    p.add_argument(
        "--collector",
        action="store_true",
        help="also run the collector in this process (one gateway; otherwise run `cognitora collector` once)",
    )
    p.add_argument(
        "--without-collector",
        action="store_true",
        help="start with the in-process store and no collector anyway (nothing feeds engine state; placement from "
        "this process's own history only: for measurements). Without Redis, --collector is otherwise required",
    )
    p.add_argument(
        "--placed-path",
        action="append",
        metavar="PATH",
        help="a request path to place, also under any prefix (repeat for several; replaces the defaults "
        f"{', '.join(sorted(headers.PLACED_PATHS))}); it must end with one of "
        f"{', '.join(headers.SURFACE_SUFFIXES)}",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="service processes sharing --listen (SO_REUSEPORT); needs a shared store (redis_url), not --collector "
        "(default 1; see docs/envoy.md, Cost)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, CORS open (default: none; docs/metrics.md)",
    )
    p.add_argument(
        "--drain-timeout-s",
        type=float,
        default=DrainBounds().grace_s,
        help="at SIGTERM, how long open streams may take to finish before they are cut (default "
        f"{DrainBounds().grace_s:g}; docs/operations.md)",
    )
    p.add_argument(
        "--drain-announce-s",
        type=float,
        default=DrainBounds().announce_s,
        help="at SIGTERM, longest wait for a health checker to read NOT_SERVING before refusing new streams "
        f"(default {DrainBounds().announce_s:g})",
    )
    p.add_argument(
        "--watch-config-s",
        type=float,
        default=2.0,
        help="seconds between looks at the config file; a change reloads it like SIGHUP (default 2; 0 = off)",
    )
    return p


def parse_settings(argv: list[str]) -> ExtprocSettings:
    args = build_parser().parse_args(argv)
    if args.fallbacks < 0:
        raise SystemExit("cognitora extproc: --fallbacks must be 0 or more")
    if args.workers < 1:
        raise SystemExit("cognitora extproc: --workers must be 1 or more")
    if args.workers > 1 and args.collector:
        # Each worker would run its own collector: every event and scrape ingested N times.
        raise SystemExit(
            "cognitora extproc: --collector runs in one process only; with --workers run `cognitora collector`"
        )
    if args.collector and args.without_collector:
        raise SystemExit("cognitora extproc: --collector and --without-collector contradict each other; pick one")
    if args.metrics_listen is not None:
        try:
            parse_listen(args.metrics_listen)
        except ValueError as exc:
            raise SystemExit(f"cognitora extproc: --metrics-listen {exc}") from None
    if args.drain_timeout_s < 0 or args.drain_announce_s < 0 or args.watch_config_s < 0:
        raise SystemExit("cognitora extproc: --drain-timeout-s, --drain-announce-s and --watch-config-s are >= 0")
    placed_paths = tuple(sorted(headers.PLACED_PATHS))
    if args.placed_path:
        try:
            placed_paths = tuple(dict.fromkeys(check_placed_path(path) for path in args.placed_path))
        except ValueError as exc:
            raise SystemExit(f"cognitora extproc: --placed-path {exc}") from None
    return ExtprocSettings(
        config_path=args.config,
        listen=args.listen,
        trusted=TrustedHeaders(
            team=args.trusted_team_header.lower(),
            key=args.trusted_key_header.lower(),
            priority=args.trusted_priority_header.lower(),
            user=args.trusted_user_header.lower(),
            intent=args.trusted_intent_header.lower(),
        ),
        usage=args.usage,
        fallbacks=args.fallbacks,
        max_message_bytes=args.max_message_bytes,
        collector=args.collector,
        without_collector=args.without_collector,
        placed_paths=placed_paths,
        workers=args.workers,
        log_level=args.log_level,
        metrics_listen=args.metrics_listen,
        drain=DrainBounds(announce_s=args.drain_announce_s, grace_s=args.drain_timeout_s),
        watch_config_s=args.watch_config_s,
    )
