"""Routing by difficulty against the obvious baseline, prompt length.

    .venv/bin/python bench/intent_difficulty.py --splits 5

The set: bench/intent_eval/difficulty.yaml (PROVENANCE.md beside it): 120 requests labeled easy or hard, 40 per
domain (math, code, general), 47 of them not in English, a few with tool definitions. The policy under test sends a
hard request to ``large`` and an easy one to ``small`` (``difficulty: {hard_target: large}``, ``default: small``);
a request is routed right when a hard one reaches ``large`` and an easy one ``small``.

1. Out of the box: the difficulty model fitted on the examples Cognitora ships
   (``cognitora/intent/data/difficulty.jsonl``, other prompts), scored on the whole set. The baseline: a threshold
   on the prompt's length in characters, the one that routes the same shipped examples best.
2. The operator's own labels: K easy and K hard requests of the set drawn at random (K = 5, 10, 20), the rest
   scored, ``--splits`` splits: the model fitted on those 2K alone, and on the shipped examples plus those 2K,
   against the length threshold fitted on the same examples. Mean and range over splits; AUC (how well the score
   ranks hard above easy, whatever the threshold) beside accuracy.
3. ``tools_are_hard`` on and off; accuracy by domain and by language; the CPU cost of the difficulty signal for a
   1,000-token prompt.

Writes bench/results/intent_difficulty.json and .md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cognitora.intent import Rewriter  # noqa: E402
from cognitora.intent.policy import IntentPolicy  # noqa: E402
from cognitora.intent.rules import features  # noqa: E402
from cognitora.request import RouteRequest  # noqa: E402

SET = ROOT / "bench" / "intent_eval" / "difficulty.yaml"
SHIPPED = ROOT / "cognitora" / "intent" / "data" / "difficulty.jsonl"
OUT = ROOT / "bench" / "results" / "intent_difficulty"
KS = (5, 10, 20)


@dataclass(frozen=True)
class Row:
    hard: bool
    domain: str
    lang: str
    user: str
    request: RouteRequest

    @property
    def chars(self) -> int:
        return features(self.request, 2000).prompt_chars


def load() -> list[Row]:
    data = yaml.safe_load(SET.read_text())
    rows = []
    for p in data["prompts"]:
        messages = ([{"role": "system", "content": p["system"]}] if "system" in p else []) + [
            {"role": "user", "content": p["user"]}
        ]
        tools = [data["tools"][t] for t in p.get("tools", [])] or None
        req = RouteRequest(model="auto", messages=messages, tools=tools)
        rows.append(Row(p["difficulty"] == "hard", p["domain"], p["lang"], p["user"], req))
    return rows


def shipped() -> list[tuple[str, bool]]:
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines() if line.strip()]
    return [(r["text"], r["difficulty"] == "hard") for r in rows]


def rewriter(examples: list[tuple[str, bool]], use_file: bool, tools_are_hard: bool = False) -> Rewriter:
    difficulty: dict[str, Any] = {
        "hard_target": "large",
        "easy": [t for t, h in examples if not h],
        "hard": [t for t, h in examples if h],
        "tools_are_hard": tools_are_hard,
    }
    if use_file:
        difficulty["examples_file"] = str(SHIPPED)
    return Rewriter.build(
        IntentPolicy.model_validate({"rewrite": ["auto"], "default": "small", "difficulty": difficulty})
    )


def length_threshold(examples: list[tuple[int, bool]]) -> float:
    """The length (characters) at or above which a request is called hard that routes ``examples`` best."""
    candidates = sorted({n for n, _ in examples})
    best, best_right = 0.0, -1
    for i, n in enumerate(candidates):
        cut = n if i == 0 else (candidates[i - 1] + n) / 2
        right = sum((m >= cut) == h for m, h in examples)
        if right > best_right:
            best, best_right = cut, right
    return best


def auc(scores: list[float], hard: list[bool]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(hard, scores))


def evaluate(r: Rewriter, rows: list[Row]) -> dict[str, Any]:
    assert r.difficulty is not None
    routed = [r.decide(row.request).model for row in rows]
    right = [(m == "large") == row.hard for m, row in zip(routed, rows, strict=True)]
    scores = [r.difficulty.score(row.user, row.chars) for row in rows]
    return {"right": right, "accuracy": sum(right) / len(right), "auc": auc(scores, [row.hard for row in rows])}


def evaluate_length(cut: float, rows: list[Row]) -> dict[str, Any]:
    right = [(row.chars >= cut) == row.hard for row in rows]
    return {
        "right": right,
        "accuracy": sum(right) / len(right),
        "auc": auc([float(row.chars) for row in rows], [row.hard for row in rows]),
        "threshold_chars": cut,
    }


def split(rows: list[Row], k: int, seed: int) -> tuple[list[Row], list[Row]]:
    rng = random.Random(seed)
    easy = [r for r in rows if not r.hard]
    hard = [r for r in rows if r.hard]
    rng.shuffle(easy)
    rng.shuffle(hard)
    return easy[:k] + hard[:k], easy[k:] + hard[k:]


def breakdown(right: list[bool], rows: list[Row], key: str) -> dict[str, float]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for ok, row in zip(right, rows, strict=True):
        groups[getattr(row, key)].append(ok)
    return {g: sum(v) / len(v) for g, v in sorted(groups.items())}


def _spread(values: list[float]) -> dict[str, Any]:
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)}


def cost(r: Rewriter, calls: int) -> dict[str, float]:
    assert r.difficulty is not None
    eval_rows = [json.loads(line) for line in (ROOT / "bench/intent_eval/eval.jsonl").read_text().splitlines()]
    text = ""
    for row in eval_rows:
        if len(text) > 4200:  # ~1,000 tokens of English prose and code
            break
        text += row["text"] + "\n"
    # A new text each call (its last line differs), as in traffic: nothing computed for one text serves the next.
    reqs = [RouteRequest(model="auto", messages=[{"role": "user", "content": f"{text}(#{i})"}]) for i in range(calls)]
    r.decide(reqs[0])
    cpu = []
    for req in reqs:
        c = time.thread_time()
        r.decide(req)
        cpu.append(time.thread_time() - c)
    cpu.sort()
    return {"cpu_p50_ms": cpu[len(cpu) // 2] * 1e3, "cpu_p99_ms": cpu[int(len(cpu) * 0.99)] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    rows = load()
    ship = shipped()
    results: dict[str, Any] = {
        "command": "python bench/intent_difficulty.py " + " ".join(sys.argv[1:]),
        "machine": "2 shared CPU cores, no GPU",
        "prompts": len(rows),
        "hard": sum(r.hard for r in rows),
        "non_english": sum(r.lang != "en" for r in rows),
        "with_tools": sum(r.request.tools is not None for r in rows),
        "shipped_examples": len(ship),
    }
    model = rewriter([], use_file=True)
    out_of_box = evaluate(model, rows)
    base = evaluate_length(length_threshold([(len(t), h) for t, h in ship]), rows)
    tools = evaluate(rewriter([], use_file=True, tools_are_hard=True), rows)
    results["out_of_the_box"] = {
        "difficulty": {k: v for k, v in out_of_box.items() if k != "right"},
        "length": {k: v for k, v in base.items() if k != "right"},
        "difficulty, tools_are_hard": {k: v for k, v in tools.items() if k != "right"},
        "by_domain": {
            "difficulty": breakdown(out_of_box["right"], rows, "domain"),
            "length": breakdown(base["right"], rows, "domain"),
        },
        "by_language": {
            "difficulty": breakdown(out_of_box["right"], rows, "lang"),
            "length": breakdown(base["right"], rows, "lang"),
        },
        "tools_rows": {
            "difficulty": _sub(out_of_box["right"], rows),
            "difficulty, tools_are_hard": _sub(tools["right"], rows),
        },
    }
    own: dict[str, Any] = {}
    for k in KS:
        acc: dict[str, list[float]] = defaultdict(list)
        aucs: dict[str, list[float]] = defaultdict(list)
        for seed in range(args.splits):
            train, test = split(rows, k, seed)
            labeled = [(r.user, r.hard) for r in train]
            for name, r in (("K only", rewriter(labeled, False)), ("shipped + K", rewriter(labeled, True))):
                e = evaluate(r, test)
                acc[name].append(e["accuracy"])
                aucs[name].append(e["auc"])
            for name, examples in (
                ("length, K only", [(r.chars, r.hard) for r in train]),
                ("length, shipped + K", [(r.chars, r.hard) for r in train] + [(len(t), h) for t, h in ship]),
            ):
                e = evaluate_length(length_threshold(examples), test)
                acc[name].append(e["accuracy"])
                aucs[name].append(e["auc"])
            print(f"K={k} seed={seed}: " + ", ".join(f"{n} {v[-1]:.3f}" for n, v in acc.items()), flush=True)
        own[str(k)] = {n: {"accuracy": _spread(acc[n]), "auc": _spread(aucs[n])} for n in acc}
    results["own_labels"] = own
    results["cost"] = cost(model, args.calls)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    OUT.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


def _sub(right: list[bool], rows: list[Row]) -> dict[str, Any]:
    picked = [(ok, r.hard) for ok, r in zip(right, rows, strict=True) if r.request.tools is not None]
    return {"n": len(picked), "hard": sum(h for _, h in picked), "right": sum(ok for ok, _ in picked)}


def markdown(r: dict[str, Any]) -> str:
    o = r["out_of_the_box"]
    lines = [
        "# Routing by difficulty against prompt length",
        "",
        f"Command: `{r['command']}` ({r['machine']}).",
        "",
        f"Set: `bench/intent_eval/difficulty.yaml`, {r['prompts']} requests ({r['hard']} hard; "
        f"{r['non_english']} not in English; {r['with_tools']} with tools), written for this project (CC0-1.0, "
        "`bench/intent_eval/PROVENANCE.md`). Right = a hard request routed to the large model, an easy one to the "
        "small. AUC: how well the score ranks hard requests above easy ones (1 = perfectly, 0.5 = a coin).",
        "",
        f"## Out of the box: fitted on the {r['shipped_examples']} shipped examples, scored on the whole set",
        "",
        "| signal | routed right | AUC |",
        "|---|---|---|",
        f"| difficulty (default, threshold 0.5) | {o['difficulty']['accuracy']:.1%} | {o['difficulty']['auc']:.3f} |",
        f"| difficulty, `tools_are_hard: true` | {o['difficulty, tools_are_hard']['accuracy']:.1%} | "
        f"{o['difficulty, tools_are_hard']['auc']:.3f} |",
        f"| prompt length >= {o['length']['threshold_chars']:.0f} chars (best on the shipped examples) | "
        f"{o['length']['accuracy']:.1%} | {o['length']['auc']:.3f} |",
        "",
        "| by domain | " + " | ".join(o["by_domain"]["difficulty"]) + " |",
        "|---|" + "---|" * len(o["by_domain"]["difficulty"]),
    ]
    for name in ("difficulty", "length"):
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in o["by_domain"][name].values()) + " |")
    lines += ["", "| by language | " + " | ".join(o["by_language"]["difficulty"]) + " |"]
    lines.append("|---|" + "---|" * len(o["by_language"]["difficulty"]))
    for name in ("difficulty", "length"):
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in o["by_language"][name].values()) + " |")
    t = o["tools_rows"]
    lines += [
        "",
        f"The {t['difficulty']['n']} requests with tools ({t['difficulty']['hard']} of them hard): routed right "
        f"{t['difficulty']['right']} times by the text alone, {t['difficulty, tools_are_hard']['right']} with "
        "`tools_are_hard` (a blunt rule: a weather look-up with a tool is easy).",
        "",
        "## The operator's own labels: K easy + K hard examples drawn from the set, the rest scored",
        "",
        "| K | signal | routed right, mean [min, max] | AUC mean |",
        "|---|---|---|---|",
    ]
    for k, by in r["own_labels"].items():
        for name, v in by.items():
            a = v["accuracy"]
            spread = f"{a['mean']:.3f} [{a['min']:.2f}, {a['max']:.2f}]"
            lines.append(f"| {k} | {name} | {spread} | {v['auc']['mean']:.3f} |")
    c = r["cost"]
    lines += [
        "",
        f"Cost: the rewrite decision with the difficulty signal (no classifier) for a ~1,000-token prompt: CPU p50 "
        f"{c['cpu_p50_ms']:.2f} ms, p99 {c['cpu_p99_ms']:.2f} ms.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
