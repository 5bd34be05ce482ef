"""The long-context workload: prompts of 8k-40k tokens with low reuse (docs/benchmarks.md, "Long context").

Shaped after what long-context chat traces look like (public descriptions of Mooncake's and of document-QA
traffic; /work/shared is not read at run time): almost every request starts with one of a few short system
prompts (a block or two) and then carries a long document of its own; a minority are follow-ups that resend an
earlier request's whole prompt with a new question, which is the only reuse beyond the system prompt.

- prompt tokens: log-normal, median ``median_prompt_tokens``, shape ``sigma``, clipped to
  [``min_prompt_tokens``, ``max_prompt_tokens``] (mean ~13k with the defaults);
- output tokens: log-normal, median ``median_output_tokens``, clipped to [32, ``max_output_tokens``];
- a request is a follow-up with probability ``follow_up_share``: the prompt of an earlier request of the same
  session, plus a ``question_tokens`` question.

Every draw comes from one seeded RNG, so a seed is one reproducible instance; the protocol runs several.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads import BenchRequest, MessageSpec, Schedule, Segment, Stage, annotate_reuse, poisson_arrivals


@dataclass(frozen=True)
class LongContextProfile:
    name: str = "long-context"
    system_prompts: int = 4
    system_tokens: int = 200
    median_prompt_tokens: int = 11_500
    sigma: float = 0.5
    min_prompt_tokens: int = 8_000
    max_prompt_tokens: int = 39_000
    median_output_tokens: int = 200
    max_output_tokens: int = 1_000
    follow_up_share: float = 0.15
    question_tokens: int = 100
    source: str = "long-context chat shape: short shared system prompt, 8k-40k-token documents, few follow-ups"


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma))))))


def long_context_schedule(profile: LongContextProfile, stages: Sequence[Stage], seed: int = 20251130) -> Schedule:
    rng = random.Random(seed)
    requests: list[BenchRequest] = []
    sessions: list[tuple[str, tuple[MessageSpec, ...]]] = []
    t = 0.0
    for stage in stages:
        for arrival in poisson_arrivals(stage.rate, t, stage.duration_s, rng):
            i = len(requests)
            output = _lognormal(rng, profile.median_output_tokens, 0.6, 32, profile.max_output_tokens)
            if sessions and rng.random() < profile.follow_up_share:
                session, earlier = sessions[rng.randrange(len(sessions))]
                question = MessageSpec("user", (Segment(f"q:{session}:{i}", profile.question_tokens),))
                answer = MessageSpec("assistant", (Segment(f"a:{session}:{i}", 64),))
                messages = (*earlier, answer, question)
                if sum(s.tokens for m in messages for s in m.segments) + output > profile.max_prompt_tokens + 1000:
                    messages = earlier  # too long to grow: resend as is (still a full hit)
            else:
                session = f"s{i}"
                lo, hi = profile.min_prompt_tokens, profile.max_prompt_tokens
                length = _lognormal(rng, profile.median_prompt_tokens, profile.sigma, lo, hi)
                system = Segment(f"sys:{rng.randrange(profile.system_prompts)}", profile.system_tokens)
                messages = (
                    MessageSpec("system", (system,)),
                    MessageSpec("user", (Segment(f"doc:{session}", length - profile.system_tokens),)),
                )
            sessions.append((session, messages))
            requests.append(BenchRequest(i, arrival, stage.label, "chat", messages, output, session, stage.measured))
        t += stage.duration_s
    annotate_reuse(requests)
    return Schedule(
        workload=profile.name,
        description=(
            f"long-context chat: {profile.min_prompt_tokens // 1000}k-{profile.max_prompt_tokens // 1000}k-token "
            f"prompts (median {profile.median_prompt_tokens:,}), {profile.system_prompts} short system prompts, "
            f"{profile.follow_up_share:.0%} follow-ups, Poisson ({profile.source})"
        ),
        requests=requests,
        stages=list(stages),
        params={"profile": profile.__dict__, "seed": seed},
    )
