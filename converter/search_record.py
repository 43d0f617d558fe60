"""What the search records of its candidates: one Candidate per build (for the choice), and the manifest's
SearchReport (metric, bar, every candidate's score and latency, threads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefleet.converter.accuracy import Budget
from edgefleet.converter.candidates import Built
from edgefleet.converter.context import Context
from edgefleet.converter.measure import LatencyStats
from edgefleet.converter.recipes import Candidate
from edgefleet.converter.targets import TargetStatus
from edgefleet.core.manifest import SearchReport
from edgefleet.core.profiles import Target

if TYPE_CHECKING:
    from edgefleet.converter.search import ProfileSearch


def candidate_of(
    built: Built, target: Target, status: TargetStatus, order: int, lat: dict[str, LatencyStats]
) -> Candidate:
    stats = lat.get(built.spec.name)
    return Candidate(
        name=built.spec.name,
        precision=built.spec.precision,
        runtime=built.spec.runtime,
        size_bytes=built.size_bytes if built.error is None else 0,
        accuracy=built.score.value if built.score else None,
        latency_ms=stats.median_ms if stats else None,
        error=built.error,
        format=built.spec.format,
        provider=target.providers[0] if status.measurable else _proxy(built, status, target),
        measured=status.measurable,
        gate=built.gate,
        sqnr_db=built.score.sqnr_db if built.score else None,
        max_abs=built.score.max_abs if built.score else None,
        p90_ms=stats.p90_ms if stats else None,
        order=order,
        bar=built.judged.bar if built.judged else None,
    )


def _proxy(built: Built, status: TargetStatus, target: Target) -> str:
    written = ", graph as written" if built.spec.as_written else ""
    return f"{status.run_on}{written} (proxy for {target.providers[0]})"


def search_report(ctx: Context, found: ProfileSearch, budget: Budget, chosen: str) -> SearchReport:
    """What the manifest records of the search: metric, bar, every candidate's score and latency, threads."""
    bar = budget.floor(ctx.plan.name, ctx.ref_value)
    return SearchReport(
        metric=ctx.plan.name,
        description=ctx.plan.metric.description,
        bar=bar,
        min_score=budget.min_score,
        max_drop=None if budget.min_score is not None or ctx.plan.name == "sqnr-db" else budget.max_drop,
        scores={c.name: c.accuracy for c in found.candidates if c.accuracy is not None},
        latency_ms={c.name: c.latency_ms for c in found.candidates if c.latency_ms is not None},
        threads=found.threads,
        latency_by_threads={str(t): s.median_ms for t, s in found.by_threads.get(chosen, {}).items()},
    )
