"""bench.flow_bench: the schedule sends each team's and class's headers, and the summary reads what a user sees."""

from __future__ import annotations

from aiohttp import web

from bench.flow_bench import PRIORITY_HEADER, TEAM_HEADER, FlowWorkload, flow_schedule, summarize
from bench.loadgen import run_load


def test_the_schedule_labels_each_stream_and_carries_its_team_and_class() -> None:
    w = FlowWorkload()
    schedule = flow_schedule(w, seed=7)
    teams = {r.stage: dict(r.headers) for r in schedule.requests}
    assert teams["noisy:A"] == {TEAM_HEADER: "A", PRIORITY_HEADER: "default"}
    assert teams["noisy:B"] == {TEAM_HEADER: "B", PRIORITY_HEADER: "default"}
    assert teams["over:batch"][PRIORITY_HEADER] == "batch"
    noisy_a = [r for r in schedule.requests if r.stage == "noisy:A"]
    # A's prompts are long and arrive only during the noisy stage.
    assert {r.prompt_tokens for r in noisy_a} == {w.a_tokens}
    start = w.warmup_s + w.alone_s
    assert all(start <= r.arrival_s < start + w.noisy_s for r in noisy_a)
    assert [s.label for s in schedule.stages if not s.measured] == ["warmup:B"]


def test_summary_ratio_shed_and_goodput() -> None:
    def r(stage: str, status: int, ttft: float | None) -> dict[str, object]:
        return {"stage": stage, "status": status, "error": "" if status == 200 else "x", "ttft_s": ttft}

    raw = [r("alone:B", 200, 0.1)] * 10 + [r("noisy:B", 200, 0.2)] * 10 + [r("noisy:A", 429, None)] * 4
    raw += [r("over:default", 200, 1.0)] * 8 + [r("over:default", 200, 3.0)] * 2 + [r("over:batch", 429, None)] * 5
    out = summarize(raw, FlowWorkload(over_s=10.0))
    assert out["b_ratio"] == 2.0
    assert out["streams"]["noisy:A"]["shed_429"] == 4
    assert out["goodput"] == 0.8  # 8 default requests within 2 s, in 10 s; the shed batch ones count nothing
    assert out["streams"]["over:default"]["ttft_p99"] == 3.0


async def test_loadgen_sends_each_requests_own_headers() -> None:
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get(TEAM_HEADER))
        return web.Response(text="data: [DONE]\n\n", content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        schedule = flow_schedule(FlowWorkload(warmup_s=1, alone_s=1, noisy_s=1, gap_s=0, over_s=1), seed=3)
        port = runner.addresses[0][1]
        await run_load(f"http://127.0.0.1:{port}", schedule, "m", time_scale=10.0, drain_wall_s=10)
    finally:
        await runner.cleanup()
    assert sorted(map(str, seen)) == sorted(dict(r.headers)[TEAM_HEADER] for r in schedule.requests)


def test_a_phase_keeps_that_phases_arrivals_of_the_whole_schedule() -> None:
    w = FlowWorkload()
    whole = flow_schedule(w, seed=7)
    noisy = flow_schedule(w, seed=7, phase="noisy")
    over = flow_schedule(w, seed=7, phase="priority")
    assert [s.label for s in noisy.stages] == ["warmup:B", "alone:B", "noisy:B", "noisy:A"]
    assert [s.label for s in over.stages] == ["over:default", "over:batch"]
    assert [(r.arrival_s, r.stage) for r in noisy.requests] == [
        (r.arrival_s, r.stage) for r in whole.requests if not r.stage.startswith("over:")
    ]
    shift = w.warmup_s + w.alone_s + w.noisy_s + w.gap_s  # the overload starts at once
    assert [(round(r.arrival_s + shift, 9), r.stage) for r in over.requests] == [
        (round(r.arrival_s, 9), r.stage) for r in whole.requests if r.stage.startswith("over:")
    ]
