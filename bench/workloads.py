"""Benchmark workloads: deterministic prompts, arrival schedules, and each workload's reuse bound.

Prompt text is built from a fixed vocabulary of 1,024 English word pieces of 3-4 letters, each exactly one token
for the SmolLM2 tokenizer (with or without a leading space) and for the sim's built-in tokenizer (pieces of up to 4
characters after an optional space); ``tests/bench/test_bench_workloads.py`` pins both. Words are joined by single
spaces, so a prompt of N words is N tokens: the intended lengths are exact.

A prompt is a sequence of *segments*. A segment is a named run of words (``sys:17`` = group 17's system prompt,
``blk:4242`` = Mooncake block 4242); its text is a pure function of (seed, name), so equal names are equal text and
reuse is preserved exactly. A segment used shorter than its full length is a prefix of the same text (Mooncake's
partial last blocks).

The **reuse bound** of a workload is the share of prompt tokens whose prefix was already sent earlier in arrival
order: with one infinite cache that sees every request, no router can hit more. It is computed on segment names
(exact to the token for the content; the few chat-template tokens are not counted) and reported per stage.
"""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

Api = Literal["chat", "completions"]
MOONCAKE_BLOCK_TOKENS = 512

_VOCAB_TEXT = """
abc able abs ace acet acid act adam add aden ads aer aff agar aged agg ago aid aim aka akin ale alg alk all ally
also amb amen amph amps anc anch and angi anim ank anne ant anth anti anus ape aph api apps aqu arab arc are
aren args arid arm arr arte arth asc ask asp ass asyn ath atom att aud aug aunt aura aut auto aux aven avg awa
away axis back bag bags ball band bar bars base bath bbox beam bear bec beds bee bees bel belt ben bes bet bias
bid bill bind bio bird bit bits blem blob blow blue body bol bolt bon bone book boot bore bos bot bots bow box
boy bra bred bri brid brow bud buf bug bul bund bur burn bus but buy cad calc cam came can cans caps capt carb
care cart cas cash cat ceil cel cell cent cere cert cfg chal char chat chem chi chip cho cig cir cit city cle
clf clim clip cls cmap cms cnt coat cod coh coin cold cols coma comb comm con cond cone cong cons cont cook cop
cor core cos cost cott cou cpu cre crit cro crow csv cub cube cul cum cur curr cut cycl cyst dad dam dar das
dash data day dead deal dec decl deep def del demo dent dep des dest dev dia dic did died diff dim dip dis disc
dish diss div doc does dogs dom don door dose dou down draw dro drop dry dual due dump duty ear eas east eat
echo edge edit educ egal eld ele elic elim elli else emb emp enc ench ende eng ens ent env eps era eras err esc
ess est eth even evil evol exc exit expl expr eye face fail fair fal fam far fare fast fax fed fee feel fel fem
fen fet fib fid fig file film fin fine fir firm fish fits fix flat flav flip flu fly fmt fol folk foo food for
form four fox frag free fri fro fuel full func fund fus gain gall gam gang gar gas gate gear gen gent geo ger
get gif gin girl give glut gly god gon good got grab gram grav gray gren grid grim guid gut hack had hal hall
hand hang hard harv hash hat have hay heat hed hel hell help hem hens here hero hers hex hib hide hier high him
hing hint hips his hit hog hold hom hon hood hop hor hors hose hot hour href html hub hun hus hyd ice icon ide
idea ids ign ill ille imb imm imp inc ind inf info init ink inn inp insp int inv iod ions iron isol isot ist
itch iter its jam jar jet job join joy jud jug jun kan keep kel ket keys kid kids kill kind kins kit knit lab
lag lake lan lane lap larg last late law laws lazy leaf lect led leg len les less let lett lev lex lib lid lie
lif lift lik like lime line link lion list live loan lob lock logs long look loop los lost lot low lum lux lyn
mac mad mag magn main mal man mand mant map mar marg mars mas mass mat math may mean meat medi mel mem men menu
merc mes mesh met meth mid mig mile mill mind mine mins mis misc mist mite mock mod mol mon moon mor mort most
move mph much mul mun mund mus mut myth nail name nar nat nav nec need nest net neur new nex next nick nine nob
nod nom none norm nos not noun nov now num nut oat obj obs oct odor off oft oint olds ole one only onto open
opin ops opt oral orch ore ores orig orth oste oun ours outs ove oven owe owl owns oxid pace pad page paid pair
pan par para pars pas past pat pay pdf peak peas ped peer pel pen pent pere perm pers pes phe phi phon phy phys
pick pict pie pig pin pine pip pit pkg plan ple plot plug plus pod pol pole poly poor por port pose post pots
pow ppm pre pred prep pret prey prim priv prob prod prog proj prom prop prov prox psy pub pun punk pure push
quad qual quer quit rac race rad rag raid rail ram rand rap rare rat rav ray rays read reb rece rect reed reg
rel rele ren rent repo repr requ resh rest ret reve rgb rho ric rich rid ride rig ring ripe ris risk road robe
rock role rom root ros rot rout rows rub rug rum runs rupt rust sac said sal salt same sand sat save scal scar
sch sci sea sec sect see seek seg sel sell sen sens sent seq ser sess set sett sha shed ship shot shut side sig
sil sin sing site six ske ski skip slic slot slow snap soci soft soil sold some song soon sort span spec spin
spot sqrt src ssh star stay ste stem step stim str stra stri stub sty sub such suff sun sup sur sus swe sym syn
synt tab tag tail tal talk tall tank task tax team tech teen tele tell temp tens ter terr tex tgt than the then
they thin thor thro thy tick tier tile tim time tiny tips toe tok ton tons tool top tor tow tox tra tree trig
trip tro try tube tun tune turn txt type uid umb unc undo une unit unt upp ups ure url use used uses utf uuid
vac vag vals var vari vary vec veh ven ver vern vers very vest via vic vig vin viol vir vit voc vol volt vor wag
wait wake walk want ward ware warn was wat wave way weak web webs weed well were west what when why wick wide
wiki will win wine wire with wolf wood work wra wrap writ xml yang yard yes you zen zero zip zoom
"""

VOCAB: tuple[str, ...] = tuple(_VOCAB_TEXT.split())


# --------------------------------------------------------------------------------------------------------------------
# Text


class TextBank:
    """Deterministic text for segment names, with a bounded cache (Mooncake has tens of thousands of blocks)."""

    def __init__(self, seed: int, cache_size: int = 20_000) -> None:
        self.seed = seed
        self._cache: OrderedDict[tuple[str, int], list[str]] = OrderedDict()
        self._cache_size = cache_size

    def words(self, name: str, length: int) -> list[str]:
        """The first ``length`` words of segment ``name`` (a prefix of the same text for any longer length)."""
        hit = self._cache.get((name, length))
        if hit is not None:
            self._cache.move_to_end((name, length))
            return hit
        # Words are drawn one by one from a stream seeded by the name, so a shorter draw is a prefix of a longer one.
        rng = random.Random(f"{self.seed}:{name}")
        out = [VOCAB[rng.getrandbits(10)] for _ in range(length)]
        self._cache[(name, length)] = out
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return out

    def text(self, segments: Iterable[Segment]) -> str:
        words: list[str] = []
        for seg in segments:
            words.extend(self.words(seg.name, seg.tokens))
        return " ".join(words)


# --------------------------------------------------------------------------------------------------------------------
# Requests


@dataclass(frozen=True)
class Segment:
    name: str
    tokens: int


@dataclass(frozen=True)
class MessageSpec:
    role: str
    segments: tuple[Segment, ...]


@dataclass
class BenchRequest:
    """One request of a schedule. Times are simulated-engine seconds from the start of the run."""

    index: int
    arrival_s: float
    stage: str
    api: Api
    messages: tuple[MessageSpec, ...]
    max_tokens: int
    session: str
    measured: bool = True
    reusable_tokens: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    """Per-request headers over the run's (``bench.flow_bench``: the team and priority a trusted auth filter sets)."""

    @property
    def prompt_tokens(self) -> int:
        """Content tokens (chat-template tokens excluded)."""
        return sum(s.tokens for m in self.messages for s in m.segments)

    def body(self, bank: TextBank, model: str) -> dict[str, Any]:
        """The OpenAI request body, streaming, asking for usage in the final chunk."""
        common: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        }
        if self.api == "completions":
            return {**common, "prompt": bank.text(s for m in self.messages for s in m.segments)}
        return {**common, "messages": [{"role": m.role, "content": bank.text(m.segments)} for m in self.messages]}


@dataclass(frozen=True)
class Stage:
    """A constant-rate stage of a ladder (``rate`` in requests per simulated second); warm-up stages are unmeasured."""

    label: str
    rate: float
    duration_s: float
    measured: bool = True


@dataclass
class Schedule:
    """A workload instance: requests in arrival order, with reuse computed."""

    workload: str
    description: str
    requests: list[BenchRequest]
    stages: list[Stage] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def reuse_bound(self, stage: str | None = None) -> float:
        reqs = [r for r in self.requests if stage is None or r.stage == stage]
        total = sum(r.prompt_tokens for r in reqs)
        return sum(r.reusable_tokens for r in reqs) / total if total else 0.0

    def stage_labels(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.requests:
            seen.setdefault(r.stage, None)
        return list(seen)


# --------------------------------------------------------------------------------------------------------------------
# Reuse bound


class _Node:
    __slots__ = ("children", "longest")

    def __init__(self) -> None:
        self.children: dict[tuple[str, int], _Node] = {}
        self.longest: dict[str, int] = {}


def annotate_reuse(requests: Sequence[BenchRequest]) -> None:
    """Set each request's ``reusable_tokens``: tokens of its prompt prefix already sent by an earlier request.

    A trie over (role, segment name); a node remembers the longest use of each next segment name, because a
    shorter use of a name is a prefix of a longer one (a request may reuse part of a segment, then diverge).
    """
    root = _Node()
    for req in sorted(requests, key=lambda r: (r.arrival_s, r.index)):
        path = [(f"{m.role}/{s.name}", s.tokens) for m in req.messages for s in m.segments]
        node: _Node | None = root
        matched = 0
        for name, tokens in path:
            assert node is not None
            seen = node.longest.get(name)
            if seen is None:
                break
            matched += min(seen, tokens)
            node = node.children.get((name, tokens))
            if node is None:
                break
        req.reusable_tokens = matched
        node = root
        for name, tokens in path:
            node.longest[name] = max(tokens, node.longest.get(name, 0))
            node = node.children.setdefault((name, tokens), _Node())


# --------------------------------------------------------------------------------------------------------------------
# Arrivals


def poisson_arrivals(rate: float, start_s: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times of a Poisson process of ``rate`` per second over [start, start + duration)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    out: list[float] = []
    t = start_s + rng.expovariate(rate)
    while t < start_s + duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def ladder(rates: Sequence[float], stage_s: float, warmup_rate: float = 0.0, warmup_s: float = 0.0) -> list[Stage]:
    stages = [Stage("warmup", warmup_rate, warmup_s, measured=False)] if warmup_rate > 0 and warmup_s > 0 else []
    stages += [Stage(f"{rate:g} rps", rate, stage_s) for rate in rates]
    return stages


# --------------------------------------------------------------------------------------------------------------------
# Shared-prefix profiles


@dataclass(frozen=True)
class SharedPrefixProfile:
    """inference-perf ``shared_prefix``: groups share a system prompt; each prompt adds its own question.

    ``reference_engines`` x ``reference_kv_tokens`` is the fleet the profile was sized for; ``scaled_to`` keeps the
    ratio of prefix demand to fleet KV capacity by scaling the number of groups.
    """

    name: str
    groups: int
    prompts_per_group: int
    system_tokens: int
    question_tokens: int
    output_tokens: int
    reference_engines: int
    reference_kv_tokens: int
    source: str
    api: Api = "chat"

    @property
    def prefix_demand_tokens(self) -> int:
        return self.groups * (self.system_tokens + self.prompts_per_group * self.question_tokens)

    def scaled_to(self, engines: int, kv_tokens_per_engine: int) -> SharedPrefixProfile:
        factor = (engines * kv_tokens_per_engine) / (self.reference_engines * self.reference_kv_tokens)
        if abs(factor - 1.0) < 1e-9:
            return self
        return replace(self, groups=max(1, round(self.groups * factor)))


B2B_SAAS = SharedPrefixProfile(
    name="b2b-saas",
    groups=150,
    prompts_per_group=5,
    system_tokens=6000,
    question_tokens=1200,
    output_tokens=1000,
    reference_engines=8,
    reference_kv_tokens=307_328,
    source="llm-d guide_precise-prefix-cache-routing (73%-capacity): 8 vLLM pods, 307,328 KV tokens each",
)
SHARED_PREFIX_32X32 = SharedPrefixProfile(
    name="shared-prefix-32x32",
    groups=32,
    prompts_per_group=32,
    system_tokens=2048,
    question_tokens=256,
    output_tokens=256,
    reference_engines=8,
    reference_kv_tokens=307_328,
    source="llm-d-benchmark inference-perf/shared_prefix_synthetic",
)
PROFILES: dict[str, SharedPrefixProfile] = {p.name: p for p in (B2B_SAAS, SHARED_PREFIX_32X32)}


def shared_prefix_schedule(profile: SharedPrefixProfile, stages: Sequence[Stage], seed: int = 20251130) -> Schedule:
    """Poisson arrivals per stage; each request draws one of the groups x prompts uniformly (as inference-perf)."""
    rng = random.Random(seed)
    requests: list[BenchRequest] = []
    t = 0.0
    for stage in stages:
        for arrival in poisson_arrivals(stage.rate, t, stage.duration_s, rng):
            group = rng.randrange(profile.groups)
            prompt = rng.randrange(profile.prompts_per_group)
            messages = (
                MessageSpec("system", (Segment(f"sys:{group}", profile.system_tokens),)),
                MessageSpec("user", (Segment(f"q:{group}:{prompt}", profile.question_tokens),)),
            )
            requests.append(
                BenchRequest(
                    index=len(requests),
                    arrival_s=arrival,
                    stage=stage.label,
                    api=profile.api,
                    messages=messages,
                    max_tokens=profile.output_tokens,
                    session=f"g{group}",
                    measured=stage.measured,
                )
            )
        t += stage.duration_s
    annotate_reuse(requests)
    return Schedule(
        workload=profile.name,
        description=(
            f"{profile.groups} groups x {profile.prompts_per_group} prompts, {profile.system_tokens} system / "
            f"{profile.question_tokens} question / {profile.output_tokens} output tokens, Poisson ({profile.source})"
        ),
        requests=requests,
        stages=list(stages),
        params={"profile": profile.__dict__, "seed": seed},
    )


# --------------------------------------------------------------------------------------------------------------------
# Multi-turn chat


@dataclass(frozen=True)
class MultiTurnProfile:
    """Users chat in turns; each turn resends the whole history (system, earlier questions and answers).

    Arrivals are one Poisson stream; arrival i is turn i // users of user i % users, so a user's turns are
    ``users / rate`` seconds apart on average. Answers in the history are our own deterministic text (the engine
    cannot have cached them: only the prefix through the previous question is reusable, as with a real engine
    whose generated text differs from what the client sends back).
    """

    name: str = "multi-turn-chat"
    groups: int = 4
    users_per_group: int = 8
    system_tokens: int = 1000
    question_tokens: int = 200
    output_tokens: int = 200
    source: str = "llm-d-benchmark shared_prefix_multi_turn_chat (1,000/200/200), 4 system prompts x 8 users"


def multi_turn_schedule(profile: MultiTurnProfile, stages: Sequence[Stage], seed: int = 20251130) -> Schedule:
    rng = random.Random(seed)
    users = profile.groups * profile.users_per_group
    requests: list[BenchRequest] = []
    t = 0.0
    for stage in stages:
        for arrival in poisson_arrivals(stage.rate, t, stage.duration_s, rng):
            i = len(requests)
            user, turn = i % users, i // users
            group = user % profile.groups
            msgs = [MessageSpec("system", (Segment(f"sys:{group}", profile.system_tokens),))]
            for k in range(turn):
                msgs.append(MessageSpec("user", (Segment(f"q:{user}:{k}", profile.question_tokens),)))
                msgs.append(MessageSpec("assistant", (Segment(f"a:{user}:{k}", profile.output_tokens),)))
            msgs.append(MessageSpec("user", (Segment(f"q:{user}:{turn}", profile.question_tokens),)))
            requests.append(
                BenchRequest(
                    i, arrival, stage.label, "chat", tuple(msgs), profile.output_tokens, f"u{user}", stage.measured
                )
            )
        t += stage.duration_s
    annotate_reuse(requests)
    return Schedule(
        workload=profile.name,
        description=f"{users} users in {profile.groups} groups, multi-turn, Poisson ({profile.source})",
        requests=requests,
        stages=list(stages),
        params={"profile": profile.__dict__, "seed": seed},
    )


# --------------------------------------------------------------------------------------------------------------------
# Mooncake trace replay


class TraceError(ValueError):
    """A Mooncake trace line is malformed."""


@dataclass(frozen=True)
class TraceRecord:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_mooncake(path: Path) -> Iterator[TraceRecord]:
    """Mooncake FAST'25 JSONL: ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`` per line."""
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rec = TraceRecord(
                    int(obj["timestamp"]),
                    int(obj["input_length"]),
                    int(obj["output_length"]),
                    tuple(int(h) for h in obj["hash_ids"]),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(
                    f"{path}:{lineno}: not a Mooncake trace line ({exc}); expected "
                    '{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [ints]}'
                ) from exc
            if rec.input_length <= 0 or len(rec.hash_ids) != math.ceil(rec.input_length / MOONCAKE_BLOCK_TOKENS):
                raise TraceError(
                    f"{path}:{lineno}: {len(rec.hash_ids)} hash_ids for input_length {rec.input_length}; "
                    f"expected ceil(input_length / {MOONCAKE_BLOCK_TOKENS})"
                )
            yield rec


def mooncake_segments(rec: TraceRecord, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> tuple[Segment, ...]:
    """hash_ids -> segments of ``block_tokens`` words each; the last block holds what is left of input_length."""
    last = rec.input_length - block_tokens * (len(rec.hash_ids) - 1)
    return tuple(
        Segment(f"blk:{h}", block_tokens if i < len(rec.hash_ids) - 1 else last) for i, h in enumerate(rec.hash_ids)
    )


def mooncake_schedule(
    path: Path,
    speed: float = 1.0,
    max_requests: int | None = None,
    max_duration_s: float | None = None,
    api: Api = "chat",
) -> Schedule:
    """Replay a trace: arrival = timestamp / speed; each request is one user message of its blocks' text."""
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    requests: list[BenchRequest] = []
    for rec in read_mooncake(path):
        arrival = rec.timestamp_ms / 1000.0 / speed
        if max_duration_s is not None and arrival >= max_duration_s:
            break
        if max_requests is not None and len(requests) >= max_requests:
            break
        messages = (MessageSpec("user", mooncake_segments(rec)),)
        requests.append(
            BenchRequest(
                len(requests), arrival, "trace", api, messages, max(1, rec.output_length), f"h{rec.hash_ids[0]}"
            )
        )
    if not requests:
        raise TraceError(f"{path}: no requests (empty file, or --duration/--max-requests too small)")
    annotate_reuse(requests)
    span = requests[-1].arrival_s
    return Schedule(
        workload=f"mooncake:{path.name}",
        description=f"Mooncake trace {path.name}, {len(requests)} requests over {span:.0f} s at speed x{speed:g}",
        requests=requests,
        stages=[Stage("trace", len(requests) / span if span > 0 else 0.0, span)],
        params={"trace": str(path), "speed": speed, "max_requests": max_requests},
    )
