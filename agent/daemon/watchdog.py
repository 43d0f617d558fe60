"""A tiny sd_notify client for systemd's `Type=notify` and `WatchdogSec=` (no dependency, no libsystemd).

systemd passes the path of a datagram socket in `NOTIFY_SOCKET` (a leading `@` means a Linux abstract
socket) and, with `WatchdogSec=`, the timeout in `WATCHDOG_USEC` (and the pid it is meant for in
`WATCHDOG_PID`). Every function here is a no-op returning False when the variable is unset, so the agent
calls them unconditionally, under systemd, in Docker or in a terminal alike. Errors are logged, never raised:
a notification that cannot be sent must not take the daemon down.

    ready("serving bundle X")  # once, when the agent is up: READY=1
    ping()                      # every watchdog_interval() / 2 seconds while healthy: WATCHDOG=1
    status("downloading b-2")   # any time: the line `systemctl status` shows
    stopping()                  # when shutting down: STOPPING=1
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

__all__ = ["extend_timeout", "notify", "ping", "ready", "status", "stopping", "watchdog_interval"]


def notify(*assignments: str) -> bool:
    """Send `KEY=VALUE` lines in one datagram to `$NOTIFY_SOCKET`. True when sent, False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not hasattr(socket, "AF_UNIX"):
        return False
    if address[0] == "@":
        address = "\0" + address[1:]  # abstract namespace
    elif address[0] != "/":
        log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract socket; not notifying", address)
        return False
    message = "\n".join(assignments).encode("utf-8", errors="replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | getattr(socket, "SOCK_CLOEXEC", 0)) as sock:
            sock.connect(address)
            sock.sendall(message)
    except OSError as err:
        log.warning("sd_notify %s failed: %s", ", ".join(a.split("=", 1)[0] for a in assignments), err)
        return False
    return True


def ready(status_text: str | None = None) -> bool:
    """READY=1: start-up is done (for `Type=notify`, systemd counts the unit as started only now)."""
    return notify("READY=1", *_status(status_text))


def ping() -> bool:
    """WATCHDOG=1: the daemon is healthy. Send it at least every `watchdog_interval()` / 2 seconds."""
    return notify("WATCHDOG=1")


def status(text: str) -> bool:
    """STATUS=...: a one-line state for `systemctl status`."""
    return notify(*_status(text))


def stopping(status_text: str | None = None) -> bool:
    """STOPPING=1: shutting down on purpose (systemd stops expecting watchdog pings)."""
    return notify("STOPPING=1", *_status(status_text))


def extend_timeout(seconds: float) -> bool:
    """EXTEND_TIMEOUT_USEC: ask for `seconds` more before the start (or stop) timeout fires, e.g. while a
    long engine build runs before READY=1."""
    return notify(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1_000_000))}")


def watchdog_interval() -> float | None:
    """The watchdog timeout in seconds from `WATCHDOG_USEC`, or None when no watchdog is asked of this process.

    Ping at half of it. `WATCHDOG_PID`, when set, must be our pid (the value is for the main process only).
    """
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number; no watchdog", usec)
        return None
    return value / 1_000_000 if value > 0 else None


def _status(text: str | None) -> list[str]:
    if text is None:
        return []
    return ["STATUS=" + " ".join(text.split())]  # one line: newlines would start a new assignment
