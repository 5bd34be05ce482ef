"""What the intent end-to-end tests of both gateways share: a fleet serving two models (``code`` and ``small``, two
simulated engines each, one ``cognitora sim`` process per model) and a one-engine ``embed`` fleet whose
``/v1/embeddings`` the ``embeddings`` classifier kind calls, the example policy (examples/intent.yaml) copied where a
test may rewrite it, an operator's own policy (multilingual examples, difficulty routing), and the prompts they
send."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from cognitora_sim.harness.process import wait_until
from cognitora_sim.launch import SimFleet, start_fleet

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_POLICY = ROOT / "examples" / "intent.yaml"
MODELS = ("code", "small")

CODING_QUESTION = "Why does this raise a KeyError?\n```python\ndef f(d):\n    return d['x']\n```"
SMALL_TALK = "hey there, how are you doing today?"
TRAVEL = "do i need a visa to visit japan from canada"  # no rule: the classifier decides


def long_system_prompt(salt: str) -> str:
    """~1,500 tokens shared by two requests: the second must find it cached on the engine the first used."""
    rng = random.Random(salt)
    return "You are a senior reviewer. Style guide follows. " + " ".join(
        f"rule-{rng.randrange(100_000)}" for _ in range(300)
    )


# An operator's own intents, a few examples each in several languages; the classifier is the default kind.
TRANSLATE_EXAMPLES = [
    "Translate this into French: good morning",
    "Traduis en allemand : merci beaucoup",
    "Übersetze ins Englische: Guten Morgen",
    "Traduce al inglés: buenos días",
    "把这句话翻译成英文\uff1a你好",  # a full-width colon, as Chinese writes it
    "Переведи на английский: спасибо",
]
CODE_EXAMPLES = [
    "How do I read a JSON file in Python?",
    "Comment trier une liste en Python ?",
    "Wie schreibe ich eine Schleife in JavaScript?",
    "¿Cómo ordeno un diccionario en Python?",
    "Python 里怎么读取文件\uff1f",
    "Как в Python объединить два списка?",
]
DIFFICULTY_EXAMPLES = ROOT / "cognitora" / "intent" / "data" / "difficulty.jsonl"
OPERATOR_CASES = [
    ("Traduis en anglais : « Je suis désolé pour le retard. »", "small"),  # translate, easy: the small model
    ("Wie lese ich eine CSV-Datei in Python?", "code"),  # code, by the classifier (no rule in this policy)
    (
        "Design a distributed rate limiter for an API gateway with 10k nodes and per-tenant limits; give the "
        "algorithm, the data layout and the failure modes, and prove the bound on over-admission.",
        "code",  # hard: the large model, whatever the intent
    ),
    ("Übersetze bitte ins Spanische: Wo ist der Bahnhof?", "small"),
]


def operator_policy(alias: str, classifier: dict[str, Any] | None = None) -> dict[str, Any]:
    """Policy keys for an operator's own intents behind the alias ``alias`` (a fresh alias per policy: a request for
    it is refused as an unknown model until the gateway has reloaded the file, so a test can wait for the reload),
    with difficulty routing (hard requests to ``code``) and ``classifier`` (default: the default kind)."""
    return {
        "rewrite": [alias],
        "default": "small",
        "intents": [
            {"name": "translate", "target": "small", "examples": TRANSLATE_EXAMPLES},
            {"name": "code", "target": "code", "examples": CODE_EXAMPLES},
        ],
        "classifier": {"min_score": 0.0, **(classifier or {})},
        "difficulty": {"hard_target": "code", "examples_file": str(DIFFICULTY_EXAMPLES)},
    }


@dataclass
class TwoModelFleet:
    fleets: dict[str, SimFleet]
    policy: Path
    """The copy of examples/intent.yaml the gateway reads (tests rewrite it to reload)."""
    embedder: SimFleet
    """One simulated engine serving ``/v1/embeddings`` (a deterministic embedding of the tokens)."""

    def embeddings_url(self) -> str:
        return f"{self.embedder.urls[0]}/v1"

    def embeddings_calls(self) -> int:
        """``/v1/embeddings`` requests the embedder has answered."""
        counts = self.embedder.state(0)["http_requests"]
        assert isinstance(counts, dict)
        return int(counts.get("/v1/embeddings", 0))

    def engines(self, model: str) -> list[str]:
        return self.fleets[model].endpoint_ids

    def all_engines(self) -> list[str]:
        return [e for m in MODELS for e in self.engines(m)]

    def model_of(self, engine: str) -> str:
        return next(m for m in MODELS if engine in self.engines(m))

    def models_config(self, smollm2_dir: Path) -> list[dict[str, Any]]:
        return [
            {
                "name": model,
                "block_size": 16,
                "tokenizer": str(smollm2_dir / "tokenizer.json"),
                "chat_template": str(smollm2_dir / "chat_template.jinja"),
                "endpoints": [
                    {"url": url, "kv_events": ev, "kv_events_replay": rp, "prefill_tokens_per_s": 30000}
                    for url, ev, rp in zip(f.urls, f.events_addresses, f.replay_addresses, strict=True)
                ],
            }
            for model, f in self.fleets.items()
        ]

    def write_policy(self, **changes: Any) -> None:
        """Rewrite the policy file: the example's keys with ``changes`` over them (a reload test)."""
        self.policy.write_text(yaml.safe_dump({**example_policy(), **changes}, sort_keys=False))


def example_policy() -> dict[str, Any]:
    """examples/intent.yaml, its examples file made absolute (the copy lives elsewhere)."""
    policy = yaml.safe_load(EXAMPLE_POLICY.read_text())
    examples = policy["classifier"]["examples_file"]
    policy["classifier"]["examples_file"] = str((EXAMPLE_POLICY.parent / examples).resolve())
    return policy


@contextlib.contextmanager
def two_model_fleet(work: Path, smollm2_dir: Path) -> Iterator[TwoModelFleet]:
    with contextlib.ExitStack() as stack:
        fleets = {
            model: stack.enter_context(
                start_fleet(2, model=model, time_scale=10.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=work)
            )
            for model in MODELS
        }
        embedder = stack.enter_context(start_fleet(1, model="embed", log_dir=work))
        fleet = TwoModelFleet(fleets, work / "intent.yaml", embedder)
        fleet.write_policy()
        yield fleet


def chat_body(model: str, user: str, system: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = [] if system is None else [{"role": "system", "content": system}]
    return {"model": model, "messages": [*messages, {"role": "user", "content": user}], "max_tokens": 4, **extra}


def cached_tokens(body: dict[str, Any]) -> int:
    return int(((body.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


Ask = Callable[[dict[str, Any]], tuple[httpx.Response, str]]
"""A gateway's client: the response to a chat body, and the engine that answered it."""


def exercise_an_operators_policy(fleet: TwoModelFleet, ask: Ask) -> None:
    """What both gateways' e2e tests check of an operator's own policy, written while the gateway runs: the default
    classifier (character n-grams, calibrated) on multilingual examples and difficulty routing send each prompt to
    its model; then the ``embeddings`` kind calls the embedder once for a new prompt and not for a repeated one."""
    fleet.write_policy(**operator_policy("auto-own"))
    wait_until(lambda: ask(chat_body("auto-own", "hi"))[0].status_code == 200, 30, "the operator's policy in force")
    for text, model in OPERATOR_CASES:
        r, engine = ask(chat_body("auto-own", text))
        assert r.status_code == 200, r.text
        assert r.headers["x-cognitora-model"] == model, text
        assert r.json()["model"] == model and fleet.model_of(engine) == model

    embeddings = {"kind": "embeddings", "embeddings": {"url": fleet.embeddings_url(), "model": "embed"}}
    fleet.write_policy(**operator_policy("auto-emb", embeddings))
    wait_until(lambda: ask(chat_body("auto-emb", "hi"))[0].status_code == 200, 30, "the embeddings policy in force")
    text = "Comment lire un fichier JSON en Python ?"
    before = fleet.embeddings_calls()
    r, engine = ask(chat_body("auto-emb", text))
    assert r.status_code == 200 and r.headers["x-cognitora-model"] == "code" and fleet.model_of(engine) == "code"
    assert fleet.embeddings_calls() == before + 1
    again, _ = ask(chat_body("auto-emb", text))
    assert again.headers["x-cognitora-model"] == "code" and fleet.embeddings_calls() == before + 1  # cached
