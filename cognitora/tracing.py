"""OpenTelemetry traces of placement decisions, exported over OTLP/HTTP when configured.

One span per decision, ``cognitora.decide``: a child of the W3C ``traceparent`` the gateway received (or a root when
none came), carrying the decision's inputs (model, priority, team, prompt tokens, candidates) and its pick (endpoint,
runner-up, predicted TTFT and cached tokens, outcome, reason). The request goes on to the engine with a
``traceparent`` naming this span, so vLLM (``--otlp-traces-endpoint``) continues the same trace: the gateway's
span, then Cognitora's decision, then the engine's.

Configured the OpenTelemetry way, by the standard environment variables: tracing is on when
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is not
``true``); ``OTEL_SERVICE_NAME`` names the service (default: the process's, ``cognitora-extproc`` or
``cognitora-litellm``); ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_SCHEDULE_DELAY`` and the rest are read by the SDK
itself. It needs the ``otel`` extra (``pip install 'cognitora-router[otel]'``: opentelemetry-sdk and the OTLP/HTTP
exporter); set without it, the process logs what to install and runs untraced. Off, a decision costs no span and
the client's own ``traceparent`` (if any) reaches the engine untouched.

The tracer provider is this module's own, never the global one: the LiteLLM proxy may run OpenTelemetry for its
own callbacks, and Cognitora must not replace it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cognitora.decision import Decision
    from cognitora.request import RouteRequest

__all__ = ["TRACEPARENT", "TRACESTATE", "UNTRACED", "DecisionSpan", "Tracing", "process_tracing"]

log = logging.getLogger("cognitora.tracing")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SPAN_NAME = "cognitora.decide"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class DecisionSpan:
    """The span of one decision (inert when tracing is off): ``record`` the decision, then ``engine_headers``."""

    def __init__(self, span: Any = None, propagator: Any = None, context: Any = None) -> None:
        self._span = span
        self._propagator = propagator
        self._context = context

    def record(self, decision: Decision) -> None:
        span = self._span
        if span is None:
            return
        span.set_attributes(pick_attributes(decision))

    def engine_headers(self) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) naming this span, for the request to the engine; empty when off."""
        if self._span is None:
            return {}
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._context)
        return carrier


class Tracing:
    """Decision spans for one process. ``Tracing.from_env(service)``; ``shutdown()`` flushes what is queued."""

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider
        self._tracer = None if provider is None else provider.get_tracer("cognitora")
        self._propagator: Any = None
        if provider is not None:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            self._propagator = TraceContextTextMapPropagator()

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @classmethod
    def from_env(cls, service: str, environ: dict[str, str] | None = None) -> Tracing:
        env = os.environ if environ is None else environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or not any(
            env.get(v) for v in ENDPOINT_VARIABLES
        ):
            return cls()
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            if "opentelemetry.proto" in str(exc):  # installed, but xds-protos (the envoy extra) overwrote its modules
                log.error(
                    "OTLP tracing is configured (%s) but opentelemetry-proto's modules were overwritten by an older "
                    "copy that xds-protos ships (%s): pip install --force-reinstall --no-deps opentelemetry-proto "
                    "after installing the envoy extra; running untraced",
                    next(v for v in ENDPOINT_VARIABLES if env.get(v)),
                    exc,
                )
                return cls()
            log.error(
                "OTLP tracing is configured (%s) but the OpenTelemetry SDK is not installed (%s): pip install "
                "'cognitora-router[otel]'; running untraced",
                next(v for v in ENDPOINT_VARIABLES if env.get(v)),
                exc,
            )
            return cls()
        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("OTLP tracing on", extra={"service": resource.attributes.get("service.name")})
        return cls(provider)

    @contextmanager
    def decision(
        self, request: RouteRequest, traceparent: str | None, tracestate: str | None = None
    ) -> Iterator[DecisionSpan]:
        """A span around one decision, the child of ``traceparent`` (the gateway's W3C header) when it is valid."""
        if self._tracer is None:
            yield DecisionSpan()
            return
        from opentelemetry import trace

        carrier = {TRACEPARENT: traceparent} if traceparent else {}
        if traceparent and tracestate:
            carrier[TRACESTATE] = tracestate
        parent = self._propagator.extract(carrier)
        with self._tracer.start_as_current_span(
            SPAN_NAME, context=parent, kind=trace.SpanKind.INTERNAL, attributes=request_attributes(request)
        ) as span:
            yield DecisionSpan(span, self._propagator, trace.set_span_in_context(span))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # flushes the batch queue


UNTRACED = Tracing()
"""Tracing off: every decision's span is inert."""

_PROCESS: dict[str, Tracing] = {}


def process_tracing(service: str) -> Tracing:
    """One ``Tracing.from_env(service)`` per process, built at first use (a gateway that installs its strategy
    several times keeps one exporter). Its provider flushes at interpreter exit."""
    found = _PROCESS.get(service)
    if found is None:
        found = _PROCESS[service] = Tracing.from_env(service)
    return found


def request_attributes(request: RouteRequest) -> dict[str, Any]:
    """The decision's inputs. Never the prompt: spans leave the process, prompts must not."""
    attributes: dict[str, Any] = {
        "gen_ai.request.model": request.model,
        "cognitora.request_id": request.request_id,
        "cognitora.priority": request.priority,
        "cognitora.stream": request.stream,
    }
    if request.team is not None:
        attributes["cognitora.team"] = request.team
    if request.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = request.max_tokens
    if request.candidates is not None:
        attributes["cognitora.candidates"] = list(request.candidates)
    return attributes


def pick_attributes(decision: Decision) -> dict[str, Any]:
    """The decision's outcome, as ``cognitora.decisions`` logs it."""
    attributes: dict[str, Any] = {
        "cognitora.model": decision.model,
        "cognitora.prompt_tokens": decision.prompt_tokens,
        "cognitora.predicted_ttft_s": decision.predicted_ttft_s,
        "cognitora.predicted_cached_tokens": decision.predicted_cached_tokens,
        "cognitora.reason": decision.reason or "",
    }
    if decision.endpoint is not None:
        attributes["cognitora.endpoint"] = decision.endpoint
    if decision.runner_up is not None:
        attributes["cognitora.runner_up"] = decision.runner_up.endpoint
        attributes["cognitora.runner_up_predicted_ttft_s"] = decision.runner_up.predicted_ttft_s
    if decision.rejection is not None:
        attributes["cognitora.rejected_status"] = decision.rejection.status
    if decision.cloud is not None:
        attributes["cognitora.cloud_target"] = decision.cloud.target
    if decision.rewrite is not None:
        attributes["cognitora.rewrite"] = str(decision.rewrite.explain())
    return attributes
