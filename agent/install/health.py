"""Is the committed bundle still good? A pure judgement over what the health check measured."""

from __future__ import annotations

from dataclasses import dataclass

from edgefleet.core.quality.golden import GoldenResult


@dataclass(frozen=True)
class HealthVerdict:
    healthy: bool
    reason: str


def judge_health(
    *,
    files_ok: bool,
    files_reason: str,
    golden: GoldenResult,
    failure_ratio: float,
    requests_seen: int,
    max_failure_ratio: float,
    min_requests: int,
) -> HealthVerdict:
    """Unhealthy when the installed files changed, the golden set fails (under the bundle's task rule where the
    device can compute it, and the per-output checks), or too many valid requests fail; the reason names the rule.

    The failure ratio only counts once `min_requests` valid requests were seen, so one early failure
    cannot roll a device back.
    """
    if not files_ok:
        return HealthVerdict(False, f"installed files changed: {files_reason}")
    if not golden.passed:
        return HealthVerdict(False, f"golden set no longer passes under the {golden.rule}: {golden.reason}")
    if requests_seen >= min_requests and failure_ratio > max_failure_ratio:
        return HealthVerdict(
            False, f"{failure_ratio:.0%} of the last {requests_seen} requests failed (limit {max_failure_ratio:.0%})"
        )
    return HealthVerdict(True, f"healthy (golden set judged by the {golden.rule})")
