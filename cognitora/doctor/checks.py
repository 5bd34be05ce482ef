"""One check's result: its status, what was checked, what was found, and what to do about it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cognitora.redaction import redact

__all__ = ["Check", "Status", "fail", "ok", "warn"]


class Status(StrEnum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    status: Status
    name: str
    """What was checked: ``config``, ``redis``, ``engine 10.0.0.5:8000``, ``kv events 10.0.0.5:8000``, ..."""
    detail: str
    """What was found."""
    fix: str = ""
    """What to do (WARN and FAIL); empty when nothing is to be done."""

    def line(self, name_width: int = 0) -> str:
        """``FAIL  engine 10.0.0.5:8000  GET http://...: refused -> start the engine, or ...``, secrets masked."""
        text = f"{self.status.value:<4}  {self.name:<{name_width}}  {self.detail}"
        if self.fix:
            text += f" -> {self.fix}"
        return redact(text)

    def as_dict(self) -> dict[str, Any]:
        """The check as one JSON object (``--format json``), secrets masked."""
        return {"status": self.status.value, "check": self.name, "detail": redact(self.detail), "fix": redact(self.fix)}


def ok(name: str, detail: str) -> Check:
    return Check(Status.OK, name, detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(Status.WARN, name, detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(Status.FAIL, name, detail, fix)
