"""systemd's readiness notification (``sd_notify``), spoken over ``$NOTIFY_SOCKET`` without libsystemd.

A unit of ``Type=notify`` (``deploy/systemd/``) counts as started only when its process sends ``READY=1``: each
long-running command calls ``ready()`` once it serves (its port bound, its store checked), so ``systemctl start``
returns when the service answers, and a unit ordered ``After=`` it starts after that, not after the fork.

The protocol (sd_notify(3)): one datagram of newline-separated ``KEY=VALUE`` lines to the AF_UNIX datagram socket
named by ``$NOTIFY_SOCKET``; a name starting with ``@`` is in the abstract namespace. Without ``$NOTIFY_SOCKET``
(a shell, a test, Kubernetes) every call does nothing and returns False, so callers never check where they run.

Why not the ``systemd-python`` or ``sdnotify`` packages: the first needs libsystemd headers to build, the second is
twenty lines of this with no release since 2017; the protocol is one ``sendto``.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["notify", "ready"]

log = logging.getLogger(__name__)


def _address(name: str) -> str | bytes:
    # "@name": Linux's abstract namespace, a leading NUL byte on the wire.
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def notify(*lines: str) -> bool:
    """Send ``lines`` (``"READY=1"``, ``"STATUS=..."``) as one notification. False when there is no
    ``$NOTIFY_SOCKET`` or the send failed (logged: a supervisor that cannot be told must not stop the service)."""
    name = os.environ.get("NOTIFY_SOCKET")
    if not name:
        return False
    message = "\n".join(line.replace("\n", " ") for line in lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, _address(name))
    except OSError as exc:
        log.warning("could not notify the service manager", extra={"notify_socket": name, "error": str(exc)})
        return False
    return True


def ready(status: str | None = None) -> bool:
    """Tell the service manager this process now serves (``READY=1``), with an optional ``STATUS=`` line that
    ``systemctl status`` shows."""
    return notify("READY=1", *([f"STATUS={status}"] if status else []))
