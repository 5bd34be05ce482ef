"""``LocalInflight``: what this router dispatched and has not seen finish, kept in its own memory.

The store's in-flight counts are shared by every gateway, but they trail this router's own dispatches by a write,
and they are gone while the store is down. ``cognitora.core.fleet_view`` therefore puts this process's own count
under the store's (a floor), and reads here which of its requests left an engine's queue since that engine's last
scrape (``unqueued``). The lifecycle (``cognitora.core.lifecycle``) writes it: a dispatch, a first token, an end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvstate.store import EndpointSnapshot, InFlight

__all__ = ["LocalInflight", "LocalRequest", "RouterContext"]

_LEFT_QUEUE_KEPT = 256
"""Per endpoint, how many of the latest times this router saw a request leave the engine's queue are kept: more
than an engine's queue holds between two scrapes."""


@dataclass(frozen=True)
class RouterContext:
    """Per endpoint, the context of what this router has in flight (``LocalInflight.context``): ``tokens`` its
    steps read (prompt plus half ``max_tokens`` each), ``kv_tokens`` the KV it adds (the uncached prompt plus half
    ``max_tokens`` each), and of each, ``*since_snapshot`` what was dispatched after the endpoint's snapshot."""

    tokens: dict[str, float] = field(default_factory=dict)
    since_snapshot: dict[str, float] = field(default_factory=dict)
    kv_tokens: dict[str, float] = field(default_factory=dict)
    kv_since_snapshot: dict[str, float] = field(default_factory=dict)


@dataclass
class LocalRequest:
    endpoint: str
    prefill_tokens: int
    decode_tokens: int
    expires: float
    prefill_done: bool = False
    context_tokens: float = 0.0
    """Its prompt plus half its ``max_tokens``: the context its steps read on average over its life."""
    kv_tokens: float = 0.0
    """Its uncached prompt plus half its ``max_tokens``: the KV it adds on average over its life. Its cached prefix
    is shared with the requests that brought it (one copy of the blocks), so counting it per request made 140
    requests of one 2,048-token system prompt read as 340k resident tokens on an engine a third full."""
    dispatched_at: float = 0.0
    seat_since: float | None = None
    """When its first token came back (router clock): from then it holds a seat (``cognitora.seat_tenure``)."""


class LocalInflight:
    """What this router dispatched and has not seen finish: the in-flight floor when the store is behind or down."""

    def __init__(self) -> None:
        self._requests: dict[str, LocalRequest] = {}
        self._left_queue: dict[str, deque[float]] = {}
        """Per endpoint, when this router saw its requests leave the engine's queue (first token, or the end for
        one that never reported a first token), oldest first: what a scrape taken before then still counted as
        waiting (``unqueued``)."""

    def add(self, request_id: str, entry: LocalRequest, now: float) -> None:
        self._prune(now)
        self._requests[request_id] = entry

    def has(self, request_id: str) -> bool:
        return request_id in self._requests

    def prefill_done(self, request_id: str, now: float) -> None:
        entry = self._requests.get(request_id)
        if entry is not None:
            if not entry.prefill_done:
                self._note_left_queue(entry.endpoint, now)
            entry.prefill_done = True
            if entry.seat_since is None:
                entry.seat_since = now

    def seat_since(self, request_id: str) -> float | None:
        entry = self._requests.get(request_id)
        return None if entry is None else entry.seat_since

    def seat_ages(self, endpoints: Sequence[str], now: float) -> dict[str, list[float]]:
        """Seconds since the first token of each request holding a seat, per endpoint of ``endpoints`` with any."""
        ages: dict[str, list[float]] = {}
        for entry in self._requests.values():
            if entry.seat_since is not None and entry.endpoint in endpoints:
                ages.setdefault(entry.endpoint, []).append(now - entry.seat_since)
        return ages

    def release(self, request_id: str, now: float | None = None) -> None:
        """Forget the request; ``now``: when it ended, noted as its leaving the queue if no first token was."""
        entry = self._requests.pop(request_id, None)
        if entry is not None and not entry.prefill_done and now is not None:
            self._note_left_queue(entry.endpoint, now)

    def left_queue_since(self, endpoint: str, since: float) -> int:
        """How many of this router's requests on ``endpoint`` left its queue after ``since``."""
        times = self._left_queue.get(endpoint)
        if not times or times[-1] <= since:
            return 0
        return sum(1 for t in times if t > since)

    def unqueued(self, snapshots: Mapping[str, EndpointSnapshot]) -> Mapping[str, EndpointSnapshot]:
        """``snapshots`` with each ``waiting`` count less the requests this router has seen leave that engine's
        queue since the scrape. A scrape that caught a request between arrival and its first step (a sequential
        agent's previous turn, say) would otherwise stand as a queue, and a bypass queue at that, until the next
        scrape: long enough to move the agent's next turn off the engine holding its cache. Requests leave a
        queue in order, so k of ours starting since the scrape means k fewer still waiting (when none was
        mid-prefill then; the count can only err low for requests other gateways saw start)."""
        out: dict[str, EndpointSnapshot] | None = None
        for endpoint, snap in snapshots.items():
            if snap.waiting <= 0:
                continue
            left = self.left_queue_since(endpoint, snap.last_seen)
            if left:
                out = dict(snapshots) if out is None else out
                out[endpoint] = replace(snap, waiting=max(0, snap.waiting - left))
        return snapshots if out is None else out

    def _note_left_queue(self, endpoint: str, now: float) -> None:
        times = self._left_queue.get(endpoint)
        if times is None:
            times = self._left_queue[endpoint] = deque(maxlen=_LEFT_QUEUE_KEPT)
        times.append(now)

    def totals(self, endpoints: Sequence[str], now: float) -> dict[str, InFlight]:
        """Work per endpoint of ``endpoints`` that has any (the others are absent: usually all of them)."""
        self._prune(now)
        acc: dict[str, list[int]] = {}
        for entry in self._requests.values():
            row = acc.get(entry.endpoint)
            if row is None:
                row = acc[entry.endpoint] = [0, 0, 0]
            row[0] += 1
            row[1] += 0 if entry.prefill_done else entry.prefill_tokens
            row[2] += entry.decode_tokens
        return {e: InFlight(*row) for e, row in acc.items() if e in endpoints}

    def context(self, endpoints: Sequence[str], since: Mapping[str, float]) -> RouterContext:
        """What the requests in flight per endpoint of ``endpoints`` that has any hold, all of them and those
        dispatched after ``since[endpoint]`` (its snapshot's time: what the snapshot cannot show yet)."""
        out = RouterContext()
        for entry in self._requests.values():
            e = entry.endpoint
            if e in endpoints:
                out.tokens[e] = out.tokens.get(e, 0.0) + entry.context_tokens
                out.kv_tokens[e] = out.kv_tokens.get(e, 0.0) + entry.kv_tokens
                if entry.dispatched_at > since.get(e, float("inf")):
                    out.since_snapshot[e] = out.since_snapshot.get(e, 0.0) + entry.context_tokens
                    out.kv_since_snapshot[e] = out.kv_since_snapshot.get(e, 0.0) + entry.kv_tokens
        return out

    def _prune(self, now: float) -> None:
        expired = [rid for rid, entry in self._requests.items() if entry.expires <= now]
        for rid in expired:
            del self._requests[rid]
