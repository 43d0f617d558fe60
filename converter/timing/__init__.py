"""Timing candidates on this machine: interleaved latency rounds, the rules that stop timing (or building) a
candidate that cannot win, and the head to head of the finalists that decides. Runners in, figures and verdicts
out: nothing here knows what a candidate recipe is."""

from edgefleet.converter.timing import head_to_head
from edgefleet.converter.timing.latency import LatencyStats, interleaved_latency, runtime_changes, settle
from edgefleet.converter.timing.pruning import (
    MIN_EVIDENCE,
    Pruned,
    Pruner,
    TimedRunner,
    retries_cannot_win,
    retries_verdict,
    timing_losers,
)

__all__ = [
    "MIN_EVIDENCE",
    "LatencyStats",
    "Pruned",
    "Pruner",
    "TimedRunner",
    "head_to_head",
    "interleaved_latency",
    "retries_cannot_win",
    "retries_verdict",
    "runtime_changes",
    "settle",
    "timing_losers",
]
