"""A small real OTLP/HTTP trace receiver for the tests: ``POST /v1/traces`` with an ``ExportTraceServiceRequest``
(protobuf, as opentelemetry-exporter-otlp-proto-http sends it), decoded with the OTLP protos and kept in memory.

    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url}
        ...
        spans = receiver.wait_for(lambda s: s.trace_id == trace_id, 20)
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)
    kind: str = ""
    """As OTLP names it: ``SPAN_KIND_SERVER``, ``SPAN_KIND_INTERNAL``, ..."""
    resource: dict[str, Any] = field(default_factory=dict)
    """The attributes of the resource (the process) that sent the span."""


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.traces_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            service=str(attrs.get("service.name", "")),
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            kind=Span.SpanKind.Name(span.kind),
                            resource=attrs,
                        )
                    )
        with self._lock:
            self.spans.extend(found)

    def wait_for(self, match: Callable[[ReceivedSpan], bool], timeout_s: float) -> ReceivedSpan:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                for span in self.spans:
                    if match(span):
                        return span
            time.sleep(0.05)
        raise TimeoutError(f"no matching span within {timeout_s:g} s; received: {self.spans[-5:]}")

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        """Every span received so far of trace ``trace_id`` (hex)."""
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
