"""``cognitora doctor``: check a host before (and while) Cognitora runs on it, one line per check.

Each check ends ``OK``, ``WARN`` (works, but something an operator should know or fix) or ``FAIL`` (something a
process here would fail at, or place blind because of), and says what to do. The command exits 1 when any check
FAILs, so a provisioning script or a systemd ``ExecStartPre=`` can stop on it. docs/deploy.md lists the checks.

- ``cognitora.doctor.checks``: the result type;
- ``cognitora.doctor.store``: Redis reachable, its persistence, the clock against Redis's ``TIME``, a collector's
  heartbeat;
- ``cognitora.doctor.fleet``: every engine's health and metrics page, every KV-event stream;
- ``cognitora.doctor.cli``: the command, the config check, the report.
"""

from cognitora.doctor.checks import Check, Status

__all__ = ["Check", "Status"]
