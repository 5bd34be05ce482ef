"""Reloading ``cognitora.yaml`` without a restart: SIGHUP, or a change of the file seen by ``ConfigWatch``.

What can change live is everything the Router is built from: models and their endpoints, placement (priorities,
weights), cost model, limits, budgets, burst, intent, disaggregation. A reload builds a whole new Router from the
new file over the SAME store, and new requests are placed by it; requests already admitted finish on the Router that
admitted them (their attempts hold it), which is retired once none is open (an attempt no gateway reported the end
of is abandoned after ``placement.inflight_ttl_s``, as on the Router in force). Validation comes first: the file
must load (``cognitora.config``), its tokenizers and chat templates must load, and the adapter's own check must pass
(Envoy: every endpoint's host resolves); on any error the config in force stays, and the log says why.

A model whose keyer settings and files (tokenizer, chat template) are unchanged keeps its keyer: the new Router
shares it with the old (``cognitora.preflight.prompt_keyers``). A reload then allocates no tokenizer, whose native
memory the allocator kept after the old one was freed (the LiteLLM proxy's RSS grew ~40 MiB a reload:
docs/operations.md, "Soak"). Retiring the old Router stops what it alone owns: its keying thread, its pending
store writes; never the store, the keyers or the flow-control leases, which the new Router holds too.

What needs a restart, and is refused with that said: the store itself (``redis_url``, ``key_prefix``,
``redis_cluster``): the process holds its connections, and its in-flight counts live there.

Counts that live in the process are carried to the new Router, never reset: the in-process budgets ledger (without
Redis), the in-process cloud spend, the decision and attempt counters behind the metrics page (while the model
names and priorities are unchanged; otherwise the metrics' counters restart, and the log says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cognitora.config import CognitoraConfig, ConfigError, load_config
from cognitora.preflight import prompt_keyers

if TYPE_CHECKING:
    from cognitora.core.attempt import Attempt
    from cognitora.core.router import Router
    from cognitora.decision import Decision
    from cognitora.request import RouteRequest

__all__ = [
    "Commit",
    "ConfigSource",
    "ConfigWatch",
    "LiveRouter",
    "Prepare",
    "ReloadOutcome",
    "Reloadable",
    "log_outcome",
]

log = logging.getLogger("cognitora.ops.reload")

RESTART_ONLY = ("redis_url", "key_prefix", "redis_cluster")
"""Top-level keys a reload refuses to change: the store the process holds open."""

Commit = Callable[[], Awaitable[None]]
Prepare = Callable[[CognitoraConfig], Awaitable[Commit]]
"""An adapter's part of a reload: check the new config (raise ``ConfigError`` to refuse it), and return what to do
once the new Router is in force (Envoy: the new engine addresses; embedded mode: the collector on the new list)."""


@dataclass(frozen=True)
class ConfigSource:
    """Where the config comes from: the file watched (``path``) and how to read the whole config (``load``,
    raising ``ConfigError``). ``cognitora extproc``: the file itself; the LiteLLM plugin: the proxy's deployments
    with the ``routing_strategy_args.config`` file over them."""

    path: Path
    load: Callable[[], CognitoraConfig]

    @classmethod
    def file(cls, path: Path) -> ConfigSource:
        return cls(Path(path), lambda: load_config(path))


@dataclass(frozen=True)
class ReloadOutcome:
    ok: bool
    reason: str
    """Why it was refused, or what changed (the top-level sections)."""
    changed: tuple[str, ...] = ()


def changed_sections(old: CognitoraConfig, new: CognitoraConfig) -> tuple[str, ...]:
    """Top-level keys whose value differs (secrets compared, never shown)."""
    before, after = old.model_dump(), new.model_dump()
    return tuple(sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)))


def restart_only(old: CognitoraConfig, new: CognitoraConfig) -> list[str]:
    return [key for key in RESTART_ONLY if getattr(old, key) != getattr(new, key)]


def log_outcome(logger: logging.Logger, why: str, outcome: ReloadOutcome, source: ConfigSource) -> None:
    """The one line an operator reads of a reload, the same for every live object (router, collector)."""
    if outcome.ok:
        logger.info("config reloaded (%s): %s", why, outcome.reason, extra={"changed": list(outcome.changed)})
    else:
        logger.error(
            "config reload refused (%s): %s; keeping the config in force",
            why,
            outcome.reason,
            extra={"config": str(source.path)},
        )


class LiveRouter:
    """The Router new requests are placed by (``current``), swapped whole on ``reload``. It answers ``admit`` (the
    adapters' ``PlacementCore``), ``attempt`` and ``open_attempts`` over every Router not yet retired, and anything
    else (``telemetry``, ``stats``, ``store``, ``budgets``) from ``current``."""

    def __init__(self, router: Router, source: ConfigSource, prepare: Prepare | None = None) -> None:
        self.current = router
        self.source = source
        self.prepare = prepare
        """The adapter's check and commit (``Prepare``); settable after construction."""
        self._retiring: list[Router] = []
        self._lock = asyncio.Lock()
        self.reloads = 0
        """Reloads that took effect."""
        self.refused = 0
        """Reloads refused (the config in force stayed)."""
        self.last_outcome: ReloadOutcome | None = None

    # -- what the adapters call ----------------------------------------------------------------------------------
    async def admit(
        self,
        request: RouteRequest,
        *,
        group: str | None = None,
        on_wait: Callable[[float], Awaitable[None]] | None = None,
    ) -> tuple[Decision, Attempt | None]:
        return await self.current.admit(request, group=group, on_wait=on_wait)

    def attempt(self, request_id: str) -> Attempt | None:
        for router in (self.current, *self._retiring):
            found = router.attempt(request_id)
            if found is not None:
                return found
        return None

    def open_attempts(self) -> list[Attempt]:
        return [a for router in (self.current, *self._retiring) for a in router.open_attempts()]

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks: the metrics page and the adapters read the Router in force.
        return getattr(self.current, name)

    async def close(self) -> None:
        for router in self._retiring:
            await _retire(router)
        self._retiring.clear()
        await self.current.close()

    # -- reloading -----------------------------------------------------------------------------------------------
    async def reload(self, why: str = "SIGHUP") -> ReloadOutcome:
        """Validate the source's config and, if it passes, put a Router built from it in force. Never raises: a refused
        reload is logged (with the reason) and counted, and the config in force stays."""
        async with self._lock:
            outcome = await self._reload()
            self.last_outcome = outcome
            if outcome.ok:
                self.reloads += 1
            else:
                self.refused += 1
            log_outcome(log, why, outcome, self.source)
            self._retire_idle()
            return outcome

    async def _reload(self) -> ReloadOutcome:
        from cognitora.core.router import Router

        old = self.current
        try:
            config = await asyncio.to_thread(self.source.load)
            fixed = restart_only(old.config, config)
            if fixed:
                return ReloadOutcome(False, f"{', '.join(fixed)} changed: the store cannot change live; restart")
            changed = changed_sections(old.config, config)
            if not changed:
                return ReloadOutcome(True, "nothing changed")
            # Tokenizers and chat templates: seconds, off-loop; an unchanged model's keyer is the one in force.
            keyers = await asyncio.to_thread(prompt_keyers, config, old.keying.keyers)
            commit = None if self.prepare is None else await self.prepare(config)
            new = Router(config, old.store, keyers=keyers, counts=old)
        except ConfigError as exc:
            return ReloadOutcome(False, f"{self.source.path}: {exc}")
        except Exception as exc:  # a bug in a check must not take the service down: the old config stays
            log.exception("config reload failed")
            return ReloadOutcome(False, f"{self.source.path}: {type(exc).__name__}: {exc}")
        _carry_counts(old, new)
        self.current = new
        self._retiring.append(old)
        if commit is not None:
            await commit()
        return ReloadOutcome(True, "changed: " + ", ".join(changed), changed)

    def _retire_idle(self) -> None:
        for router in self._retiring:
            router.expire_attempts()  # a Router replaced dispatches nothing: its stale attempts expire here
        for router in [r for r in self._retiring if not r.open_attempts()]:
            self._retiring.remove(router)
            task = asyncio.ensure_future(_retire(router, self.current))
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def retire_idle(self) -> None:
        """Retire the Routers whose last request has finished (``ConfigWatch`` calls it on each look)."""
        self._retire_idle()


async def _retire(router: Router, current: Router | None = None) -> None:
    """What ``Router.close`` does but close what the Router in force shares: the store, the keyers (the keying
    thread is the old Router's own), the flow-control leases (carried over). A ledger on the store's own client, or
    in process, is left open by ``BudgetGate.close`` (it closes only a connection pool it opened)."""
    router.keying.close(drop_queued=False)
    await router.lifecycle.close()  # its attempts' store writes land
    try:
        if router.budgets is not None:
            await router.budgets.close()
    except Exception as exc:
        log.warning("retiring the previous config's budget gate: %s", exc)
    if router.intent is not None and (current is None or current.intent is not router.intent):
        router.intent.close()


def _carry_counts(old: Router, new: Router) -> None:
    """Counts kept in the process move to the new Router (see the module's docstring); the decision counters and
    the token agreement moved when it was built (``Router(counts=old)``)."""
    if old.budgets is not None and new.budgets is not None and old.config.redis_url is None:
        new.budgets.ledger = old.budgets.ledger  # the in-process ledger: budgets must not restart at a reload
    new.burst.ledger.rows = old.burst.ledger.rows  # the in-process cloud spend (without budgets)
    if new.telemetry is not old.telemetry:
        log.warning("reload changed the model names or priorities: the decision counters on /metrics restart")


class Reloadable(Protocol):
    """What ``ConfigWatch`` drives: a ``LiveRouter`` (extproc, the LiteLLM plugin) or a ``LiveCollector``."""

    @property
    def source(self) -> ConfigSource: ...

    async def reload(self, why: str = "SIGHUP") -> ReloadOutcome: ...

    async def retire_idle(self) -> None: ...


class ConfigWatch:
    """Looks at the config file every ``interval_s``; a new modification time, size or inode reloads it. Editors
    that save by renaming a new file over the old one change the inode, hence the inode too."""

    def __init__(self, live: Reloadable, interval_s: float) -> None:
        self._live = live
        self._interval_s = interval_s
        self._seen = _fingerprint(live.source.path)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._watch(), name="cognitora-config-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            now = _fingerprint(self._live.source.path)
            if now != self._seen:
                self._seen = now
                await self._live.reload("the config file changed")
            else:
                await self._live.retire_idle()


def _fingerprint(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
