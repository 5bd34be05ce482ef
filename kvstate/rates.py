"""What the scraper learns from an engine's cumulative counters: prefill and decode throughput, and the mean time
a request holds a batch slot (``RateEstimator``). Pure arithmetic on ``EngineLoad`` deltas, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvstate.engines import EngineLoad

__all__ = ["FLOOR_EVIDENCE", "RateEstimator", "decoding", "delta", "finish_observed", "window_context_tokens"]

FLOOR_EVIDENCE = 2.0
"""A window of short prompts teaches the prefill floor (``RateEstimator.short_prompt_prefill_s``) only when its
prefill seconds per request are at least this many times what its uncached tokens take at the learned rate: the time
the rate does not explain is the floor's (a step's fixed cost, an engine slowed while serving cached prompts)."""


@dataclass
class RateEstimator:
    """Learns an endpoint's prefill and decode throughput (tokens/s) from its cumulative counters.

    Prefill: what we want is the capacity C, in uncached prompt tokens per second. Over a window between two
    scrapes the engine processed ``dT = d(prompt_tokens) - d(prefix_cache_hits)`` uncached tokens. Two estimators:

    - per-request rate ``dT / d(busy)``, where ``busy`` is per-request prefill time: the engine's own measure when
      it has one (vLLM ``request_prefill_time_seconds``, llama.cpp ``prompt_seconds``), else the TTFT histogram sum
      minus the queue-time sum, else the TTFT sum. A request of n tokens needs at least n/C seconds, more when it
      shares its batch, and TTFT adds queueing on top, so this is a sound LOWER bound of C, provided numerator and
      denominator cover the same requests (``per_request_rate``). Its window closes once it holds
      ``min_prefill_tokens``, so a trickle of tiny requests (all fixed overhead) becomes one meaningful sample.
    - throughput ``dT / d(wall time)`` over windows of at least ``throughput_window_s``: also <= C over a long
      window, and close to C whenever the engine was saturated, which is exactly when a TTFT-based per-request
      rate is pessimistic (queueing inflates TTFT). Used ONLY for engines that expose no queue-free busy time
      (neither a prefill-time nor a queue-time histogram: SGLang, old vLLM), because it is measured on the wall
      clock while the histograms are on the engine's clock, and the two differ for a time-scaled simulator.
      Short windows are not used: counters jump when a long prompt finishes, so a one-interval window can
      show more than C.

    Each is smoothed by an EWMA (``alpha``); the estimate is the larger of the two (the tighter lower bound).

    Long prompts: a prefill takes at least one scheduler step, and a step has a floor (the weights are streamed
    once per step, plus launch overhead: ~15 ms for a 32B model on two H100s). A 50-token prompt then "prefills" at
    ~3k tokens/s on an engine that prefills 13k/s, so an engine that happened to serve short prompts is learned
    several times slower than its twin serving long ones, is never offered a long prompt, and never learns
    otherwise (on the Mooncake trace 3 of 8 identical engines were learned at ~3.4k against ~9k, and drew a
    seventh of the others' prompt tokens). So the per-request windows whose requests prefilled at least
    ``long_prompt_tokens`` uncached tokens each, on average, also feed a second EWMA, ``long_prompt_prefill``
    (the finished-request ceiling likewise, over finished prompts that long; an engine that counts no requests,
    llama.cpp, has every window fed to it). Once it has a sample it is the engine's per-request rate; until then
    the all-windows rate is, and ``prefill_rate_from_short_prompts`` says so: placement then prices the engine like
    its hardware class's engines that were measured on long prompts (``cognitora.placement.rate_pooling``).

    Short prompts: the long-prompt rate is not what a short or cached prompt waits for, and it is blind to an
    engine that slowed down while serving only those (a fault, throttling: it kept its 10k tokens/s and its share
    of the traffic). So the windows of short prompts (under ``long_prompt_tokens`` uncached tokens per request)
    feed ``short_prompt_prefill_s``, the smoothed prefill seconds per request: from the finished requests' prefill
    time when the engine reports it (vLLM, at once as they finish), else from the per-request windows. Placement
    prices a request's own prefill at no less than that (``cognitora.placement.cost``). A window is such a sample
    only when the engine's learned rate explains at most half of its prefill time (``FLOOR_EVIDENCE``): "short" in
    tokens is not short in time on every engine. On a CPU engine a cold 700-token prefill takes ~3 s (27 s on a
    loaded machine), all of it rate; taken as the floor, it priced a request that engine had cached at a whole cold
    prefill, as slow as on an engine without the prompt: only the recompute charge kept it there, and a faster
    rate learned by the other engine, or any other term, sent it away from its cache. Without a learned rate no
    window is a floor sample.

    Context: a prefill's time includes its causal attention, which grows with the context, so a rate is the rate at
    the contexts it was learned on. Each per-request window also feeds the context its requests prefilled at, per
    request: ``(prompt tokens + cached tokens) / requests`` (a request prefilling offsets ``c`` .. ``p`` attends
    ``(p + c) / 2`` tokens per token on average; exact for prompts alike, an approximation for a mix).
    ``prefill_rate_prompt_tokens`` is the one that goes with ``prefill_tokens_per_s``, so placement can divide
    the attention back out (``cognitora.placement.long_context.attention_free_rate``) instead of adding it twice.

    Decode: the per-sequence decode speed ``d(itl_count) / d(itl_sum)``, i.e. 1 / mean inter-token latency
    (llama.cpp: tokens predicted / seconds predicting), EWMA-smoothed, once ``min_decode_tokens`` were generated.
    Its inverse (``EndpointSnapshot.itl_s``) is the smoothed mean inter-token latency an ITL objective is held
    to (``PriorityClass.itl_slo_s``).

    Service: the mean time a request holds a batch slot (scheduled to finished, queueing excluded), the W of
    Little's law that placement turns into a departure rate (``running / mean_service_s``). From the engine's own
    histogram when it has one (vLLM ``request_inference_time_seconds``: ``d(sum) / d(count)``), else as mean
    generated tokens per finished request over the learned per-sequence decode speed
    (``d(generation_tokens) / d(requests_finished) / decode_tokens_per_s``). A window closes once
    ``min_service_requests`` requests finished in it, EWMA-smoothed like the rest.

    Counter resets (engine restart: a counter went down) and health failures restart the windows; what was learned
    is kept, since the hardware did not change. 0.0 means "not learned yet".
    """

    alpha: float = 0.3
    min_prefill_tokens: float = 256.0
    max_unpaired_share: float = 0.25
    """A finish-observed busy time (``finish_observed``) is paired with the window's tokens only once at most this
    share of its requests may lie on one side of the pairing (``unpaired_share``): at once on a quiet engine, over
    a longer window on a busy one."""
    throughput_window_s: float = 10.0
    min_decode_tokens: float = 64.0
    min_service_requests: float = 4.0
    long_prompt_tokens: float = 2048.0
    """Uncached prompt tokens per request (window mean) from which a window measures the long-prompt rate."""
    per_request_prefill: float = 0.0
    long_prompt_prefill: float = 0.0
    short_prompt_prefill_s: float = 0.0
    """Smoothed prefill seconds per request of short prompts (see "Short prompts" above); 0: not learned."""
    long_prompt_context_tokens: float = 0.0
    """Smoothed context per request of the windows ``long_prompt_prefill`` was learned from (see "Context")."""
    prompt_context_tokens: float = 0.0
    """The same over every per-request window (``per_request_prefill``'s)."""
    throughput_prefill: float = 0.0
    decode_tokens_per_s: float = 0.0
    mean_service_s: float = 0.0
    clock_rate: float = 0.0
    """Engine seconds per wall second (0: not learned): 1 for a real engine, the time scale for the simulator."""
    clock_window_s: float = 2.0
    _clock_base: tuple[EngineLoad, float] | None = field(default=None, repr=False)
    _request_base: EngineLoad | None = field(default=None, repr=False)
    _throughput_base: tuple[EngineLoad, float] | None = field(default=None, repr=False)
    _decode_base: EngineLoad | None = field(default=None, repr=False)
    _service_base: EngineLoad | None = field(default=None, repr=False)
    _ceiling_base: EngineLoad | None = field(default=None, repr=False)

    @property
    def prefill_tokens_per_s(self) -> float:
        return max(self.long_prompt_prefill or self.per_request_prefill, self.throughput_prefill)

    @property
    def prefill_rate_prompt_tokens(self) -> float:
        """The context per request (``p + c``) ``prefill_tokens_per_s`` was learned at; 0: not known (an engine
        that counts no requests), and placement then takes the rate as free of attention."""
        if self.long_prompt_prefill > 0:
            return self.long_prompt_context_tokens
        return self.prompt_context_tokens

    @property
    def prefill_rate_from_short_prompts(self) -> bool:
        """A rate is learned, but no window of long prompts measured it yet: it is mostly the step's floor."""
        return self.long_prompt_prefill <= 0 and self.prefill_tokens_per_s > 0

    def restart_windows(self) -> None:
        self._request_base = None
        self._throughput_base = None
        self._decode_base = None
        self._service_base = None
        self._ceiling_base = None
        self._clock_base = None

    def observe(self, load: EngineLoad, now: float) -> None:
        """Feed one scrape taken at monotonic time ``now`` (seconds)."""
        bases = [self._request_base, self._decode_base, self._service_base, self._ceiling_base]
        if self._throughput_base is not None:
            bases.append(self._throughput_base[0])
        if any(base is not None and counters_went_down(base, load) for base in bases):
            self.restart_windows()
        if self._request_base is None or self._per_request_sample(self._request_base, load):
            self._request_base = load
        if self._ceiling_base is None or self._ceiling_sample(self._ceiling_base, load):
            self._ceiling_base = load
        if not has_queue_free_busy_time(load) and (
            self._throughput_base is None or self._throughput_sample(self._throughput_base, load, now)
        ):
            self._throughput_base = (load, now)
        if self._decode_base is None or self._decode_sample(self._decode_base, load):
            self._decode_base = load
        if self._service_base is None or self._service_sample(self._service_base, load):
            self._service_base = load
        if self._clock_base is None or self._clock_sample(self._clock_base, load, now):
            self._clock_base = (load, now)

    def _per_request_sample(self, old: EngineLoad, load: EngineLoad) -> bool:
        """Update from the window ``old`` .. ``load``; False while the window is still too small to close."""
        tokens = uncached_prompt_tokens(old, load)
        if tokens is None:
            return True  # this engine does not count prompt tokens: nothing to learn
        if tokens < self.min_prefill_tokens:
            return False
        if finish_observed(load):
            unpaired = unpaired_share(old, load)
            if unpaired is None or unpaired > self.max_unpaired_share:
                return False  # the tokens and the busy time do not yet cover (nearly) the same requests
        rate = per_request_rate(old, load, tokens)
        if rate is not None:
            self.per_request_prefill = ewma(self.per_request_prefill, rate, self.alpha)
            # An engine that counts no requests (llama.cpp) cannot tell: every window counts, as before.
            requests = delta(old.ttft_count, load.ttft_count)
            context = window_context_tokens(old, load, requests)
            self.prompt_context_tokens = ewma(self.prompt_context_tokens, context, self.alpha)
            if requests is None or (requests > 0 and tokens / requests >= self.long_prompt_tokens):
                self.long_prompt_prefill = ewma(self.long_prompt_prefill, rate, self.alpha)
                self.long_prompt_context_tokens = ewma(self.long_prompt_context_tokens, context, self.alpha)
            elif requests > 0 and not has_finished_prefill_figures(load):
                self._floor_sample(tokens / rate / requests, tokens / requests)
        return True

    def _ceiling_sample(self, old: EngineLoad, load: EngineLoad) -> bool:
        """Bring the per-request rate down to what the requests that finished in the window could at most have
        done (``finished_ceiling_rate``); False while nothing finished in it."""
        ceiling = finished_ceiling_rate(old, load)
        if ceiling is None:
            return delta(old.finish_count, load.finish_count) != 0
        finished = delta(old.finish_count, load.finish_count) or 0.0
        prompt = delta(old.finished_prompt_tokens_sum, load.finished_prompt_tokens_sum) or 0.0
        long_prompts = finished > 0 and prompt / finished >= self.long_prompt_tokens
        if 0 < ceiling < self.per_request_prefill:
            # A bound, not a sample: no request that finished could have been faster, so the estimate drops to it
            # at once (a slowed engine kept drawing its share for 4 rounds while an EWMA walked it down).
            self.per_request_prefill = ceiling
        if 0 < ceiling < self.long_prompt_prefill and long_prompts:
            self.long_prompt_prefill = ceiling
        # The prefill time per finished request, when the requests prefilled few tokens each (cached or short):
        # counted at their first tokens, the uncached tokens cover nearly the same requests in a steady stream.
        uncached = uncached_prompt_tokens(old, load)
        if finished > 0 and uncached is not None and uncached / finished < self.long_prompt_tokens:
            prefill = delta(old.prefill_seconds_sum, load.prefill_seconds_sum) or 0.0
            self._floor_sample(prefill / finished, uncached / finished)
        return True

    def _floor_sample(self, seconds_per_request: float, uncached_per_request: float) -> None:
        """Feed ``short_prompt_prefill_s`` a window's prefill seconds per request, if they show a floor: the
        engine's learned rate explains at most ``1 / FLOOR_EVIDENCE`` of them (else the window measured the rate).

        A window the rate explains is still a bound: the floor is the least a request's prefill takes, so it is no
        higher than the mean its requests took, and drops to it at once (as the rate drops to a finished-request
        ceiling). Without that a floor learned under load (prefills sharing their batch with decodes: 1.75 s per
        short prompt on the simulated ``mac``) stayed when the engine went idle and served the same prompts in
        16 ms: those windows, explained by the rate, were all refused, and the idle engine was predicted at 1.96 s
        for good (a burst it had let go came back at the first request that found it busy)."""
        rate = self.prefill_tokens_per_s
        if rate <= 0:
            return
        if FLOOR_EVIDENCE * uncached_per_request / rate > seconds_per_request:
            if 0 < seconds_per_request < self.short_prompt_prefill_s:
                self.short_prompt_prefill_s = seconds_per_request
            return
        self.short_prompt_prefill_s = ewma(self.short_prompt_prefill_s, seconds_per_request, self.alpha)

    def _throughput_sample(self, base: tuple[EngineLoad, float], load: EngineLoad, now: float) -> bool:
        old, then = base
        tokens = uncached_prompt_tokens(old, load)
        if tokens is None:
            return True
        if now - then < self.throughput_window_s or tokens < self.min_prefill_tokens:
            return False
        self.throughput_prefill = ewma(self.throughput_prefill, tokens / (now - then), self.alpha)
        return True

    def _decode_sample(self, old: EngineLoad, load: EngineLoad) -> bool:
        count = delta(old.itl_count, load.itl_count)
        seconds = delta(old.itl_seconds_sum, load.itl_seconds_sum)
        if count is None or seconds is None:
            return True
        generated = delta(old.generation_tokens_total, load.generation_tokens_total)
        # TRT-LLM's time-per-output-token histogram counts requests, not tokens: judge the window by tokens made.
        if (generated if generated is not None else count) < self.min_decode_tokens:
            return False
        if count > 0 and seconds > 0:
            self.decode_tokens_per_s = ewma(self.decode_tokens_per_s, count / seconds, self.alpha)
        return True

    def _clock_sample(self, base: tuple[EngineLoad, float], load: EngineLoad, now: float) -> bool:
        """Each running sequence adds its inter-token latencies to the ITL histogram's sum on the engine's clock,
        so over a window the sum grows by ``running x engine seconds``: engine seconds per wall second is
        ``d(itl_sum) / (mean running x d(wall))``. Only where the histogram counts tokens (not TRT-LLM's)."""
        old, then = base
        seconds = delta(old.itl_seconds_sum, load.itl_seconds_sum)
        count = delta(old.itl_count, load.itl_count)
        generated = delta(old.generation_tokens_total, load.generation_tokens_total)
        if seconds is None or count is None or generated is None:
            return True  # nothing to learn it from
        if now - then < self.clock_window_s or count < self.min_decode_tokens:
            return False
        running = ((old.running or 0) + (load.running or 0)) / 2
        # The running gauge is read at the window's ends only: a window whose count moved much is not measured.
        steady = min(old.running or 0, load.running or 0) >= 0.8 * max(old.running or 0, load.running or 0)
        if running >= 1 and steady and count >= 0.5 * generated and seconds > 0:
            self.clock_rate = ewma(self.clock_rate, seconds / (running * (now - then)), self.alpha)
        return True

    def _service_sample(self, old: EngineLoad, load: EngineLoad) -> bool:
        count = delta(old.service_count, load.service_count)
        if count is not None:
            seconds = delta(old.service_seconds_sum, load.service_seconds_sum)
            if count < self.min_service_requests:
                return False
            if seconds is not None and seconds > 0:
                self.mean_service_s = ewma(self.mean_service_s, seconds / count, self.alpha)
            return True
        finished = delta(old.requests_finished_total, load.requests_finished_total)
        generated = delta(old.generation_tokens_total, load.generation_tokens_total)
        if finished is None or generated is None:
            return True  # neither source: nothing to learn
        if finished < self.min_service_requests:
            return False
        if self.decode_tokens_per_s > 0 and generated > 0:
            self.mean_service_s = ewma(self.mean_service_s, generated / finished / self.decode_tokens_per_s, self.alpha)
        return True


def window_context_tokens(old: EngineLoad, new: EngineLoad, requests: float | None) -> float:
    """``(prompt tokens + cached tokens) / requests`` over a window: twice the mean context a prefilled token
    attended to (0: not counted, which ``ewma`` ignores)."""
    prompt = delta(old.prompt_tokens_total, new.prompt_tokens_total)
    if prompt is None or requests is None or requests <= 0:
        return 0.0
    hits = delta(old.prefix_cache_hits_total, new.prefix_cache_hits_total) or 0.0
    return (prompt + max(hits, 0.0)) / requests


def has_queue_free_busy_time(load: EngineLoad) -> bool:
    """The engine measures prefill time without queueing (directly, or as TTFT minus a queue-time histogram)."""
    return load.prefill_seconds_sum is not None or load.queue_seconds_sum is not None


def has_finished_prefill_figures(load: EngineLoad) -> bool:
    """The engine reports the prompt tokens and the prefill time of the requests that finished (vLLM), so the
    finished-request figures (``finished_ceiling_rate``) are known."""
    return load.finished_prompt_tokens_sum is not None and load.prefill_seconds_sum is not None


def uncached_prompt_tokens(old: EngineLoad, new: EngineLoad) -> float | None:
    """Prompt tokens actually prefilled between two scrapes (cache hits excluded); None when not counted."""
    prompt = delta(old.prompt_tokens_total, new.prompt_tokens_total)
    if prompt is None:
        return None
    hits = delta(old.prefix_cache_hits_total, new.prefix_cache_hits_total) or 0.0
    return max(prompt - hits, 0.0)


CUMULATIVE_FIELDS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_hits_total",
    "ttft_count",
    "itl_count",
    "prefill_seconds_sum",
    "finish_count",
    "finished_prompt_tokens_sum",
    "requests_finished_total",
    "service_count",
)


def counters_went_down(old: EngineLoad, new: EngineLoad) -> bool:
    for name in CUMULATIVE_FIELDS:
        before, after = getattr(old, name), getattr(new, name)
        if before is not None and after is not None and after < before:
            return True
    return False


def delta(old: float | None, new: float | None) -> float | None:
    return None if old is None or new is None else new - old


def finish_observed(load: EngineLoad) -> bool:
    """Part of what the per-request rate divides is counted when a request FINISHES, the rest at its first token:
    vLLM observes its queue, prefill and inference times at finish (TRT-LLM its queue time), and counts prompt
    tokens and TTFT at the first token; SGLang counts prompt and cached tokens at finish, TTFT at the first token.
    Known here when the engine module gives ``EngineLoad.finish_count`` beside the first tokens (TTFT count).

    A window between two scrapes then holds the tokens of one set of requests and the busy time of another. With
    requests of 24 output tokens, a scrape between a request's first token and its finish made the next window show
    two prompts' tokens over one prefill time, and the engine was learned at twice its rate (a burst test then
    queued 2.9 s on an engine predicted at 1.4 s). With long prompts and cache-hit follow-ups the error was 10-30x:
    identical engines were learned at 10k and 300k tokens/s, and the "fast" ones drew a queue of 200k tokens."""
    return load.ttft_count is not None and load.finish_count is not None


def decoding(load: EngineLoad) -> float:
    """Requests past their first token and not finished at this scrape: first tokens counted minus finishes
    counted, bounded by the batch the engine runs (a request aborted after its first token may never be counted
    as finished, and must not make the count drift)."""
    first, finished = load.ttft_count, load.finish_count
    if first is None or finished is None:
        return 0.0
    count = max(0.0, first - finished)
    return count if load.running is None else min(count, max(load.running, 0.0))


def unpaired_share(old: EngineLoad, new: EngineLoad) -> float | None:
    """For an engine that counts some of it at finish (``finish_observed``): the share of the window's requests
    whose first token and finish fall on different sides of its ends (None: nothing finished in it). Those
    first-tokened in the window and not finished are at most ``decoding(new)``; those finished in it but
    first-tokened before, at most ``decoding(old)``."""
    finished = delta(old.finish_count, new.finish_count)
    if finished is None or finished <= 0:
        return None
    return (decoding(old) + decoding(new)) / finished


def finished_ceiling_rate(old: EngineLoad, new: EngineLoad) -> float | None:
    """The most the requests that finished in the window can have prefilled per second: their prompt tokens, cached
    ones included (vLLM ``request_prompt_tokens``, observed at finish like the prefill time: the same requests),
    over their prefill time. An engine that slowed down shows here at its first finishes, while the paired windows
    of a busy engine take many scrapes to close; None without the figures or a finish."""
    prompt = delta(old.finished_prompt_tokens_sum, new.finished_prompt_tokens_sum)
    prefill = delta(old.prefill_seconds_sum, new.prefill_seconds_sum)
    if prompt is None or prefill is None or prompt <= 0 or prefill <= 0:
        return None
    return prompt / prefill


def per_request_rate(old: EngineLoad, new: EngineLoad, tokens: float) -> float | None:
    """Uncached prompt tokens per second of per-request prefill time over the window (None: nothing to learn).

    ``tokens`` (``uncached_prompt_tokens``) and the busy time cover the same requests when the engine counts both
    at the same moment (llama.cpp's counters; vLLM's tokens and TTFT), and nearly the same ones once the window
    closed when it counts one of them at finish (``finish_observed``, ``RateEstimator.max_unpaired_share``)."""
    prefill = delta(old.prefill_seconds_sum, new.prefill_seconds_sum)
    if prefill is not None:
        return tokens / prefill if prefill > 0 else None
    ttft = delta(old.ttft_seconds_sum, new.ttft_seconds_sum)
    if ttft is None or ttft <= 0:
        return None
    queued = delta(old.queue_seconds_sum, new.queue_seconds_sum)
    if queued is not None and 0 <= queued < ttft:
        return tokens / (ttft - queued)
    return tokens / ttft


def ewma(current: float, sample: float, alpha: float) -> float:
    if not math.isfinite(sample) or sample <= 0:
        return current
    return sample if current <= 0 else current + alpha * (sample - current)
