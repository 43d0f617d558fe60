"""systemd's notify protocol through the launcher: the launcher is the unit's main process, the agent its child.

With `Type=notify` and `WatchdogSec=`, systemd takes READY=1 and WATCHDOG=1 from the main process only (and names it
in WATCHDOG_PID), so the launcher gives its agent a socket of its own (`launcher/notify.sock` as the agent's
NOTIFY_SOCKET, with the launcher's WATCHDOG_USEC) and forwards what the agent sends: the agent's freeze check
(agent/daemon/watchdog.py) keeps working once it is up. While a new agent starts (a trial, or a restart after a
rollback or a crash) and has not said READY=1 yet, the launcher pings for it: the trial's health deadline, not the
watchdog, decides then. Outside systemd (no NOTIFY_SOCKET) nothing here does anything.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

log = logging.getLogger("edgefleet.launcher")

SOCKET_NAME = "notify.sock"


def _send(address: str, message: bytes) -> None:
    target = "\0" + address[1:] if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(target)
            sock.sendall(message)
    except OSError as err:
        log.warning("sd_notify to systemd failed: %s", err)


class NotifyRelay:
    def __init__(self, directory: Path) -> None:
        self.upstream = os.environ.get("NOTIFY_SOCKET") or None
        usec = os.environ.get("WATCHDOG_USEC", "")
        mine = os.environ.get("WATCHDOG_PID", str(os.getpid())) == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and mine and int(usec) > 0 else None
        self.child_ready = threading.Event()
        self._last_cover = 0.0
        self._sock: socket.socket | None = None
        self.path = directory / SOCKET_NAME
        if self.upstream is None:
            return
        self.path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        threading.Thread(target=self._forward, name="notify-relay", daemon=True).start()

    def child_env(self) -> dict[str, str]:
        """What the agent's environment says about systemd: the relay's socket and the watchdog period."""
        if self._sock is None:
            return {}
        env = {"NOTIFY_SOCKET": str(self.path)}
        if self.watchdog_s is not None:
            env["WATCHDOG_USEC"] = str(int(self.watchdog_s * 1e6))
        return env

    def child_started(self) -> None:
        self.child_ready.clear()

    def cover(self, *, always: bool = False) -> None:
        """Ping the watchdog for an agent that is starting (until it says READY=1), or `always` (a trial)."""
        if self.upstream is None or self.watchdog_s is None or (self.child_ready.is_set() and not always):
            return
        now = time.monotonic()
        if now - self._last_cover >= self.watchdog_s / 4:
            self._last_cover = now
            _send(self.upstream, b"WATCHDOG=1")

    def _forward(self) -> None:
        assert self._sock is not None and self.upstream is not None
        while True:
            try:
                message = self._sock.recv(4096)
            except OSError:
                return
            if b"READY=1" in message.split(b"\n"):
                self.child_ready.set()
            _send(self.upstream, message)


__all__ = ["NotifyRelay"]
