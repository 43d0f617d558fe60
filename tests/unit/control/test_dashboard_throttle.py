"""The dashboard's throttle on failed logins and tokens (edgefleet/control/dashboard/auth.py Throttle): free
attempts, then a doubling wait up to a cap; one audit row per source per minute; a success resets the source."""

from __future__ import annotations

from edgefleet.control.dashboard.auth import AUDIT_WINDOW_S, FREE_FAILURES, MAX_BACKOFF_S, Throttle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_source_waits_after_its_free_failures_and_the_wait_doubles_up_to_the_cap() -> None:
    clock = Clock()
    throttle = Throttle(clock)
    for _ in range(FREE_FAILURES - 1):
        throttle.failed("10.0.0.1", "login", "unknown token")
        assert throttle.wait_s("10.0.0.1") == 0
    waits = []
    for _ in range(4):
        throttle.failed("10.0.0.1", "login", "unknown token")
        waits.append(throttle.wait_s("10.0.0.1"))
    assert waits == [1.0, 2.0, 4.0, 8.0]
    for _ in range(2000):  # never overflows, never past the cap
        throttle.failed("10.0.0.1", "login", "unknown token")
    assert throttle.wait_s("10.0.0.1") == MAX_BACKOFF_S
    assert throttle.wait_s("10.0.0.2") == 0, "another source is not affected"
    throttle.succeeded("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0


def test_failures_are_written_once_per_window_with_their_count() -> None:
    clock = Clock()
    throttle = Throttle(clock)
    first = throttle.failed("10.0.0.1", "login", "unknown token")
    assert first is not None and first.count == 1
    assert all(throttle.failed("10.0.0.1", "login", "unknown token") is None for _ in range(99))
    assert throttle.flush() == [], "the window is still open"
    clock.now += AUDIT_WINDOW_S
    (summary,) = throttle.flush()
    assert (summary.remote, summary.count, summary.reason) == ("10.0.0.1", 99, "unknown token")
    assert throttle.flush() == []
