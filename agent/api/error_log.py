"""Errors of the local API in the log, counted and sampled: a flood of failing requests never floods the log.

Each kind of error (the server's last line of defence, a model's failed run, a failed generation) logs its traceback
the first time, then at most once per `every_s` (a minute) per kind, with the count of the ones left out since; every
error is counted (`counts`), whatever was written. A request's answer and the metrics carry the rest.
"""

from __future__ import annotations

import logging
import threading
import time

EVERY_S = 60.0


class SampledLog:
    def __init__(self, log: logging.Logger, every_s: float = EVERY_S) -> None:
        self._log, self._every_s = log, every_s
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}  # kind -> when its next traceback may be written (monotonic)
        self._skipped: dict[str, int] = {}  # kind -> errors not written since the last one
        self.counts: dict[str, int] = {}  # kind -> every error of that kind

    def exception(self, kind: str, message: str, *args: object) -> None:
        """Inside an `except` block: count the error; log it with its traceback when this kind's turn has come."""
        suffix = self._turn(kind)
        if suffix is not None:
            self._log.error(message + suffix, *args, exc_info=True)

    def warning(self, kind: str, message: str, *args: object) -> None:
        """A refused request (the caller's fault, no traceback): counted, and a line when this kind's turn has come."""
        suffix = self._turn(kind)
        if suffix is not None:
            self._log.warning(message + suffix, *args)

    def _turn(self, kind: str) -> str | None:
        """Count one error of `kind`; the suffix to log it with when its turn has come, else None."""
        now = time.monotonic()
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if now < self._next.get(kind, 0.0):
                self._skipped[kind] = self._skipped.get(kind, 0) + 1
                return None
            self._next[kind] = now + self._every_s
            skipped = self._skipped.pop(kind, 0)
        return f" ({skipped} more since the last one, not logged)" if skipped else ""


__all__ = ["EVERY_S", "SampledLog"]
