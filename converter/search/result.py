"""What a profile's search found (ProfileSearch), and what the manifest and the report record of it: one Candidate
per build (for the choice), the SearchReport (metric, bar, every candidate's score and latency, threads) and the
AccuracyReport of the shipped candidate. Everything here reads results only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from edgefleet.converter.search.attempts import Attempt
from edgefleet.converter.search.choose import Candidate, Choice
from edgefleet.converter.search.gate import Budget
from edgefleet.converter.search.plan import TargetStatus
from edgefleet.converter.search.types import Built
from edgefleet.converter.timing.head_to_head import HeadToHead
from edgefleet.converter.timing.latency import LatencyStats
from edgefleet.core.bundle.manifest import AccuracyReport, SearchReport
from edgefleet.core.profiles import Profile, Target


@dataclass
class ProfileSearch:
    profile: Profile
    budget: Budget
    metric: str  # the metric's name (converter.search.gate.MetricPlan)
    metric_description: str
    reference: float  # the FP32 model's score under the metric, on the evaluation set
    notes: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    latencies: dict[str, LatencyStats] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    choice: Choice | None = None
    layer_reports: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    threads: list[int] = field(default_factory=list)  # thread counts timed at; the first decides the choice
    by_threads: dict[str, dict[int, LatencyStats]] = field(default_factory=dict)
    prune: bool = True  # converter.timing.pruning: off when devices, not this host, measure the candidates
    stopped: dict[str, str] = field(default_factory=dict)  # timing stopped these (converter.search.timing), and why
    head_to_head: HeadToHead | None = None  # the finalists re-timed together, and the decision

    def winner(self) -> Attempt | None:
        if self.choice is None or self.choice.chosen is None:
            return None
        name = self.choice.chosen.name
        return next(a for a in self.attempts if a.built.spec.name == name)


def candidate_of(attempt: Attempt, latencies: dict[str, LatencyStats], error: str | None = None) -> Candidate:
    """The choice's view of one build; `error` (the time stage's) overrides the build's own."""
    built, target, status = attempt.built, attempt.target, attempt.status
    stats = latencies.get(built.spec.name)
    error = error or built.error
    return Candidate(
        name=built.spec.name,
        precision=built.spec.precision,
        runtime=built.spec.runtime,
        size_bytes=built.size_bytes if error is None else 0,
        accuracy=built.score.value if built.score else None,
        latency_ms=stats.median_ms if stats else None,
        error=error,
        format=built.spec.format,
        provider=target.providers[0] if status.measurable else _proxy(built, status, target),
        measured=status.measurable,
        gate=built.gate or built.golden_refusal,  # a mixed-precision split's gate replaces the build's
        sqnr_db=built.score.sqnr_db if built.score else None,
        max_abs=built.score.max_abs if built.score else None,
        p90_ms=stats.p90_ms if stats else None,
        order=attempt.order,
        bar=built.judged.bar if built.judged else None,
    )


def _proxy(built: Built, status: TargetStatus, target: Target) -> str:
    written = ", graph as written" if built.spec.as_written else ""
    return f"{status.run_on}{written} (proxy for {target.providers[0]})"


def search_report(found: ProfileSearch, chosen: str) -> SearchReport:
    """What the manifest records of the search: metric, bar, every candidate's score and latency, threads, and
    the split that judged each mixed-precision candidate."""
    budget = found.budget
    report = SearchReport(
        metric=found.metric,
        description=found.metric_description,
        bar=budget.floor(found.metric, found.reference),
        min_score=budget.min_score,
        max_drop=None if budget.min_score is not None or found.metric == "sqnr-db" else budget.max_drop,
        scores={c.name: c.accuracy for c in found.candidates if c.accuracy is not None},
        latency_ms={c.name: c.latency_ms for c in found.candidates if c.latency_ms is not None},
        threads=found.threads,
        latency_by_threads={str(t): s.median_ms for t, s in found.by_threads.get(chosen, {}).items()},
    )
    return with_judgements(report, (a.built for a in found.attempts))


def with_judgements(report: SearchReport, built: Iterable[Built]) -> SearchReport:
    """The search report with the split that judged each mixed-precision candidate."""
    judged = {b.spec.name: b.judged.describe() for b in built if b.judged is not None}
    return report.model_copy(update={"judged_on": judged}) if judged else report


def accuracy_report(found: ProfileSearch, built: Built, evaluation_samples: int) -> AccuracyReport:
    """The manifest's accuracy section: the score and the FP32 reference on the data that judged the bundle."""
    assert built.score is not None
    judged = built.judged
    reference = judged.reference if judged is not None else found.reference
    return AccuracyReport(
        metric=found.metric,
        value=built.score.value,
        reference=reference,
        budget=found.budget.allowed_drop(found.metric, reference),
        samples=judged.samples if judged is not None else evaluation_samples,
        passed=True,
        judged_on=judged.describe() if judged is not None else "evaluation set",
        selection_samples=judged.selection_samples if judged is not None else 0,
    )
