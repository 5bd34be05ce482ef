"""What a placement test prints when it fails: the gateway log's decision lines."""

from __future__ import annotations


def decision_lines(log: str, max_chars: int) -> str:
    """The last ``max_chars`` of ``log``'s decision lines (each engine's prediction and the reason for the pick, as
    the gateway logs them) and tracebacks: what tells a stale view of the load from a lost cache."""
    lines = log.splitlines()
    return "\n".join(line for line in lines if '"reason"' in line or "Traceback" in line)[-max_chars:]
