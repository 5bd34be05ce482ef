"""bench.flow_bench: the schedule sends each team's and class's headers, and the summary reads what a user sees."""

from __future__ import annotations

from aiohttp import web

from bench.flow_bench import (
    PHASE_GAP_S,
    PRIORITY_HEADER,
    TEAM_HEADER,
    FlowWorkload,
    flow_phase,
    flow_schedule,
    summarize,
)
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


def test_the_priority_phase_keeps_the_overload_stages_requests_at_their_offsets_after_the_warm_up() -> None:
    w = FlowWorkload()
    whole = flow_schedule(w, seed=7)
    phase = flow_phase(whole, w, "priority")
    assert {r.stage.split(":")[0] for r in phase.requests} == {"warmup", "over"}
    assert [s.label for s in phase.stages] == ["warmup:B", "over:default", "over:batch"]
    t_over = w.warmup_s + w.alone_s + w.noisy_s + w.gap_s
    before = [(r.stage, r.arrival_s - t_over, r.messages) for r in whole.requests if r.stage.startswith("over")]
    after = [
        (r.stage, r.arrival_s - w.warmup_s - PHASE_GAP_S, r.messages)
        for r in phase.requests
        if r.stage.startswith("over")
    ]
    assert len(after) == len(before) > 0
    assert all(a[0] == b[0] and abs(a[1] - b[1]) < 1e-9 and a[2] == b[2] for a, b in zip(after, before, strict=True))
    assert [r.index for r in phase.requests] == list(range(len(phase.requests)))
    assert flow_phase(whole, w, "all") is whole
    noisy = flow_phase(whole, w, "noisy")
    assert {r.stage for r in noisy.requests} == {"warmup:B", "alone:B", "noisy:A", "noisy:B"}


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
