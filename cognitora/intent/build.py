"""A policy's learned parts, built: the intent classifier of its ``kind`` and the difficulty model."""

from __future__ import annotations

from cognitora.intent.classifier import TfidfClassifier, read_examples
from cognitora.intent.difficulty import DifficultyModel
from cognitora.intent.difficulty import build as build_difficulty
from cognitora.intent.embeddings import EmbeddingsClassifier
from cognitora.intent.policy import IntentPolicy

__all__ = ["Classifier", "build_classifier", "build_difficulty_model"]

Classifier = TfidfClassifier | EmbeddingsClassifier


def build_classifier(policy: IntentPolicy) -> Classifier | None:
    """The policy's classifier, fitted; None when the policy has none. Raises ``ClassifierUnavailable`` or
    ``ExamplesError`` with a message for the operator."""
    spec = policy.classifier
    if spec is None:
        return None
    names = {i.name for i in policy.intents}
    examples = [(text, i.name) for i in policy.intents for text in i.examples]
    if spec.examples_file is not None:
        examples += read_examples(spec.examples_file, names)
    local = TfidfClassifier(spec, examples, policy.max_chars)
    if spec.kind == "embeddings":
        return EmbeddingsClassifier(spec, examples, local, policy.max_chars)
    return local


def build_difficulty_model(policy: IntentPolicy) -> DifficultyModel | None:
    return build_difficulty(policy.difficulty, policy.max_chars)
