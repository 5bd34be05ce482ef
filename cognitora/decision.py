"""A placement ``Decision`` and its explanation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cognitora.intent.verdict import Rewrite

__all__ = ["CandidateScore", "CloudPick", "Decision", "PrefillLeg", "Rejection"]


@dataclass(frozen=True)
class CandidateScore:
    """One endpoint as placement saw it. Times are seconds, sizes are tokens."""

    endpoint: str
    cached_tokens: float
    """Tier-weighted prefix tokens the endpoint holds (speculative entries included)."""
    queued_prefill_tokens: float
    prefill_tokens_per_s: float
    predicted_ttft_s: float
    excluded: str | None = None
    """Why the endpoint was filtered out (unhealthy, KV nearly full, ...); None when it was ranked."""
    decode_penalty_s: float = 0.0
    """The decode-load term included in ``predicted_ttft_s`` (seconds)."""
    joules_per_token: float | None = None
    """Marginal energy per token (J) used by the power rule; None when unknown."""
    recompute_penalty_s: float = 0.0
    """``placement.recompute_weight`` x this request's prefill here (seconds): what recomputing the prompt costs the
    fleet beyond the request's own wait. Ranking adds it to ``predicted_ttft_s``; 0 when that weight is 0."""
    slot_wait_s: float = 0.0
    """The slot-wait term included in ``predicted_ttft_s`` (seconds): on an engine at capacity, how long until
    enough running requests finish for this one to be admitted. 0 when the engine has room or nothing is known."""
    predicted_decode_s: float | None = 0.0
    """The request's expected decode tokens over the endpoint's per-sequence decode speed (learned at its current
    load, else the endpoint's prior): what decoding would take here (seconds). 0 when the request expects no decode
    tokens; None when they are expected but the speed is unknown. Predicted E2E = ``predicted_ttft_s`` + this."""
    running: int = 0
    """Requests running on the endpoint as placement counted them (scraped or router-counted, the larger)."""
    predicted_itl_s: float | None = None
    """The inter-token latency a request placed here would see (``cost.predicted_itl_s``); None when the engine's
    is not measured (it has not decoded since the scraper started, or nothing runs there now)."""
    decode_estimated: bool = False
    """``predicted_decode_s`` is a stand-in (the engine has not decoded since the scraper started): it counts toward
    the fastest E2E, but the power rule does not pick the endpoint for energy on it."""
    attention_s: float = 0.0
    """The attention term included in ``predicted_ttft_s``: prefill grows faster than linearly in context
    (``placement.long_context``)."""
    interference_s: float = 0.0
    """Included in ``predicted_ttft_s``: the prefill's steps also read the KV of the context resident there."""
    kv_pressure_s: float = 0.0
    """Included in ``predicted_ttft_s``: the wait for KV room when the request's new blocks do not fit."""
    decode_interference_s: float = 0.0
    """Ranking charge (not in ``predicted_ttft_s``): the decode slowdown this placement causes, its own and the
    running requests'. Ranking adds it like the recompute charge."""
    prefill_stall_s: float = 0.0
    """Ranking charge (not in ``predicted_ttft_s``): the seconds the prefix this placement recomputes, although
    another candidate holds it, stalls the decode steps of the requests running there, summed over them
    (``cost_model.prefill_stall_weight``)."""
    resident_tokens: float = 0.0
    """Context tokens resident in the endpoint's running requests, as placement estimated them."""
    ttft_bias_factor: float = 1.0
    """The feedback factor ``predicted_ttft_s`` was corrected by (1: none learned or applied)."""
    request_joules: float | None = None
    """The request's marginal energy here (J): ``joules_per_token`` x (uncached prompt tokens + expected decode
    tokens). A cache hit saves the prefill's energy too. None when the energy per token is unknown."""
    reload_s: float = 0.0
    """Seconds to load this prompt's prefix blocks held only in CPU memory or on disk back to the GPU, included in
    ``predicted_ttft_s`` (``cognitora.placement.tier_reload``)."""
    short_prompt_floor_s: float = 0.0
    """When it set the request's own prefill time (``predicted_ttft_s`` includes it instead of uncached tokens /
    rate): the prefill seconds the endpoint's short or cached prompts took lately. 0 when the rate set it."""
    cache_held_tokens: float | None = None
    """Tokens of every prompt's blocks the endpoint's prefix cache holds, by the store's count (its snapshot's
    ``cached_blocks`` x block tokens): how full that cache is, for the tie-break's load bound
    (``placement.affinity``). None: not counted (no fresh snapshot, or a store that does not count)."""
    kv_capacity_tokens: int | None = None
    """Tokens the endpoint's KV cache holds (configured, else scraped, else the fleet prior); None: not known."""
    clock_rate: float = 1.0
    """Engine seconds per gateway second there (``placement.seat_wait.engine_clock_rate``): 1 on a real engine, the
    time scale on a time-scaled simulator. Every time above is the engine's; flow control converts its waits
    (gateway seconds) with it. 0: not known (placed without a fresh snapshot of the engine: a gateway whose
    collector has not scraped it yet); conversions then take 1, and flow control's prediction margin does not
    learn from the request's first token (``cognitora.flow.saturation.clock_known``)."""
    basis: str = ""
    """What the estimates rest on (engine kind; learned or prior rate; KV events or routing history; scraped or
    router-counted load): ``cognitora.placement.estimate_basis``."""


@dataclass(frozen=True)
class PrefillLeg:
    """The prefill half of a disaggregated pair (``cognitora.disagg``): the request goes to the decode endpoint's
    sidecar, which runs its prefill here first and moves the KV over. Times are seconds."""

    endpoint: str
    url: str
    cached_tokens: float
    """Tier-weighted prefix tokens the prefill endpoint holds."""
    prefill_s: float
    """Predicted TTFT of the prefill step on this endpoint (its queue and the uncached prompt)."""
    transfer_s: float
    """Predicted KV transfer: link latency + the prompt tokens the decode endpoint lacks x KV bytes per token over
    the link's bandwidth."""
    admission_s: float
    """Predicted wait on the decode endpoint before its first decode step (its queue, decode load, slot wait)."""
    whole_ttft_s: float | None = None
    """The best whole (not split) placement's predicted TTFT the pair beat; None when no endpoint could take it
    whole."""


@dataclass(frozen=True)
class Rejection:
    """The request is refused: an HTTP status, a message saying what to do, and Retry-After when it helps."""

    status: int
    message: str
    retry_after_s: int | None = None


@dataclass(frozen=True)
class CloudPick:
    """The request bursts to a cloud target (``cognitora.burst``): where, under which model name, and why."""

    target: str
    model: str
    """The cloud's name for the model: the request's ``model`` field is rewritten to it."""
    url: str | None
    """The target's OpenAI-compatible base URL (``burst.targets[].base_url``); None when only LiteLLM knows it."""
    reason: str
    """Why it burst, e.g. ``saturated: best local predicted TTFT 3.1 s over 0.8 x SLO 2 s``."""
    team: str
    """The (trusted) team the spend is recorded for."""
    local_fallbacks: tuple[str, ...] = ()
    """The local endpoints, best first: where the request goes when the cloud fails before its first token."""


@dataclass(frozen=True)
class Decision:
    """Where a request goes, and why.

    Exactly one of ``endpoint`` (a local engine, ``host:port``) or ``rejection`` is set.
    """

    request_id: str
    model: str
    endpoint: str | None
    url: str | None
    """Base URL of the chosen endpoint (``http://host:port``)."""
    prompt_tokens: int
    predicted_cached_tokens: float = 0.0
    predicted_ttft_s: float = 0.0
    runner_up: CandidateScore | None = None
    candidates: tuple[CandidateScore, ...] = ()
    reason: str = ""
    degraded: bool = False
    """The store could not be read; placement used only what it had (load, own in-flight counts)."""
    stale_state: bool = False
    """The store was read, but what feeds it has stopped: its newest collector heartbeat is older than
    ``placement.state_max_age_s`` (or no collector ever wrote one). Cache and load state may be out of date."""
    state_age_s: float | None = None
    """Age (s) of the newest collector heartbeat the decision read; None when none was read (no collector, or the
    store could not be read)."""
    rejection: Rejection | None = None
    exact_keys: bool = True
    expected_decode_tokens: int = 0
    """Decode tokens the request may produce (its ``max_tokens``), counted as in-flight work on dispatch."""
    saturated: bool = False
    """No local endpoint met the request's priority SLO: it was shed (429), or placed on the fastest endpoint anyway
    (the case where bursting to a cloud target helps)."""
    shed_probe: bool = False
    """A sheddable class missed its TTFT objective everywhere on learned figures, and was placed on a measured-idle
    endpoint as a probe instead of shed (``cognitora.placement.shed_probe``): its first token teaches the figures.
    ``saturated`` is set too."""
    fallbacks: tuple[str, ...] = ()
    """The other eligible endpoints, best first by the same ranking key as the pick (predicted TTFT plus the
    recompute charge): where a gateway that retries (Envoy's ``override_host``) goes next."""
    rewrite: Rewrite | None = None
    """The model rewrite (intent, weighted split) decided before placement; ``model`` is its result. None when
    the config has no ``intent`` section."""
    cloud: CloudPick | None = None
    """Set when the request bursts to a cloud target: ``endpoint`` is then ``cloud:<target>``."""
    keys: tuple[int, ...] = field(default=(), repr=False)
    """The prompt's block keys (kept so the router can mark them speculative on dispatch)."""
    prefill: PrefillLeg | None = None
    """Set when the request is split: ``endpoint`` is the decode side (its sidecar), this the prefill side."""

    def explain(self) -> str:
        """A human-readable explanation: the pick, the runner-up, every candidate."""
        lines = []
        if self.rewrite is not None:
            lines.append(f"rewrite: {self.rewrite.explain()}")
        if self.rejection is not None:
            lines.append(f"rejected {self.rejection.status}: {self.rejection.message}")
        elif self.cloud is not None:
            lines.append(f"burst to cloud target {self.cloud.target} as model {self.cloud.model}: {self.cloud.reason}")
        else:
            lines.append(
                f"picked {self.endpoint} for model {self.model}: predicted TTFT {self.predicted_ttft_s * 1000:.1f} ms, "
                f"{self.predicted_cached_tokens:.0f}/{self.prompt_tokens} prompt tokens cached"
            )
        if self.prefill is not None:
            p = self.prefill
            whole = "none possible" if p.whole_ttft_s is None else f"{p.whole_ttft_s * 1000:.1f} ms"
            lines.append(
                f"split: prefill on {p.endpoint} ({p.cached_tokens:.0f} cached, {p.prefill_s * 1000:.1f} ms) + KV "
                f"transfer {p.transfer_s * 1000:.1f} ms + decode admission {p.admission_s * 1000:.1f} ms; "
                f"best whole placement {whole}"
            )
        if self.runner_up is not None:
            r = self.runner_up
            lines.append(
                f"runner-up {r.endpoint}: predicted TTFT {r.predicted_ttft_s * 1000:.1f} ms, "
                f"{r.cached_tokens:.0f} cached"
            )
        if self.reason:
            lines.append(f"why: {self.reason}")
        if self.degraded:
            lines.append("degraded: the shared store was unreachable; placed on load and own in-flight counts only")
        if self.stale_state:
            what = (
                "no collector heartbeat in the store: nothing feeds the fleet state"
                if self.state_age_s is None
                else f"the fleet state is {self.state_age_s:.0f} s old (the newest collector heartbeat)"
            )
            lines.append(f"stale: {what}; is `cognitora collector` running and reaching the store?")
        lines.append(
            f"{'endpoint':<24}{'cached':>10}{'queued':>10}{'rate tok/s':>12}{'decode ms':>10}{'TTFT ms':>10}"
            f"{'J/tok':>8}  note"
        )
        for c in self.candidates:
            joules = "-" if c.joules_per_token is None else f"{c.joules_per_token:.3g}"
            note = c.excluded or (f"at capacity: slot wait {c.slot_wait_s * 1000:.0f} ms" if c.slot_wait_s > 0 else "")
            if c.reload_s > 0 and not c.excluded:
                note = f"{note}; " if note else ""
                note += f"reload from CPU/disk {c.reload_s * 1000:.1f} ms"
            if c.short_prompt_floor_s > 0 and not c.excluded:
                note = f"{note}; " if note else ""
                note += f"short prompts take {c.short_prompt_floor_s * 1000:.0f} ms here"
            if c.predicted_itl_s is not None and not c.excluded:
                note = f"{note}; " if note else ""
                note += f"ITL {c.predicted_itl_s * 1000:.0f} ms"
            if c.cache_held_tokens is not None and c.kv_capacity_tokens and not c.excluded:
                note = f"{note}; " if note else ""
                note += f"prefix cache {c.cache_held_tokens:.0f}/{c.kv_capacity_tokens} tokens"
            lines.append(
                f"{c.endpoint:<24}{c.cached_tokens:>10.0f}{c.queued_prefill_tokens:>10.0f}"
                f"{c.prefill_tokens_per_s:>12.0f}{c.decode_penalty_s * 1000:>10.1f}{c.predicted_ttft_s * 1000:>10.1f}"
                f"{joules:>8}  {note}"
            )
        if any(c.basis for c in self.candidates):
            lines.append("based on:")
            lines += [f"  {c.endpoint}: {c.basis}" for c in self.candidates if c.basis]
        return "\n".join(lines)
