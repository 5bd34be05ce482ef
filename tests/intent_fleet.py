"""What the intent end-to-end tests of both gateways share: a fleet serving two models (``code`` and ``small``, two
simulated engines each, one ``cognitora sim`` process per model), the example policy (examples/intent.yaml) copied
where a test may rewrite it, and the prompts they send."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cognitora.sim.launch import SimFleet, start_fleet

ROOT = Path(__file__).resolve().parent.parent
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


@dataclass
class TwoModelFleet:
    fleets: dict[str, SimFleet]
    policy: Path
    """The copy of examples/intent.yaml the gateway reads (tests rewrite it to reload)."""

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
        fleet = TwoModelFleet(fleets, work / "intent.yaml")
        fleet.write_policy()
        yield fleet


def chat_body(model: str, user: str, system: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = [] if system is None else [{"role": "system", "content": system}]
    return {"model": model, "messages": [*messages, {"role": "user", "content": user}], "max_tokens": 4, **extra}


def cached_tokens(body: dict[str, Any]) -> int:
    return int(((body.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
