"""The intent classifier's parts: character n-gram features, calibrated probabilities, the ``embeddings`` kind against
a simulated engine's ``/v1/embeddings`` (its budget, cache and fallback), and routing by difficulty. The policy's
rules, splits and reload: tests/intent/test_intent.py; the gateways: tests/e2e/test_intent_*_e2e.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cognitora.config import ConfigError, config_from_dict
from cognitora.core.router import Router
from cognitora.intent import How, Rewriter
from cognitora.intent.calibration import expected_calibration_error
from cognitora.intent.classifier import TfidfClassifier
from cognitora.intent.embeddings import EmbeddingsClassifier
from cognitora.intent.ngrams import CharVocabulary, char_ngrams
from cognitora.intent.policy import ClassifierSpec, IntentPolicy
from cognitora.request import RouteRequest
from cognitora_sim.launch import SimFleet, start_fleet
from kvstate.memory_store import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "cognitora" / "intent" / "data" / "examples.jsonl"
DIFFICULTY = ROOT / "cognitora" / "intent" / "data" / "difficulty.jsonl"
EVAL = ROOT / "bench" / "intent_eval" / "eval.jsonl"

CODE = ["fix this python function", "my python code raises an error", "write a python class for a stack"]
CODE += ["debug the python script", "python function returns the wrong value"]
TRAVEL = ["book a flight to paris", "a hotel near the airport", "my flight is delayed at the airport"]
TRAVEL += ["train ticket to rome", "cheap hotel and flight for the holidays"]


def ask(text: str, model: str = "auto", **fields: Any) -> RouteRequest:
    return RouteRequest(model=model, messages=[{"role": "user", "content": text}], **fields)


def models() -> list[dict[str, Any]]:
    return [{"name": m, "endpoints": [{"url": f"http://127.0.0.1:{9100 + i}"}]} for i, m in enumerate(("big", "small"))]


def two_intents(classifier: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {
        "rewrite": ["auto"],
        "default": "small",
        "intents": [
            {"name": "code", "target": "big", "examples": CODE},
            {"name": "travel", "target": "small", "examples": TRAVEL},
        ],
        "classifier": classifier,
        **over,
    }


# -- character n-grams ----------------------------------------------------------------------------------------------


def test_char_ngrams_stay_within_words_and_work_without_spaces() -> None:
    grams = char_ngrams("ab cd")
    same = char_ngrams("AB   cd")  # lower-cased, whitespace collapsed
    assert sorted(grams.tolist()) == sorted(same.tolist())
    # " ab cd ": 1-grams a b c d (4), 2-grams " a", ab, "b ", " c", cd, "d " (6), 3-grams " ab", "ab ", " cd",
    # "cd " (4: none straddles the inner space), 4-grams " ab ", " cd " (2)
    assert len(grams) == 16
    assert len(char_ngrams("翻译这句话")) > 10  # no spaces: every n-gram of the run
    assert len(np.intersect1d(char_ngrams("übersetze"), char_ngrams("übersetzen"))) >= 20  # inflection shares most


def test_the_char_vocabulary_gives_scikit_learns_tfidf_for_the_same_terms() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = ["Traduis cette phrase", "übersetze den Satz bitte", "translate this sentence", "翻译这句话 please"]
    vocab = CharVocabulary.fit(texts)
    reference = TfidfVectorizer(analyzer=lambda t: [str(h) for h in char_ngrams(t)], sublinear_tf=True).fit(texts)
    column_of = {int(term): j for term, j in reference.vocabulary_.items()}
    for text in [*texts, "translate la phrase"]:
        columns, weights = vocab.vector(text)
        expected = reference.transform([text]).toarray()[0]
        got = np.zeros_like(expected)
        for c, w in zip(columns, weights, strict=True):
            got[column_of[int(vocab.hashes[c])]] = w
        assert np.allclose(got, expected, atol=1e-12)


# -- calibration ------------------------------------------------------------------------------------------------------


def test_calibrated_scores_mean_what_they_say_on_the_held_out_set() -> None:
    examples = [(r["text"], r["intent"]) for r in map(json.loads, EXAMPLES.read_text().splitlines())]
    rows = [json.loads(line) for line in EVAL.read_text().splitlines()]

    def ece(calibrate: bool) -> float:
        model = TfidfClassifier(ClassifierSpec(calibrate=calibrate), examples)
        predicted = [model.predict(r["text"]) for r in rows]
        return expected_calibration_error(
            [p.score for p in predicted], [p.intent == r["intent"] for p, r in zip(predicted, rows, strict=True)]
        )

    calibrated, raw = ece(True), ece(False)
    assert calibrated < raw  # the regression alone is under-confident here (scores 0.83 for answers right 97%)
    assert calibrated <= 0.05


def test_too_few_examples_to_hold_out_fit_without_a_temperature() -> None:
    model = TfidfClassifier(ClassifierSpec(), [("hello there", "chat"), ("def f(): pass", "code"), ("hi", "chat")])
    assert model.linear.temperature == 1.0  # one example of `code`: nothing to cross-validate
    assert model.predict("def g(): return 1").intent == "code"


# -- config ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("intent", "message"),
    [
        (two_intents({"kind": "embeddings"}), "kind 'embeddings' needs `embeddings: {url: ..., model: ...}`"),
        (two_intents({}, difficulty={"hard_target": "huge"}), "intent.difficulty.hard_target: 'huge' is not a model"),
        (two_intents({}, difficulty={"hard_target": "big", "threshold": 2}), "less than or equal to 1"),
        (
            {"rewrite": ["auto"], "default": "small", "difficulty": {"hard_target": "big", "unsure_below": 0.3}},
            "difficulty.unsure_below reads the intent classifier's score: add `classifier`",
        ),
    ],
)
def test_a_bad_classifier_or_difficulty_is_refused_naming_the_key(intent: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}").replace("[", r"\[")):
        config_from_dict({"models": models(), "intent": intent})


def test_difficulty_examples_with_an_unknown_label_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"text": "hi", "difficulty": "easy"}\n{"text": "prove it", "difficulty": "medium"}\n')
    cfg = config_from_dict(
        {"models": models(), "intent": two_intents({}, difficulty={"hard_target": "big", "examples_file": str(bad)})}
    )
    with pytest.raises(ConfigError, match=r"d.jsonl:2: difficulty 'medium' is not one of the accepted values"):
        Router(cfg, MemoryStore())


# -- the embeddings kind, against a simulated engine's /v1/embeddings -----------------------------------------------


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with start_fleet(1, model="embed", log_dir=tmp_path_factory.mktemp("embedder")) as fleet:
        yield fleet


def embeddings_calls(fleet: SimFleet) -> int:
    counts = fleet.state(0)["http_requests"]
    assert isinstance(counts, dict)
    return int(counts.get("/v1/embeddings", 0))


def embeddings_policy(fleet: SimFleet, **endpoint: Any) -> IntentPolicy:
    spec = {"url": f"{fleet.urls[0]}/v1", "model": "embed", "timeout_ms": 2000, **endpoint}
    return IntentPolicy.model_validate(two_intents({"kind": "embeddings", "embeddings": spec, "min_score": 0.0}))


def test_the_embeddings_kind_classifies_by_the_endpoints_vectors_and_caches_per_prompt(embedder: SimFleet) -> None:
    before = embeddings_calls(embedder)
    r = Rewriter.build(embeddings_policy(embedder, batch_size=4))
    assert isinstance(r.classifier, EmbeddingsClassifier)
    assert embeddings_calls(embedder) - before == 3  # the 10 examples, 4 at a time, at start-up

    async def scenario() -> None:
        code = await r.decide_async(ask("my python function raises an error"))
        assert (code.model, code.how, code.intent) == ("big", How.CLASSIFIER, "code")
        assert "local tfidf" not in code.detail
        travel = await r.decide_async(ask("a cheap flight and a hotel in rome"))
        assert (travel.model, travel.intent) == ("small", "travel")
        calls = embeddings_calls(embedder)
        again = await r.decide_async(ask("my python function raises an error"))
        assert again == code and embeddings_calls(embedder) == calls  # cached: no call

    asyncio.run(scenario())
    # A synchronous caller gets the cache (no call), and the local classifier for a prompt never embedded.
    assert r.decide(ask("my python function raises an error")).intent == "code"
    assert "no cached embedding: local tfidf" in r.decide(ask("python class please")).detail


def test_the_sim_answers_embeddings_in_openais_shape_and_refuses_bad_input(embedder: SimFleet) -> None:
    import httpx

    url = f"{embedder.urls[0]}/v1/embeddings"
    r = httpx.post(url, json={"model": "embed", "input": ["hello world", "hello there"]}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
    a, b = (np.array(d["embedding"]) for d in body["data"])
    assert [d["index"] for d in body["data"]] == [0, 1] and abs(float(a @ a) - 1.0) < 1e-9
    assert 0 < float(a @ b) < 1  # a shared token: close, not equal
    again = httpx.post(url, json={"model": "embed", "input": "hello world"}, timeout=10).json()
    assert again["data"][0]["embedding"] == body["data"][0]["embedding"]  # deterministic
    bad = httpx.post(url, json={"model": "embed", "input": 42}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_past_its_budget_the_local_classifier_decides_and_the_late_answer_fills_the_cache(embedder: SimFleet) -> None:
    r = Rewriter.build(embeddings_policy(embedder, timeout_ms=100))

    async def scenario() -> None:
        embedder.fault(0, "hang")
        try:
            started = time.monotonic()
            d = await r.decide_async(ask("debug my python class"))
            waited = time.monotonic() - started
            assert d.how == How.CLASSIFIER and d.intent == "code"  # the fallback is fitted on the same examples
            assert "embeddings over the 100 ms budget: local tfidf" in d.detail
            assert waited < 1.0  # the budget, not the endpoint, bounds the wait
        finally:
            embedder.fault(0, "recover")
        classifier = r.classifier
        assert isinstance(classifier, EmbeddingsClassifier)
        deadline = time.monotonic() + 10
        while classifier._pending and time.monotonic() < deadline:  # the late call finishes in the background
            await asyncio.sleep(0.05)
        calls = embeddings_calls(embedder)
        late = await r.decide_async(ask("debug my python class"))
        assert "local tfidf" not in late.detail and embeddings_calls(embedder) == calls  # from the cache
        assert classifier.fallbacks == 1

    asyncio.run(scenario())


def test_an_embeddings_endpoint_that_does_not_answer_at_start_up_is_a_clear_error() -> None:
    from cognitora_sim.harness.process import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    intent = two_intents({"kind": "embeddings", "embeddings": {"url": url, "model": "e5", "fit_timeout_s": 2}})
    cfg = config_from_dict({"models": models(), "intent": intent})
    with pytest.raises(
        ConfigError,
        match=r"embedding the examples at .*/v1/embeddings \(model 'e5'\) failed: .*"
        r"start that endpoint first, or use kind: tfidf",
    ):
        Router(cfg, MemoryStore())


# -- difficulty -------------------------------------------------------------------------------------------------------


def difficulty_rewriter(**difficulty: Any) -> Rewriter:
    spec = {"hard_target": "big", "examples_file": str(DIFFICULTY), **difficulty}
    return Rewriter.build(IntentPolicy.model_validate(two_intents({}, difficulty=spec)))


def test_a_hard_request_goes_to_the_hard_target_before_the_intent_and_says_why() -> None:
    r = difficulty_rewriter()
    hard = r.decide(ask("Prove that there are infinitely many primes of the form 4k + 3, rigorously."))
    assert (hard.model, hard.how) == ("big", How.DIFFICULTY)
    assert hard.detail.startswith("difficulty ") and ">= 0.5" in hard.detail
    assert "by difficulty (difficulty 0." in hard.explain()
    easy = r.decide(ask("book a flight to paris"))
    assert (easy.model, easy.how, easy.intent) == ("small", How.CLASSIFIER, "travel")
    # Rules still come first: a rule's intent is never second-guessed by the difficulty.
    ruled = Rewriter.build(
        IntentPolicy.model_validate(
            two_intents(
                {},
                difficulty={"hard_target": "big", "examples_file": str(DIFFICULTY)},
                intents=[
                    {
                        "name": "chat",
                        "target": "small",
                        "rules": [{"last_user_keywords": ["prove"]}],
                        "examples": TRAVEL,
                    },
                    {"name": "code", "target": "big", "examples": CODE},
                ],
            )
        )
    )
    assert ruled.decide(ask("Prove that there are infinitely many primes of the form 4k + 3.")).how == How.RULE


def test_tools_and_an_unsure_classifier_can_make_a_request_hard() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    weather = ask("what's the weather in paris", tools=tools)
    assert difficulty_rewriter().decide(weather).model == "small"
    d = difficulty_rewriter(tools_are_hard=True).decide(weather)
    assert (d.model, d.how, d.detail) == ("big", How.DIFFICULTY, "tools present")
    unsure = difficulty_rewriter(unsure_below=0.99).decide(ask("anything nice to do this weekend?"))
    assert unsure.how == How.DIFFICULTY and unsure.detail.startswith("intent classifier unsure (")


def test_the_router_counts_a_difficulty_decision() -> None:
    intent = two_intents({}, difficulty={"hard_target": "big", "examples_file": str(DIFFICULTY)})
    router = Router(config_from_dict({"models": models(), "intent": intent}), MemoryStore())

    async def scenario() -> None:
        try:
            decision, _ = await router.admit(ask("Find all integers n such that n^2 + 2n + 12 is a perfect square."))
            assert decision.model == "big" and decision.rewrite is not None
            assert decision.rewrite.how == How.DIFFICULTY
            counted = {k: v for k, v in router.telemetry.rewrites.items() if k[3] == "difficulty"}
            assert sum(counted.values()) == 1 and all(k[:2] == ("auto", "big") for k in counted)
        finally:
            await router.close()

    asyncio.run(scenario())
