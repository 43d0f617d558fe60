"""The health of the control plane's own loops: the rollout engine, the desired-state sync, the broker-rights sync
(on the engine lease holder), and ingestion, compaction (downsampling), retention (by age) and the per-device
storage quota (on every instance that ingests). Compaction, retention and the quota are separate loops, so one
failing (a report the store cannot sum, say) never skips another, and each is seen failing on its own.

Each loop catches what one rollout or one device raises (that step fails, with the reason) and goes on; its
`LoopHealth` is how an operator sees that it does, and that it still completes at all:

- `LoopHealth`: when the loop last completed, its errors in the last minute and the last one. Thread-safe: the
  loop's thread writes it, readers read it.
- `HealthBoard`: one instance's loops, written to the store every few seconds by a thread of their own (so a loop
  that hangs is seen as stalled while its process lives), read back by `edgefleet control status`, the
  dashboard's header and `/metrics` of any instance.
- `judge(row, now)`: the one rule every reader applies. A loop is *stalled* when it has neither completed nor
  failed a pass for `STALL_INTERVALS` of its intervals (at least `STALL_FLOOR_S`; plus `WRITE_EVERY_S`, the age of a
  row when it is read), or when its instance stopped writing its rows (a loop whose every pass fails still runs: it
  is failing, not stalled, however long it fails); *failing* when it caught errors in
  the last minute, *standby* when it does not run in that instance (not the lease holder), else *ok*. An instance
  silent for `GONE_AFTER_S` is *gone* (killed without a clean stop, or its machine lost): shown, never counted
  as unwell, dropped after a day.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgefleet.control.store import ComponentHealthRow, Store
from edgefleet.core.untrusted import safe_text

WINDOW_S = 60.0
STALL_INTERVALS = 3  # a loop that has not completed for this many intervals has stalled
STALL_FLOOR_S = 5.0  # ... and for at least this long (a sub-second tick is not judged on scheduling jitter)
WRITE_EVERY_S = 2.0  # how often an instance writes its rows (a reader's view of a loop is this much older)
GONE_AFTER_S = 600.0  # an instance silent this long is gone (stopped without a clean exit), not stalled
FORGET_AFTER_S = 86400.0  # rows of an instance silent this long are dropped

ENGINE, DESIRED_SYNC, RIGHTS_SYNC, INGEST = "rollout-engine", "desired-sync", "rights-sync", "ingest"
COMPACTION, RETENTION, QUOTA = "compaction", "retention", "store-quota"
ENGINE_LOOPS = (ENGINE, DESIRED_SYNC, RIGHTS_SYNC)  # run on the engine lease holder only
STORE_LOOPS = (COMPACTION, RETENTION, QUOTA)  # run beside ingestion, each in its own thread
COMPONENTS = (*ENGINE_LOOPS, INGEST, *STORE_LOOPS)  # ingest and the store loops run on every instance that ingests
INGEST_INTERVAL_S = 10.0  # ingest completes when a batch is stored or nothing waits: stalled when behind 30 s

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthSnapshot:
    last_tick: float | None  # when it last completed (None: never)
    errors_per_min: int  # errors caught in the last minute
    last_error: str  # the latest ("" when none)
    last_error_at: float | None


class LoopHealth:
    """One loop's record. `active` is False while the loop does not run here (another instance leads)."""

    def __init__(self, name: str, interval_s: float, *, active: bool = True, now: float | None = None) -> None:
        self.name, self.interval_s = name, interval_s
        self._lock = threading.Lock()
        self._errors: deque[float] = deque(maxlen=10_000)
        self._last_tick: float | None = None
        self._last_error = ""
        self._last_error_at: float | None = None
        self._active = active
        self._active_since: float | None = (time.time() if now is None else now) if active else None

    def ticked(self, now: float) -> None:
        with self._lock:
            self._last_tick = now

    def failed(self, now: float, error: str) -> None:
        with self._lock:
            self._errors.append(now)
            self._last_error, self._last_error_at = safe_text(error, 300), now

    def set_active(self, active: bool, now: float) -> None:
        with self._lock:
            if active and not self._active:
                self._active_since = now
            elif not active:
                self._active_since = None
            self._active = active

    def snapshot(self, now: float) -> HealthSnapshot:
        with self._lock:
            recent = sum(1 for t in self._errors if now - t <= WINDOW_S)
            return HealthSnapshot(self._last_tick, recent, self._last_error, self._last_error_at)

    def row(self, holder: str, now: float) -> ComponentHealthRow:
        snap = self.snapshot(now)
        with self._lock:
            active, since = self._active, self._active_since
        return ComponentHealthRow(
            self.name, holder, self.interval_s, snap.last_tick, snap.errors_per_min, snap.last_error,
            snap.last_error_at, active, since, now,
        )  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    state: str  # "ok", "failing", "stalled", "standby", "gone"
    text: str  # one line for a person


def stall_limit(interval_s: float) -> float:
    """How long a loop of this interval may go without completing before a reader calls it stalled."""
    return max(STALL_INTERVALS * interval_s, STALL_FLOOR_S) + WRITE_EVERY_S


def judge(row: ComponentHealthRow, now: float) -> Verdict:
    """The state of one loop of one instance, by the rule in this module's docstring."""
    limit = stall_limit(row.interval_s)
    silent = now - row.updated_at
    if silent > GONE_AFTER_S:
        return Verdict("gone", f"instance {row.holder} has not reported for {silent:.0f} s (no clean stop)")
    if silent > max(STALL_INTERVALS * WRITE_EVERY_S, limit):
        return Verdict("stalled", f"instance {row.holder} has not reported its loops for {silent:.0f} s")
    if not row.active:
        return Verdict("standby", "runs on the engine lease holder only")
    since = row.last_tick if row.last_tick is not None else row.active_since
    if row.last_error_at is not None and (since is None or row.last_error_at > since):
        since = row.last_error_at  # a pass that failed is a pass: the loop runs, and reads failing below
    if since is not None and now - since > limit:
        what = "completed" if row.last_tick is not None else "completed once since it started"
        return Verdict("stalled", f"not {what} for {now - since:.0f} s (its interval is {row.interval_s:g} s)")
    if row.errors_per_min:
        return Verdict("failing", f"{row.errors_per_min} errors in the last minute; last: {row.last_error}")
    return Verdict("ok", "last completed " + (f"{now - row.last_tick:.1f} s ago" if row.last_tick else "never"))


def health_report(store: Store, now: float | None = None) -> list[dict[str, object]]:
    """Every instance's loops with their verdicts (JSON-ready): what `control status`, the dashboard and
    /metrics show."""
    now = time.time() if now is None else now
    out: list[dict[str, object]] = []
    for row in store.repos.health.health(now - FORGET_AFTER_S):
        verdict = judge(row, now)
        out.append({
            "component": row.component, "instance": row.holder, "state": verdict.state, "detail": verdict.text,
            "interval_s": row.interval_s, "last_tick": row.last_tick, "errors_per_min": row.errors_per_min,
            "last_error": row.last_error, "last_error_at": row.last_error_at, "active": row.active,
            "reported_at": row.updated_at,
        })  # fmt: skip
    return out


def worst(report: Sequence[dict[str, object]]) -> str:
    """The fleet-wide summary of `health_report`: stalled > failing > ok (standby and gone rows do not count); "unknown"
    when no instance reported an active loop."""
    states = {str(r["state"]) for r in report if r["state"] not in ("standby", "gone")}
    for state in ("stalled", "failing", "ok"):
        if state in states:
            return state
    return "unknown"


def engine_summary(
    lease: tuple[str, float] | None, report: Sequence[dict[str, object]], now: float
) -> dict[str, object]:
    """The engine in one record: who holds its lease, whether the lease is live, and the state of the holder's
    loops ("running" only when the lease is live and none of its loops has stalled)."""
    if lease is None:
        return {"holder": None, "alive": False, "state": "never ran", "detail": "no instance has held the lease"}
    holder, alive = lease[0], lease[1] > now
    mine = [r for r in report if r["instance"] == holder and r["component"] in ENGINE_LOOPS and r["state"] != "standby"]
    stalled = [r for r in mine if r["state"] == "stalled"]
    failing = [r for r in mine if r["state"] == "failing"]
    if not alive:
        state, detail = "not running", "the engine lease lapsed"
    elif stalled:
        state, detail = "stalled", "; ".join(f"{r['component']}: {r['detail']}" for r in stalled)
    elif failing:
        state, detail = "failing", "; ".join(f"{r['component']}: {r['detail']}" for r in failing)
    else:
        state, detail = "running", "every loop completes" if mine else "its loops have not reported yet"
    return {"holder": holder, "alive": alive, "state": state, "detail": detail}


class HealthBoard:
    """One instance's loops, written to the store every `WRITE_EVERY_S` by `run` (its own thread)."""

    def __init__(self, store: Store, holder: str, loops: Sequence[LoopHealth],
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.store, self.holder, self.loops, self.clock = store, holder, list(loops), clock

    def loop(self, name: str) -> LoopHealth:
        return next(h for h in self.loops if h.name == name)

    def write(self) -> None:
        now = self.clock()
        self.store.repos.health.put_health([h.row(self.holder, now) for h in self.loops])

    def run(self, stop: threading.Event) -> None:
        forgot = logged = 0.0
        while not stop.is_set():
            try:
                self.write()
                if time.monotonic() - forgot > 3600.0:
                    forgot = time.monotonic()
                    self.store.repos.health.forget_health(self.clock() - FORGET_AFTER_S)
            except Exception as err:  # a store that is away: readers see this instance's rows age into "stalled"
                if time.monotonic() - logged > 60.0:
                    logged = time.monotonic()
                    log.warning("writing the loop health failed (repeats within a minute not logged): %s",
                                err)  # fmt: skip
            stop.wait(WRITE_EVERY_S)


__all__ = [
    "COMPACTION",
    "COMPONENTS",
    "DESIRED_SYNC",
    "ENGINE",
    "ENGINE_LOOPS",
    "INGEST",
    "INGEST_INTERVAL_S",
    "QUOTA",
    "RETENTION",
    "RIGHTS_SYNC",
    "STALL_INTERVALS",
    "STORE_LOOPS",
    "HealthBoard",
    "HealthSnapshot",
    "LoopHealth",
    "Verdict",
    "engine_summary",
    "health_report",
    "judge",
    "stall_limit",
    "worst",
]
