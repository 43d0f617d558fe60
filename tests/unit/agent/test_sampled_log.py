"""A flood of failing or refused requests is counted, and written to the log once a minute per kind, never a line each
(agent/api/error_log.py; the local API's servers and MQTT inference share it)."""

from __future__ import annotations

import logging

import pytest

from edgefleet.agent.api.error_log import SampledLog


def test_a_flood_of_refusals_writes_one_line_per_kind_and_counts_them_all(caplog: pytest.LogCaptureFixture) -> None:
    errors = SampledLog(logging.getLogger("sampled-test"), every_s=3600)
    with caplog.at_level(logging.WARNING, logger="sampled-test"):
        for n in range(1000):
            errors.warning("bad-request", "refused inference request: %s", n)
        errors.warning("overloaded", "inference queue full; request dropped")
    assert errors.counts == {"bad-request": 1000, "overloaded": 1}
    assert [r.getMessage() for r in caplog.records] == [
        "refused inference request: 0", "inference queue full; request dropped"
    ]  # fmt: skip


def test_the_next_line_of_a_kind_says_how_many_were_left_out(caplog: pytest.LogCaptureFixture) -> None:
    errors = SampledLog(logging.getLogger("sampled-test"), every_s=0.0)
    errors._next["bad-request"] = float("inf")  # this kind's turn has not come: the next three are left out
    with caplog.at_level(logging.WARNING, logger="sampled-test"):
        for _ in range(3):
            errors.warning("bad-request", "refused")
        errors._next["bad-request"] = 0.0  # its turn comes
        errors.warning("bad-request", "refused")
    assert [r.getMessage() for r in caplog.records] == ["refused (3 more since the last one, not logged)"]


def test_a_failure_keeps_its_traceback_when_written(caplog: pytest.LogCaptureFixture) -> None:
    errors = SampledLog(logging.getLogger("sampled-test"), every_s=3600)
    with caplog.at_level(logging.ERROR, logger="sampled-test"):
        for _ in range(5):
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                errors.exception("unanswered", "inference request failed unanswered")
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None
    assert errors.counts == {"unanswered": 5}
