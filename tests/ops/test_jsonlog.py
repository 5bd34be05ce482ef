"""``cognitora.jsonlog``: one JSON object per line, every value redacted (python-json-logger underneath)."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from cognitora import jsonlog
from cognitora.redaction import register_secret

SECRET = "sk-jsonlog-canary-77aa"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    register_secret(SECRET)
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    jsonlog.configure("debug", stream)
    try:
        yield stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def parsed(stream: io.StringIO, logger: str | None = "cognitora.test") -> list[dict[str, object]]:
    """The lines ``logger`` wrote (None: every line). The root logger takes every logger's lines, and a thread an
    earlier test left behind (an OTLP exporter retrying a gone collector: httpcore's debug lines) may write one."""
    rows = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [r for r in rows if logger is None or _logger_of(r) == logger]


def _logger_of(row: dict[str, object]) -> object:
    scope = row.get("InstrumentationScope")  # the OpenTelemetry log data model names it there
    return scope.get("Name") if isinstance(scope, dict) else row.get("logger")


def test_a_line_has_its_keys_first_then_the_extra_fields(lines: io.StringIO) -> None:
    logging.getLogger("cognitora.test").info("placed %s", "r-1", extra={"endpoint": "10.0.0.5:8000", "n": 3})
    (line,) = parsed(lines)
    assert list(line)[:4] == ["ts", "level", "logger", "msg"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(line["ts"]))
    assert line == {
        **line,
        "level": "INFO",
        "logger": "cognitora.test",
        "msg": "placed r-1",
        "endpoint": "10.0.0.5:8000",
    }
    assert line["n"] == 3


def test_secrets_are_masked_in_the_message_fields_and_tracebacks(lines: io.StringIO) -> None:
    log = logging.getLogger("cognitora.test")
    log.warning("key %s", SECRET, extra={"headers": {"authorization": [f"Bearer {SECRET}"]}})
    try:
        raise RuntimeError(f"upstream said {SECRET} and redis://:pw-in-url@10.0.0.1:6379/0")
    except RuntimeError:
        log.exception("call failed")
    text = lines.getvalue()
    assert SECRET not in text and "pw-in-url" not in text
    warning, error = parsed(lines)
    assert warning["headers"] == {"authorization": ["Bearer ****"]}
    assert "RuntimeError: upstream said ****" in str(error["exc"]) and "redis://:****@10.0.0.1" in str(error["exc"])


def test_an_extra_field_cannot_overwrite_the_lines_own_keys(lines: io.StringIO) -> None:
    logging.getLogger("cognitora.test").error("real", extra={"level": "INFO", "logger": "fake", "ts": 0})
    (line,) = parsed(lines)
    assert line["level"] == "ERROR" and line["logger"] == "cognitora.test" and line["ts"] != 0


def test_a_guest_in_a_process_that_shows_nothing_logs_its_own_records_as_json() -> None:
    register_secret(SECRET)
    root = logging.getLogger()
    saved_root = list(root.handlers)
    trees = {
        name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level) for name in jsonlog.GUEST_LOGGERS
    }
    stream = io.StringIO()
    try:
        root.handlers[:] = []  # the LiteLLM proxy's default: nothing on the root logger
        jsonlog.configure_guest("info", stream)
        jsonlog.configure_guest("info", stream)  # idempotent: one handler, one line per record
        logging.getLogger("cognitora.decisions").info("decision", extra={"endpoint": "e", "key": SECRET})
        logging.getLogger("some.library").warning("not ours")
        (line,) = parsed(stream, logger=None)
        assert line["logger"] == "cognitora.decisions" and line["key"] == "****"
        host = logging.StreamHandler(io.StringIO())
        root.handlers[:] = [host]  # a host that shows records (JSON_LOGS=true): its handlers, redacted
        jsonlog.configure_guest("info", stream)
        assert any(isinstance(f, jsonlog.RedactingFilter) for f in host.filters)
    finally:
        root.handlers[:] = saved_root
        for name, (handlers, level) in trees.items():
            logging.getLogger(name).handlers[:] = handlers
            logging.getLogger(name).setLevel(level)


@pytest.fixture
def otel_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    monkeypatch.setenv("COGNITORA_LOG_FORMAT", "otel")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "cognitora-test")
    register_secret(SECRET)
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    jsonlog.configure("debug", stream)
    try:
        yield stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_the_otel_format_is_the_log_data_model_redacted_with_the_span_ids(otel_lines: io.StringIO) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    log = logging.getLogger("cognitora.test")
    log.warning("key %s", SECRET, extra={"endpoint": "10.0.0.5:8000", "n": 3})
    with TracerProvider().get_tracer("t").start_as_current_span("decide") as span:
        log.info("decision")
        ids = span.get_span_context()
    try:
        raise RuntimeError(f"upstream said {SECRET}")
    except RuntimeError:
        log.exception("call failed")
    warning, decision, failure = parsed(otel_lines)
    assert warning == {
        "Timestamp": warning["Timestamp"],
        "SeverityText": "WARN",
        "SeverityNumber": 13,
        "Body": "key ****",
        "Attributes": {"endpoint": "10.0.0.5:8000", "n": 3},
        "Resource": {"service.name": "cognitora-test"},
        "InstrumentationScope": {"Name": "cognitora.test"},
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", str(warning["Timestamp"]))
    assert (decision["SeverityNumber"], decision["TraceId"], decision["SpanId"]) == (
        9,
        format(ids.trace_id, "032x"),
        format(ids.span_id, "016x"),
    )
    attributes = failure["Attributes"]
    assert isinstance(attributes, dict) and attributes["exception.type"] == "RuntimeError"
    assert failure["SeverityText"] == "ERROR" and "Traceback" in attributes["exception.stacktrace"]
    assert SECRET not in otel_lines.getvalue()
