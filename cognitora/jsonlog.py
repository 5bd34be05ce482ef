"""Logs as one JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, then the record's ``extra`` fields.

``log.warning("endpoint unhealthy", extra={"endpoint": "10.0.0.5:8000"})`` becomes
``{"ts": "2026-11-30T04:00:00.123Z", "level": "WARNING", "logger": "kvstate.scrape", "msg": "endpoint unhealthy",
"endpoint": "10.0.0.5:8000"}``. Exceptions add ``exc`` (and ``stack_info=True`` adds ``stack``). Passwords in URLs
(``redis://:secret@host``) and every secret the config registered (``cognitora.redaction``) are masked wherever they
appear, in the message, in a field at any depth, or in a traceback, so a log line never carries a credential.
Non-finite floats become strings (JSON has no NaN).

``COGNITORA_LOG_FORMAT=otel`` writes the lines in the OpenTelemetry log data model instead, on stdout (what a
collector's filelog or journald receiver maps without a custom parser, and how llm-d's components log):
``{"Timestamp": "2026-11-30T04:00:00.123456Z", "SeverityText": "WARN", "SeverityNumber": 13, "Body": "endpoint
unhealthy", "Attributes": {"endpoint": "10.0.0.5:8000"}, "Resource": {"service.name": "cognitora"},
"InstrumentationScope": {"Name": "kvstate.scrape"}}``, with ``TraceId`` and ``SpanId`` when the line is logged
inside a traced decision (``cognitora.tracing``) and ``exception.type``/``exception.message``/``exception.stacktrace``
attributes for an exception. The same redaction applies.

The formatter is python-json-logger's (``pythonjsonlogger.json.JsonFormatter``), configured for these keys, with
the redaction as its ``process_log_record`` step. Why that library rather than structlog: every record here, and
every record of the libraries around us (grpc, aiohttp, redis, LiteLLM), is a standard ``logging`` record carrying
its fields in ``extra=``; python-json-logger is a ``logging.Formatter`` that renders exactly those, so no call site
changes and nothing needs a second logging pipeline. structlog's value (bound loggers, processor chains, context
variables) would need either every call site rewritten or its stdlib bridge in front of the same formatter.

Every Cognitora process logs through ``configure``: ``cognitora extproc``, ``cognitora collector``, ``cognitora
sim``. Inside the LiteLLM proxy, whose logging LiteLLM configures, the plugin calls ``configure_guest``: Cognitora's
own loggers write these JSON lines when LiteLLM shows them nowhere (its default), else LiteLLM's handlers
(``JSON_LOGS=true``: its JSON) get a ``RedactingFilter`` each.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _LibraryJsonFormatter

from cognitora.redaction import redact

__all__ = [
    "CHATTY_LIBRARIES",
    "GUEST_LOGGERS",
    "JsonFormatter",
    "OtelJsonFormatter",
    "RedactingFilter",
    "configure",
    "configure_guest",
    "mask_secrets",
    "redact_every_handler",
]

mask_secrets = redact
"""Masks URL passwords and registered secrets (``cognitora.redaction``)."""

_KEYS = {"levelname": "level", "name": "logger", "message": "msg", "exc_info": "exc", "stack_info": "stack"}
"""LogRecord attribute -> key in the line."""
_OWN_KEYS = ("ts", *_KEYS.values())
"""An ``extra`` field with one of these names is dropped: it would overwrite the line's own."""


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/Infinity
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    return mask_secrets(str(value))


def _timestamp(created: datetime) -> str:
    return created.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(_LibraryJsonFormatter):
    """python-json-logger's formatter, with Cognitora's keys, and every value redacted."""

    def __init__(self) -> None:
        super().__init__(
            ("levelname", "name", "message"),
            rename_fields=_KEYS,
            reserved_attrs=(*RESERVED_ATTRS, *_OWN_KEYS),
            timestamp="ts",
            json_ensure_ascii=False,
        )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        created = log_data.pop("ts")
        out: dict[str, Any] = {"ts": _timestamp(created) if isinstance(created, datetime) else str(created)}
        for key, value in log_data.items():
            out[key] = _clean(value)
        return out


_SEVERITY = ((logging.CRITICAL, "FATAL", 21), (logging.ERROR, "ERROR", 17), (logging.WARNING, "WARN", 13))
"""Python level -> the data model's SeverityText and SeverityNumber (the first whose level the record reaches)."""
LOG_FORMAT_VARIABLE = "COGNITORA_LOG_FORMAT"
_RECORD_ATTRS = frozenset(RESERVED_ATTRS) | {"message", "asctime", "taskName"}


def _severity(levelno: int) -> tuple[str, int]:
    for level, text, number in _SEVERITY:
        if levelno >= level:
            return text, number
    return ("INFO", 9) if levelno >= logging.INFO else ("DEBUG", 5)


@functools.cache
def _otel_trace() -> Any:
    """OpenTelemetry's ``trace`` API, or None when it is not installed (looked up once, not per line)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def _current_span_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids (hex), when OpenTelemetry is installed and a span is recording."""
    trace = _otel_trace()
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


class OtelJsonFormatter(logging.Formatter):
    """One line per record in the OpenTelemetry log data model (see the module's docstring), every value redacted."""

    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.resource = {"service.name": service or os.environ.get("OTEL_SERVICE_NAME") or "cognitora"}

    def format(self, record: logging.LogRecord) -> str:
        text, number = _severity(record.levelno)
        created = datetime.fromtimestamp(record.created, UTC)
        attributes = {k: _clean(v) for k, v in record.__dict__.items() if k not in _RECORD_ATTRS}
        if record.exc_info and record.exc_info[0] is not None:
            attributes["exception.type"] = record.exc_info[0].__name__
            attributes["exception.message"] = mask_secrets(str(record.exc_info[1]))
            attributes["exception.stacktrace"] = mask_secrets(self.formatException(record.exc_info))
        line: dict[str, Any] = {
            "Timestamp": created.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "SeverityText": text,
            "SeverityNumber": number,
            "Body": mask_secrets(record.getMessage()),
            "Attributes": attributes,
            "Resource": self.resource,
            "InstrumentationScope": {"Name": record.name},
        }
        ids = _current_span_ids()
        if ids is not None:
            line["TraceId"], line["SpanId"] = ids
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter() -> logging.Formatter:
    """The formatter ``COGNITORA_LOG_FORMAT`` asks for: ``otel`` (the data model) or ``json`` (the default)."""
    return OtelJsonFormatter() if os.environ.get(LOG_FORMAT_VARIABLE, "").strip().lower() == "otel" else JsonFormatter()


def _default_stream() -> TextIO:
    # The OpenTelemetry format goes to stdout, as llm-d's components write it; the default lines stay on stderr.
    return sys.stdout if isinstance(formatter(), OtelJsonFormatter) else sys.stderr


class RedactingFilter(logging.Filter):
    """Masks secrets in records bound for a handler this project does not format (the LiteLLM proxy's own):
    the message is rendered, redacted and frozen, so no handler's formatter sees a credential."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is the logging call's bug; never lose the record for it
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def redact_every_handler() -> None:
    """Put a ``RedactingFilter`` on every handler of the root logger (idempotent): for processes whose logging
    someone else configured (the LiteLLM proxy)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


GUEST_LOGGERS = ("cognitora", "kvstate")
"""The logger trees of Cognitora's own records (``cognitora.decisions``, ``cognitora.litellm``, ``kvstate.scrape``)."""


def configure_guest(level: str | int = "INFO", stream: TextIO | None = None) -> None:
    """In a process whose logging its host owns (the LiteLLM proxy): when the host shows records nowhere (its root
    logger has no handler, LiteLLM's default without ``JSON_LOGS``), Cognitora's own records become JSON lines on
    ``stream`` (stderr) at ``level``; otherwise they go through the host's handlers, which get a ``RedactingFilter``
    each. Idempotent."""
    if logging.getLogger().handlers:
        redact_every_handler()
        return
    for name in GUEST_LOGGERS:
        logger = logging.getLogger(name)
        if any(isinstance(h.formatter, JsonFormatter | OtelJsonFormatter) for h in logger.handlers):
            continue
        handler = logging.StreamHandler(stream or _default_stream())
        handler.setFormatter(formatter())
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(level.upper() if isinstance(level, str) else level)


CHATTY_LIBRARIES = ("httpx", "httpcore", "asyncio")
"""Loggers that narrate every request at INFO: kept at WARNING unless ``level`` is DEBUG."""


def configure(level: str | int = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record of this process to ``stream`` (stderr) as JSON lines, at ``level`` and above."""
    handler = logging.StreamHandler(stream or _default_stream())
    handler.setFormatter(formatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)  # Python warnings become log records, hence JSON lines too
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)
