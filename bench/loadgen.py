"""Open-loop streaming load generator: sends a Schedule to one base URL and measures every request.

Requests leave at their scheduled times whether or not earlier ones finished (open loop, as inference-perf and
AIPerf's fixed schedule do). Each is a streaming OpenAI request asking for usage in its final chunk. Per request we
record TTFT (first chunk carrying text), mean inter-token latency, end-to-end latency, the usage numbers (prompt,
cached, completion tokens) and the HTTP status or error.

Time: the schedule is in simulated-engine seconds. With a sim time scale X (engine durations divided by X), an
arrival at engine time t is sent at wall time t / X and every measured wall duration is multiplied by X, so all
reported latencies are engine seconds. (Router overhead in wall time is scaled by X too: say so when X < 1.)

The harness measures itself: its own CPU time (one asyncio thread: above ~90% of a core it cannot keep up),
the whole machine's busy share, and how late each request left compared with its schedule. A run where the
harness was saturated is flagged invalid, not silently reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from bench.workloads import BenchRequest, Schedule, TextBank

# Beyond these the harness itself distorts the measurement.
MAX_HARNESS_CPU_SHARE = 0.90
MAX_DISPATCH_LAG_P99_S = 0.25


@dataclass
class RequestResult:
    """One request's outcome. Durations are engine seconds (see the module docstring); None when not reached."""

    index: int
    stage: str
    measured: bool
    arrival_s: float
    status: int = 0
    error: str = ""
    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    content_tokens: int = 0
    reusable_tokens: int = 0
    chunks: int = 0
    dispatch_lag_s: float = 0.0
    censored: bool = False
    """Cut by the end of the run: ``ttft_s`` is then the time waited so far (a lower bound) if no token came."""
    tokens_received: int = 0
    """Output tokens seen in the stream: usage's count when it came, else the streamed words (the sim's output
    tokens are single words with a leading space)."""
    max_tokens: int = 0
    end_s: float | None = None
    """When the request ended or was cut, engine seconds since the start of the run."""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def errored(self) -> bool:
        """Failed for another reason than the run's deadline (an error answer, a reset); a request the deadline cut
        is judged on what had arrived, not counted as an error."""
        return not self.ok and not self.censored


@dataclass
class HarnessHealth:
    wall_s: float
    cpu_s: float
    cpu_share: float
    machine_busy_share: float
    dispatch_lag_p99_s: float
    saturated: bool
    reason: str = ""


@dataclass
class LoadResult:
    results: list[RequestResult]
    time_scale: float
    health: HarnessHealth
    not_sent: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "time_scale": self.time_scale,
            "health": asdict(self.health),
            "not_sent": self.not_sent,
            "results": [asdict(r) for r in self.results],
            **self.extra,
        }


ProgressFn = Callable[[int, int], None]


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat; (0, 0) where unavailable."""
    try:
        with open("/proc/stat") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def _new_result(req: BenchRequest, lag_s: float = 0.0) -> RequestResult:
    return RequestResult(
        index=req.index,
        stage=req.stage,
        measured=req.measured,
        arrival_s=req.arrival_s,
        content_tokens=req.prompt_tokens,
        reusable_tokens=req.reusable_tokens,
        dispatch_lag_s=lag_s,
        max_tokens=req.max_tokens,
    )


class _HopLog:
    """Issue 45's diagnostic (``COGNITORA_BENCH_HOPS``=DIR): stamps each request with an id and its wall-clock send
    time, which bench/litellm_hop_callback.py reads in the proxy, and writes the client's first token to
    ``DIR/client-PID.jsonl``."""

    def __init__(self, path: str) -> None:
        self._out = open(path, "a", buffering=1)  # noqa: SIM115  # closed with the process
        self._run = secrets.token_hex(4)

    @classmethod
    def from_env(cls) -> _HopLog | None:
        where = os.environ.get("COGNITORA_BENCH_HOPS")
        return cls(os.path.join(where, f"client-{os.getpid()}.jsonl")) if where else None

    def stamp(self, i: int) -> dict[str, str]:
        return {"x-bench-id": f"{self._run}-{i}", "x-bench-sent": f"{time.time():.6f}"}

    def first_token(self, headers: Mapping[str, str], ttft_s: float | None) -> None:
        record = {"id": headers.get("x-bench-id"), "sent": float(headers.get("x-bench-sent", "nan"))}
        self._out.write(json.dumps({**record, "first": time.time(), "ttft": ttft_s}) + "\n")


async def _one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    res: RequestResult,
    time_scale: float,
    timeout_s: float,
    answered: Callable[[], None] = lambda: None,
    hops: _HopLog | None = None,
) -> RequestResult:
    """Fill ``res`` as the response streams in (so a run that ends early still sees what arrived). ``answered`` is
    called once: at the first token, or at the end of a request that never got one."""
    start = time.perf_counter()
    first: float | None = None
    last: float | None = None
    try:
        async with session.post(
            url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = (await resp.text())[:300]
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                text = _chunk_text(chunk)
                if text:
                    now = time.perf_counter()
                    if first is None:
                        first = now
                        res.ttft_s = (first - start) * time_scale
                        answered()
                        if hops is not None:
                            hops.first_token(headers, res.ttft_s)
                    last = now
                    res.chunks += 1
                    res.tokens_received += max(1, text.count(" "))
                    if res.tokens_received > 1:
                        res.itl_s = (last - first) / (res.tokens_received - 1) * time_scale
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    res.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    res.cached_tokens = int(details.get("cached_tokens") or 0)
    except TimeoutError:
        res.error = f"timeout after {timeout_s * time_scale:.0f} engine s"
    except (aiohttp.ClientError, json.JSONDecodeError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
    end = time.perf_counter()
    if first is None:
        answered()
        res.error = res.error or "stream ended without any text"
    else:
        if res.completion_tokens == 0:
            res.error = res.error or "stream carried no usage (stream_options.include_usage ignored)"
        if last is not None and res.completion_tokens > 1:
            res.itl_s = (last - first) / (res.completion_tokens - 1) * time_scale
        if res.completion_tokens:
            res.tokens_received = res.completion_tokens
    if not res.error:
        res.e2e_s = (end - start) * time_scale
    return res


def _chunk_text(chunk: Mapping[str, Any]) -> str:
    parts = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        text = (delta.get("content") if delta else None) or choice.get("text")
        if text:
            parts.append(text)
    return "".join(parts)


async def run_load(
    base_url: str,
    schedule: Schedule,
    model: str,
    time_scale: float = 1.0,
    headers: Mapping[str, str] | None = None,
    max_wall_s: float | None = None,
    max_requests: int | None = None,
    request_timeout_s: float = 600.0,
    drain_wall_s: float = 120.0,
    seed: int = 20251130,
    progress: ProgressFn | None = None,
) -> LoadResult:
    """Send ``schedule`` open-loop to ``base_url``; return every request's result and the harness's own health.

    ``request_timeout_s`` is engine seconds; ``max_wall_s`` stops dispatching (the unsent rest is counted as
    ``not_sent``); ``drain_wall_s`` bounds the wait for in-flight requests after the last one left: those still
    running then are cut, counted as failed, and ``censored`` (their TTFT is a lower bound).
    """
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    requests = schedule.requests[:max_requests] if max_requests is not None else list(schedule.requests)
    bank = TextBank(seed)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    base = base_url.rstrip("/")
    paths = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
    timeout_wall = request_timeout_s / time_scale
    hops = _HopLog.from_env()

    done = 0
    total = len(requests)

    def answered() -> None:
        # Requests answered (a first token, or an end without one): with long outputs, few finish before the run
        # ends, and a bar of finished requests sat at 0% until it jumped to 100%.
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    cpu0, busy0 = time.process_time(), _machine_busy()
    wall0 = time.perf_counter()
    tasks: list[asyncio.Task[RequestResult]] = []
    partial: list[RequestResult] = []
    sent_at: list[float] = []
    not_sent = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i, req in enumerate(requests):
            due = req.arrival_s / time_scale
            if max_wall_s is not None and due > max_wall_s:
                not_sent = total - i
                total = i
                break
            delay = due - (time.perf_counter() - wall0)
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(0.0, (time.perf_counter() - wall0) - due)
            body = json.dumps(req.body(bank, model)).encode()
            res = _new_result(req, lag)
            req_hdrs = {**hdrs, **dict(req.headers)} if req.headers else hdrs
            if hops is not None:
                req_hdrs = {**req_hdrs, **hops.stamp(i)}
            sent_at.append(time.perf_counter())
            partial.append(res)
            task = asyncio.create_task(
                _one_request(
                    session,
                    base + paths[req.api],
                    body,
                    req_hdrs,
                    res,
                    time_scale,
                    timeout_wall,
                    answered,
                    hops,
                )
            )
            tasks.append(task)
        results: list[RequestResult] = []
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_wall_s)
            cut = time.perf_counter()
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if progress is not None and done < total:
                progress(total, total)  # the rest were cut unanswered: close the bar
            for t, res, sent in zip(tasks, partial, sent_at, strict=True):
                if res.e2e_s is not None:
                    res.end_s = (sent - wall0) * time_scale + res.e2e_s
                if t in pending:
                    res.end_s = (cut - wall0) * time_scale
                    # Cut by the deadline: waiting so far is a lower bound of its TTFT; it counts as failed.
                    res.censored = True
                    res.error = "not finished when the run ended"
                    if res.ttft_s is None:
                        res.ttft_s = (cut - sent) * time_scale
                elif t.exception() is not None:
                    res.error = res.error or f"harness error: {t.exception()!r}"[:300]
                results.append(res)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    busy1 = _machine_busy()
    machine = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1]) if busy1[1] > busy0[1] else 0.0
    lag_p99 = _percentile([r.dispatch_lag_s for r in results], 99)
    cpu_share = cpu / wall if wall > 0 else 0.0
    reasons = []
    if cpu_share > MAX_HARNESS_CPU_SHARE:
        reasons.append(f"harness used {cpu_share:.0%} of a core (limit {MAX_HARNESS_CPU_SHARE:.0%})")
    if lag_p99 > MAX_DISPATCH_LAG_P99_S:
        reasons.append(f"requests left {lag_p99 * 1000:.0f} ms late at p99 (limit {MAX_DISPATCH_LAG_P99_S * 1000:.0f})")
    health = HarnessHealth(wall, cpu, cpu_share, machine, lag_p99, bool(reasons), "; ".join(reasons))
    return LoadResult(results, time_scale, health, not_sent)
