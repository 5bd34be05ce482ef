"""Logs as one JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, then the record's ``extra`` fields.

``log.warning("endpoint unhealthy", extra={"endpoint": "10.0.0.5:8000"})`` becomes
``{"ts": "2026-11-30T04:00:00.123Z", "level": "WARNING", "logger": "kvstate.scrape", "msg": "endpoint unhealthy",
"endpoint": "10.0.0.5:8000"}``. Exceptions add ``exc``. Passwords in URLs (``redis://:secret@host``) are masked
and every secret the config registered (``cognitora.redaction``) are masked wherever they appear, in the message or
in a field, so a log line never carries a credential.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from cognitora.redaction import redact

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

mask_secrets = redact
"""Masks URL passwords and registered secrets (``cognitora.redaction``)."""


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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out: dict[str, Any] = {
            "ts": ts,
            "level": record.levelname,
            "logger": record.name,
            "msg": mask_secrets(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_") and key not in out:
                out[key] = _clean(value)
        if record.exc_info:
            out["exc"] = mask_secrets(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False, allow_nan=False, default=str)


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


CHATTY_LIBRARIES = ("httpx", "httpcore", "asyncio")
"""Loggers that narrate every request at INFO: kept at WARNING unless ``level`` is DEBUG."""


def configure(level: str | int = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record of this process to ``stream`` (stderr) as JSON lines, at ``level`` and above."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)  # Python warnings become log records, hence JSON lines too
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)
