"""Engine counters as the scraper reads them, advanced by a window of finished requests (for the rate tests)."""

from __future__ import annotations

from kvstate.engines import EngineLoad


def short_prompts_finished(base: EngineLoad, requests: int, seconds_each: float) -> EngineLoad:
    """``base`` plus ``requests`` more short prompts (50 tokens, 32 cached) of ``seconds_each`` prefill, all
    finished: the window a scrape sees after them."""
    return EngineLoad(
        prompt_tokens_total=(base.prompt_tokens_total or 0) + 50 * requests,
        prefix_cache_hits_total=(base.prefix_cache_hits_total or 0) + 32 * requests,
        ttft_seconds_sum=(base.ttft_seconds_sum or 0) + requests * seconds_each,
        ttft_count=(base.ttft_count or 0) + requests,
        prefill_seconds_sum=(base.prefill_seconds_sum or 0) + requests * seconds_each,
        finish_count=(base.finish_count or 0) + requests,
        finished_prompt_tokens_sum=(base.finished_prompt_tokens_sum or 0) + 50 * requests,
    )
