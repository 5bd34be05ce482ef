"""The one place secrets are masked: every log line, ``cognitora explain``, config errors and metric labels go
through ``redact`` before a person (or a log shipper) sees them.

Two kinds of secret are masked:

- a URL's password (``redis://:secret@host``, ``rediss://user:secret@host``), wherever it appears in a text, in a
  malformed URL too (``rediss//:secret@host``, ``redis:secret@host``): whatever reads ``user:password@host``;
- every value registered with ``register_secret``: what the config loader read from ``os.environ/NAME`` or from a
  key that names a password or API key. A registered value is masked even where no URL surrounds it (a traceback
  that echoes a header, a config error that quotes a value).
"""

from __future__ import annotations

import re
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact", "redact_url", "register_secret", "register_url_password"]

MASK = "****"

_URL_PASSWORD = re.compile(
    r"""(?:(?<=[\s/'"=(,\[<])|^)(?P<user>[^\s:@/'"]{0,128}):(?P<password>[^\s/'"]{1,256})@(?=[^\s@/'"])"""
)
"""``user:password@host`` after the start, a space, a quote, ``/`` (``scheme://``, and the malformed ``scheme//``),
``=``, a bracket or a comma; the password runs to the last ``@`` before the host (a password may hold ``@``).
Bounded lengths keep a long log line without any ``@`` linear to scan."""
_MIN_SECRET_CHARS = 4
"""Shorter values are not registered: masking every "a" or "123" in every log line would hide what matters."""

_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Mask ``value`` in everything ``redact`` sees from now on (process-wide)."""
    global _pattern
    if not value or len(value) < _MIN_SECRET_CHARS:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        ordered = sorted(_secrets, key=len, reverse=True)  # the longest first: a secret that contains another
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def register_url_password(url: str | None) -> None:
    """Register the password of ``url`` (well-formed or not) as a secret: masked wherever it appears later, with
    or without the URL around it."""
    if not url:
        return
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    register_secret(password)
    for found in _URL_PASSWORD.finditer(url):
        register_secret(found["password"])


def redact(text: str) -> str:
    """``text`` with every URL password and every registered secret replaced by ``****``."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['user']}:{MASK}@", text)
    pattern = _pattern
    return text if pattern is None else pattern.sub(MASK, text)


def redact_url(url: str) -> str:
    """A URL fit to print: its password masked (and any registered secret in it)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    if parts.password is None:
        return redact(url)
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:{MASK}@{host}" + (f":{parts.port}" if parts.port else "")
    return redact(urlunsplit(parts._replace(netloc=netloc)))
