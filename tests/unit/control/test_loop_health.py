"""The one rule every reader applies to a control-plane loop (edgefleet/control/health.py): ok, failing (errors
in the last minute), stalled (neither a completed nor a failed pass for 3 intervals, at least 5 s, or an instance
silent), standby."""

from __future__ import annotations

from edgefleet.control.health import (
    ENGINE,
    STALL_FLOOR_S,
    WRITE_EVERY_S,
    LoopHealth,
    engine_summary,
    judge,
    stall_limit,
)


def row_at(health: LoopHealth, now: float, written: float | None = None):  # type: ignore[no-untyped-def]
    row = health.row("host:1:main", now if written is None else written)
    return row


def test_a_loop_that_completes_is_ok_and_one_that_catches_errors_is_failing() -> None:
    loop = LoopHealth(ENGINE, 1.0, now=100.0)
    loop.ticked(100.5)
    assert judge(row_at(loop, 101.0), 101.0).state == "ok"
    loop.failed(101.0, "rollout r1: the store is away\nsecond line")
    verdict = judge(row_at(loop, 101.5), 101.5)
    assert verdict.state == "failing" and "the store is away" in verdict.text and "\n" not in verdict.text
    assert judge(row_at(loop, 170.0), 170.0).state == "stalled", "no completion for a minute"
    loop.ticked(170.0)
    assert judge(row_at(loop, 170.5), 170.5).state == "ok", "errors older than a minute no longer count"


def test_a_loop_whose_every_pass_fails_reads_failing_however_long_and_stalled_once_it_stops() -> None:
    """The desired-state sync against a broker that refuses every document: it runs, each pass fails. It was read
    "stalled" once its stall limit had passed since it started (7 s at a 1 s interval), and the dashboard and
    `control status` disagreed depending on when each asked."""
    loop = LoopHealth(ENGINE, 1.0, now=0.0)
    for second in range(1, 60):
        loop.failed(float(second), "the broker refused the documents")
        verdict = judge(row_at(loop, second + 0.5), second + 0.5)
        assert verdict.state == "failing" and "refused" in verdict.text, (second, verdict)
    verdict = judge(row_at(loop, 60.0 + STALL_FLOOR_S + WRITE_EVERY_S), 60.0 + STALL_FLOOR_S + WRITE_EVERY_S)
    assert verdict.state == "stalled", "no pass at all, neither completed nor failed, since its last error"


def test_stalled_after_three_intervals_with_a_floor_and_the_age_of_a_row() -> None:
    assert stall_limit(1.0) == STALL_FLOOR_S + WRITE_EVERY_S
    assert stall_limit(10.0) == 30.0 + WRITE_EVERY_S
    loop = LoopHealth(ENGINE, 10.0, now=0.0)
    loop.ticked(0.0)
    assert judge(row_at(loop, 31.0), 31.0).state == "ok"
    assert judge(row_at(loop, 33.0), 33.0).state == "stalled"


def test_a_loop_that_never_completed_is_measured_from_when_it_became_active() -> None:
    loop = LoopHealth(ENGINE, 1.0, active=False, now=0.0)
    assert judge(row_at(loop, 50.0), 50.0).state == "standby"
    loop.set_active(True, 50.0)
    assert judge(row_at(loop, 53.0), 53.0).state == "ok"
    verdict = judge(row_at(loop, 60.0), 60.0)
    assert verdict.state == "stalled" and "since it started" in verdict.text


def test_an_instance_that_stopped_writing_reads_stalled_whatever_it_last_said() -> None:
    loop = LoopHealth(ENGINE, 1.0, now=0.0)
    loop.ticked(10.0)
    verdict = judge(row_at(loop, 100.0, written=10.0), 100.0)
    assert verdict.state == "stalled" and "has not reported" in verdict.text


def test_the_engine_runs_only_with_a_live_lease_and_no_stalled_loop() -> None:
    ok = {"instance": "a", "component": ENGINE, "state": "ok", "detail": "fine"}
    stalled = ok | {"state": "stalled", "detail": "not completed for 9 s"}
    assert engine_summary(None, [], 0.0)["state"] == "never ran"
    assert engine_summary(("a", 10.0), [ok], 20.0)["state"] == "not running"
    assert engine_summary(("a", 10.0), [ok], 5.0)["state"] == "running"
    assert engine_summary(("a", 10.0), [stalled], 5.0)["state"] == "stalled"
    assert engine_summary(("a", 10.0), [stalled | {"instance": "b"}], 5.0)["state"] == "running", "not the holder"


def test_an_instance_silent_for_ten_minutes_is_gone_and_not_counted_as_unwell() -> None:
    from edgefleet.control.health import GONE_AFTER_S, worst

    loop = LoopHealth(ENGINE, 1.0, now=0.0)
    loop.ticked(10.0)
    verdict = judge(row_at(loop, 0.0, written=10.0), 10.0 + GONE_AFTER_S + 1)
    assert verdict.state == "gone"
    assert worst([{"state": "gone"}, {"state": "ok"}]) == "ok"
    assert worst([{"state": "gone"}, {"state": "stalled"}]) == "stalled"
