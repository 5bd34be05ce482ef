"""The budgets of examples/cognitora.yaml fit the traffic the examples and the demo send: a minute of light chat
requests (a short prompt, no max_tokens, the simulated engines' 128-token answers) for the research team, 64 at a
time, are all admitted. (With the example's former values, a 200,000-token minute and 1,024 tokens reserved per
request without max_tokens, 1,347 of 1,597 such requests were refused.) The real budget gate and its in-process
ledger, on a clock that stays inside one minute."""

from __future__ import annotations

from pathlib import Path

from cognitora.budgets.gate import gate_for
from cognitora.config import load_config
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.decision import Rejection
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cognitora.yaml"
PROMPT_TOKENS, ANSWER_TOKENS, REQUESTS, CONCURRENT = 40, 128, 1_600, 64


async def test_a_minute_of_light_requests_fits_the_example_budgets() -> None:
    config = load_config(EXAMPLE).model_copy(update={"redis_url": None})  # the same limits, in process
    now = [1_800_000_000.0]  # a minute boundary: every request below falls in one minute window
    gate = gate_for(config, MemoryStore(), clock=lambda: now[0])
    assert gate is not None
    refused: list[str] = []
    for start in range(0, REQUESTS, CONCURRENT):
        holds = []
        for i in range(start, min(start + CONCURRENT, REQUESTS)):
            request = RouteRequest(model="smollm2", prompt="hi", team="research", api_key_id="alice")
            held = await gate.reserve(request, "smollm2", PROMPT_TOKENS)
            if isinstance(held, Rejection):
                refused.append(f"request {i}: {held.message}")
            else:
                holds.append(held)
        now[0] += 0.02
        for held in holds:
            done = Outcome(OutcomeKind.COMPLETED, prompt_tokens=PROMPT_TOKENS, completion_tokens=ANSWER_TOKENS)
            await gate.settle(held, done)
    await gate.close()
    assert not refused, f"{len(refused)} of {REQUESTS} light requests refused, the first: {refused[0]}"
