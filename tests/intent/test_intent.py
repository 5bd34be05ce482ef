"""The intent rewrite in the core: config errors, rules, the classifier, the sticky weighted split, team allow
lists, the reload of ``intent.file``, and the Router placing among the chosen model's endpoints (explained and
counted). The gateways' end-to-end tests: tests/e2e/test_intent_envoy_e2e.py, tests/e2e/test_intent_litellm_e2e.py."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cognitora import cli
from cognitora.config import CognitoraConfig, ConfigError, config_from_dict
from cognitora.core.router import Router
from cognitora.intent import How, IntentSource, Rewriter
from cognitora.intent.calibration import softmax
from cognitora.intent.classifier import TfidfClassifier
from cognitora.intent.policy import IntentPolicy
from cognitora.metrics.families import RouterFamilies
from cognitora.request import RouteRequest
from kvstate.memory_store import MemoryStore
from litellm_plugin.translate import REWRITE_KEY, note_rewrite, rewrite_of, route_request

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "cognitora" / "intent" / "data" / "examples.jsonl"
EVAL = ROOT / "bench" / "intent_eval" / "eval.jsonl"
INTENTS = ["code", "math", "small_talk", "travel", "finance"]

CODE = ["127.0.0.1:9101", "127.0.0.1:9102"]
SMALL = ["127.0.0.1:9201", "127.0.0.1:9202"]


def models() -> list[dict[str, Any]]:
    return [
        {"name": "code", "endpoints": [{"url": f"http://{e}"} for e in CODE]},
        {"name": "small", "endpoints": [{"url": f"http://{e}"} for e in SMALL]},
        {"name": "small-v2", "endpoints": [{"url": "http://127.0.0.1:9301"}]},
    ]


def policy(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "rewrite": ["auto"],
        "default": "small",
        "intents": [
            {"name": "code", "target": "code", "rules": [{"last_user_regex": r"```|\bdef "}, {"tools": True}]},
            {"name": "chat", "target": "small", "rules": [{"last_user_keywords": ["hello", "thanks"]}]},
        ],
    }
    return {**base, **over}


def config(**over: Any) -> CognitoraConfig:
    return config_from_dict({"models": models(), "intent": policy(**over)})


def ask(text: str, model: str = "auto", **fields: Any) -> RouteRequest:
    return RouteRequest(model=model, messages=[{"role": "user", "content": text}], **fields)


def rewriter(**over: Any) -> Rewriter:
    return Rewriter.build(IntentPolicy.model_validate(policy(**over)))


# -- config: bad input says what is wrong -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("intent", "message"),
    [
        (policy(intents=[{"name": "c", "target": "nope"}]), "intent.intents[0].target: 'nope' is not a model"),
        (policy(default="gone"), "intent.default: 'gone' is not a model"),
        (policy(weighted={"small": {"small": 0}}), "intent.weighted: small: the weights add up to 0"),
        (policy(weighted={"small": {"small-v3": 5}}), "intent.weighted.small: version 'small-v3' is not a model"),
        (policy(intents=[{"name": "c", "target": "code", "rules": [{"last_user_regex": "(("}]}]), "regular expr"),
        (policy(intents=[{"name": "c", "target": "code", "rules": [{}]}]), "a rule needs at least one condition"),
        (policy(intents=[{"name": "c", "target": "code", "rules": [{"regex": "x"}]}]), "unknown key 'regex'"),
        ({"file": "x.yaml", "default": "small"}, "set either `file` or the policy inline"),
        ({"rewrite": ["auto"]}, "default: required when `rewrite` names an alias"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(intent: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_dict({"models": models(), "intent": intent})


def test_the_classifier_without_its_extra_is_a_clear_start_up_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if the `intent` extra were not installed
    cfg = config(classifier={"examples_file": str(EXAMPLES)}, intents=[{"name": n, "target": "small"} for n in INTENTS])
    with pytest.raises(ConfigError, match=r"needs scikit-learn.*pip install 'cognitora-router\[intent\]'"):
        Router(cfg, MemoryStore())
    from litellm_plugin.fleet import Fleet
    from litellm_plugin.strategy import preflight

    with pytest.raises(ConfigError, match=r"pip install 'cognitora-router\[intent\]'"):
        preflight(Fleet(config=cfg, endpoint_by_deployment={}))  # the proxy's start, not its first request
    rules_only = Router(config(), MemoryStore())  # rules need nothing extra
    assert asyncio.run(rules_only.rewrite(ask("def f(): pass"))) is not None


# -- rules ----------------------------------------------------------------------------------------------------------


def test_rules_read_the_last_user_turn_system_prompt_tools_length_max_tokens_and_hint() -> None:
    rules = [
        {"last_user_keywords": ["sql query"]},
        {"system_regex": "you are a compiler"},
        {"min_prompt_chars": 50, "max_max_tokens": 10},
        {"hint": ["coding"]},
    ]
    r = rewriter(intents=[{"name": "code", "target": "code", "rules": rules}])
    assert r.decide(ask("write me an SQL query")).model == "code"
    assert r.decide(ask("write me an sql queryable thing")).model == "small"  # keywords on word boundaries
    system = RouteRequest(
        model="auto", messages=[{"role": "system", "content": "You are a compiler."}, {"role": "user", "content": "x"}]
    )
    assert r.decide(system).detail.startswith("intents[0].rules[1]: system prompt matches")
    long = "a" * 60
    assert r.decide(ask(long, max_tokens=5)).how == How.RULE
    assert r.decide(ask(long, max_tokens=500)).how == How.DEFAULT
    assert r.decide(ask(long)).how == How.DEFAULT  # no max_tokens: a max_tokens condition does not hold
    assert r.decide(ask("hi", intent_hint="coding")).model == "code"
    # Only the LAST user turn is searched: an old coding question does not make small talk go to the code model.
    turns = [{"role": "user", "content": "def f(): pass"}, {"role": "assistant", "content": "ok"}]
    chat = RouteRequest(model="auto", messages=[*turns, {"role": "user", "content": "thanks, hello"}])
    assert rewriter().decide(chat).intent == "chat"


def test_explicit_names_are_kept_and_tools_go_to_the_code_model() -> None:
    r = rewriter()
    kept = r.decide(ask("def f(): pass", model="small"))
    assert (kept.model, kept.how, kept.changed) == ("small", How.KEPT, False)
    tools = RouteRequest(model="auto", messages=[{"role": "user", "content": "weather?"}], tools=[{"type": "x"}])
    assert r.decide(tools).model == "code"
    anything = rewriter(rewrite=["*"])
    assert anything.decide(ask("def f(): pass", model="small")).model == "code"  # "*": explicit names too


def test_a_team_is_only_rewritten_to_its_allow_list() -> None:
    r = rewriter(teams={"interns": ["small"], "ml": ["code"]})
    interns = r.decide(ask("def f(): pass", team="interns"))
    assert interns.model == "small" and "team 'interns' may not use 'code'" in interns.detail
    assert r.decide(ask("hello", team="ml")).model == "code"  # default not allowed: its list's first
    assert r.decide(ask("def f(): pass", team="other")).model == "code"  # unlisted teams: no restriction


# -- the classifier ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier_policy() -> IntentPolicy:
    return IntentPolicy.model_validate(
        {
            "rewrite": ["auto"],
            "default": "small",
            "intents": [{"name": n, "target": "code" if n in ("code", "math") else "small"} for n in INTENTS],
            "classifier": {"examples_file": str(EXAMPLES)},
        }
    )


def test_the_classifier_reaches_90_percent_on_the_held_out_set_and_matches_scikit_learn(
    classifier_policy: IntentPolicy,
) -> None:
    r = Rewriter.build(classifier_policy)
    rows = [json.loads(line) for line in EVAL.read_text().splitlines()]
    assert len(rows) >= 300 and {row["intent"] for row in rows} == set(INTENTS)
    found = [r.decide(ask(row["text"])) for row in rows]
    assert sum(d.intent == row["intent"] for d, row in zip(found, rows, strict=True)) / len(rows) >= 0.9
    assert all(d.how in (How.CLASSIFIER, How.DEFAULT) and d.score is not None for d in found)
    # The fast path gives the fitted scikit-learn model's own logits (then divided by the calibrated temperature).
    model = r.classifier
    assert isinstance(model, TfidfClassifier)
    texts = [row["text"] for row in rows[::25]]
    import numpy as np

    expected = model.linear.model.decision_function(model.matrix([model.clip(t) for t in texts]))
    assert np.allclose([model.logits(t) for t in texts], expected, atol=1e-9)
    assert np.allclose([model.scores(t) for t in texts], softmax(expected / model.linear.temperature), atol=1e-9)


def test_examples_naming_an_unknown_intent_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "ex.jsonl"
    bad.write_text('{"text": "hi", "intent": "chat"}\n{"text": "yo", "intent": "gossip"}\n')
    with pytest.raises(ConfigError, match=r"ex.jsonl:2: intent 'gossip' is not one of the policy's intents"):
        Router(config(classifier={"examples_file": str(bad)}), MemoryStore())


# -- weighted, sticky -------------------------------------------------------------------------------------------------


def test_a_weighted_split_is_within_3_points_over_1000_users_and_sticky() -> None:
    r = rewriter(weighted={"small": {"small": 90, "small-v2": 10}})
    users = [f"user-{i}" for i in range(1000)]
    first = {u: r.decide(ask("hello", user=u)).model for u in users}
    share = sum(m == "small-v2" for m in first.values()) / len(users)
    assert abs(share - 0.10) <= 0.03
    assert all(r.decide(ask("hello again", user=u)).model == first[u] for u in users)  # sticky per user
    # Moving 10 points to v2 moves users from v1 to v2 only: nobody on v2 goes back.
    moved = rewriter(weighted={"small": {"small": 80, "small-v2": 20}})
    after = {u: moved.decide(ask("hello", user=u)).model for u in users}
    assert all(after[u] == "small-v2" for u in users if first[u] == "small-v2")
    assert abs(sum(m == "small-v2" for m in after.values()) / len(users) - 0.20) <= 0.03
    d = r.decide(ask("hello", user="user-1"))
    assert d.version_of == "small" and "weighted split of 'small'" in d.explain()


def test_without_a_user_the_split_sticks_to_the_conversation() -> None:
    r = rewriter(weighted={"small": {"small": 50, "small-v2": 50}})
    first = [{"role": "user", "content": "hello, planning a trip"}]
    later = [*first, {"role": "assistant", "content": "sure"}, {"role": "user", "content": "thanks"}]
    a = r.decide(RouteRequest(model="small", messages=first)).model
    assert r.decide(RouteRequest(model="small", messages=later)).model == a


# -- the Router: rewrite, then placement among the target's endpoints; explained and counted --------------------------


async def test_the_router_places_among_the_chosen_models_endpoints_and_counts_the_rewrite() -> None:
    router = Router(config(), MemoryStore())
    try:
        decision, attempt = await router.admit(ask("```python\nprint(1)\n```"))
        assert decision.model == "code" and decision.endpoint in CODE and attempt is not None
        assert decision.rewrite is not None and decision.rewrite.intent == "code"
        assert "rewrite: model 'auto' -> 'code': intent 'code' by rule (intents[0].rules[0]" in decision.explain()
        small, _ = await router.admit(ask("hello there"))
        assert small.model == "small" and small.endpoint in SMALL
        kept, _ = await router.admit(ask("```x```", model="small"))
        assert kept.model == "small" and kept.endpoint in SMALL
        unknown, _ = await router.admit(ask("hi", model="nope"))
        assert unknown.rejection is not None and unknown.rejection.status == 404
        counted = {
            (s.labels["model"], s.labels["intent"], s.labels["how"]): s.value
            for family in RouterFamilies(router).collect()
            if family.name == "cognitora_rewrites"
            for s in family.samples
            if s.labels["requested"] == "auto"
        }
        assert counted == {("code", "code", "rule"): 1, ("small", "chat", "rule"): 1}
        assert router.telemetry.rewrites[("(unknown)", "(unknown)", "", "kept")] == 1  # a client's name: no label
    finally:
        await router.close()


def test_cognitora_explain_shows_intent_rule_and_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cognitora.yaml"
    path.write_text(yaml.safe_dump({"models": models(), "intent": policy()}))
    prompt = tmp_path / "p.txt"
    prompt.write_text("def f(x):\n    return x")
    assert cli.main(["explain", "--config", str(path), "--model", "auto", "--prompt-file", str(prompt)]) == 0
    out = capsys.readouterr().out
    assert "rewrite: model 'auto' -> 'code': intent 'code' by rule" in out
    assert "picked 127.0.0.1:910" in out


# -- reload ---------------------------------------------------------------------------------------------------------


def test_the_policy_file_reloads_when_it_changes_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "intent.yaml"
    file.write_text(yaml.safe_dump(policy()))
    now = [0.0]
    source = IntentSource(
        config_from_dict({"models": models(), "intent": {"file": str(file)}}).intent,  # type: ignore[arg-type]
        {"code", "small", "small-v2"},
        clock=lambda: now[0],
    )
    try:
        assert source.current().decide(ask("hello")).model == "small"
        file.write_text(yaml.safe_dump(policy(default="code", weighted={"code": {"small-v2": 1}})))
        now[0] += 2
        source.current()  # notices the change; the new policy compiles off the request path
        source.wait_reloaded()
        assert source.current().decide(ask("nothing in particular")).model == "small-v2"
        assert source.reloads == 1
        file.write_text("intents: [{name: x, target: missing}]\n")
        now[0] += 2
        source.current()
        source.wait_reloaded()
        assert source.reload_errors == 1
        assert source.current().decide(ask("nothing in particular")).model == "small-v2"  # the policy in force
    finally:
        source.close()


def test_a_missing_policy_file_is_a_start_up_error(tmp_path: Path) -> None:
    cfg = config_from_dict({"models": models(), "intent": {"file": str(tmp_path / "nope.yaml")}})
    with pytest.raises(ConfigError, match=r"intent.file: cannot read .*nope.yaml"):
        Router(cfg, MemoryStore())


# -- LiteLLM's translation: the pre-call hook's rewrite travels in metadata, never from the client --------------------


def test_the_rewrite_rides_in_metadata_and_a_client_copy_is_dropped() -> None:
    rewrite = rewriter().decide(ask("def f(): pass"))
    data: dict[str, Any] = {"model": "auto", "metadata": {REWRITE_KEY: {"model": "code", "how": "forged"}}}
    note_rewrite(data, None)
    assert REWRITE_KEY not in data["metadata"]
    note_rewrite(data, rewrite)
    json.dumps(data)  # LiteLLM logs metadata: it must stay plain JSON
    assert rewrite_of(data, "code") == rewrite
    assert rewrite_of(data, "small") is None  # not the group LiteLLM chose: not this request's rewrite
    req = route_request("code", [{"role": "user", "content": "x"}], None, data, [])
    assert req.rewrite == rewrite
