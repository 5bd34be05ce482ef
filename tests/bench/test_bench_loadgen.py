"""The load generator's progress: what a user watching ``make demo`` sees move."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from bench.loadgen import run_load
from bench.workloads import BenchRequest, MessageSpec, Schedule, Segment


async def test_progress_counts_requests_answered_while_they_still_stream() -> None:
    # Each stream sends its first token and then never ends (a long output cut by the run's deadline): a bar of
    # finished requests sat at 0% until the cut. It must reach every request before the cut.
    release = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"delta": {"content": "hello"}}]}\n\n')
        await release.wait()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    user = (MessageSpec("user", (Segment("q", 8),)),)
    requests = [BenchRequest(i, i * 0.01, "s", "chat", user, 100, f"u{i}") for i in range(5)]
    seen: list[tuple[int, float]] = []
    start = time.perf_counter()
    try:
        await run_load(
            f"http://127.0.0.1:{port}",
            Schedule("test", "d", requests),
            "m",
            drain_wall_s=3.0,
            progress=lambda done, total: seen.append((done, time.perf_counter() - start)),
        )
    finally:
        release.set()
        await runner.cleanup()
    # The run cuts the streams 3 s after the last request left; all five were counted as they were answered.
    assert [done for done, _ in seen[:5]] == [1, 2, 3, 4, 5], seen
    assert seen[4][1] < 2.5, seen
