"""Evidence before a device passes: what it reports must be something it could have measured.

A device's telemetry is its own word. The host cannot see inside it, but it holds evidence of its own to weigh
the word against (`BundleFacts`, recorded at publish): the bundle's bytes on the wire, its measured latency,
its golden outputs. A device of a wave counts as judged only when each holds:

1. **fetched**: its link counters (the agent's bundle bytes received, `Telemetry.link.bulk_bytes`) grew, between
   its last report before the deployment and its latest after the commit, by at least the bytes the bundle needs
   on the wire, less the chunks it already held (those of bundles the store records it committing, by their
   signed offers). A device that ran the bundle before the wave fetches nothing;
2. **in time**: its commit reached the host after the deployment, no sooner than fetching those bytes at
   `max_link_bytes_per_s` and running the golden set `max_speedup` times faster than the bundle's measurement
   allow;
3. **at a plausible speed**: its p50 and p95 are no more than `max_speedup` times below the bundle's own measured
   latency for its profile (the farm's devices of that profile, else the build), and p50 ≤ p95;
4. **golden as computed**: every golden report names exactly the bundle's outputs, and each score (and its
   max-abs error and SQNR) lies in the band outputs within the manifest's tolerance of the build's own can
   reach (`golden_bands`).

A check that fails is a named guardrail failure, "implausible report: …", never a pass. A check that lacks
data is pending like any criterion: the wave waits, and fails "no data for evidence: …" when time is up. This
criterion cannot be allowed unjudged. What it can and cannot catch is in docs/control-plane.md: it catches a
device that claims a commit it did not fetch, a latency it cannot have, or golden scores its bundle cannot
give; a device that lies consistently (counts bytes it never fetched, reports a latency inside the band, scores
inside the bands) is not caught by evidence the device itself supplies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.judge.evidence import Finding, Metrics, Thresholds
from edgefleet.core.messages import OutputScore
from edgefleet.core.quality.output_rules import agreement_of

IMPLAUSIBLE = "implausible report: "


@dataclass(frozen=True)
class LinkSample:
    """A device's link counters in one report: bundle bytes received since its agent started."""

    bulk_bytes: int
    clock_s: float  # the agent's monotonic clock
    received_at: float | None = None  # host clock, when known


@dataclass(frozen=True)
class InstallEvidence:
    """What the host holds about one device's install of one bundle (host clock unless said otherwise)."""

    deployed_at: float  # when the host deployed the bundle to the device
    committed_at: float | None  # when the device's "committed" event for it arrived (None: none yet)
    link_before: LinkSample | None  # its last link counters received before the deployment
    link_after: LinkSample | None  # its latest link counters, received after the commit
    needed_bytes: int  # what the bundle needs on the wire for this device (`BundleFacts.needed_bytes`)
    already_ran: bool = False  # it ran the bundle before the wave: nothing to fetch, no commit to time


@dataclass(frozen=True)
class GoldenReport:
    """One report's golden figures: per-output scores and the legacy lowest agreement."""

    scores: tuple[OutputScore, ...]
    agreement: float | None


@dataclass
class _Verdict:
    bad: list[str]
    lacking: list[str]
    good: list[str]


def judge_evidence(
    facts: BundleFacts | None, install: InstallEvidence, observed: Metrics, golden: Sequence[GoldenReport],
    profile: str | None, t: Thresholds, final: bool = True,
) -> Finding:  # fmt: skip
    """One finding (criterion "evidence") for one device of a wave: ok, implausible, or pending. Before the
    observe window ends (`final` False) link counters short of the bundle's bytes wait for a later report: one
    built during the download may arrive after the commit."""
    if facts is None:
        return Finding(
            criterion="evidence", ok=None, pending=True,
            detail=f"not judged: the store holds no facts of bundle {observed.bundle_id} to weigh the reports "
            "against (it is recorded when `edgefleet rollout start` or `publish` publishes the bundle)",
        )  # fmt: skip
    v = _Verdict([], [], [])
    _fetched(install, v, final)
    _in_time(facts, install, profile, t, v)
    _speed(facts, observed, profile, t, v)
    _golden(facts, golden, v)
    if v.bad:
        return Finding(criterion="evidence", ok=False, detail=IMPLAUSIBLE + "; ".join(v.bad))
    if v.lacking:
        return Finding(criterion="evidence", ok=None, pending=True, detail="not judged: " + "; ".join(v.lacking))
    return Finding(criterion="evidence", ok=True, detail="evidence holds: " + "; ".join(v.good))


def _fetched(install: InstallEvidence, v: _Verdict, final: bool) -> None:
    if install.already_ran:
        v.good.append("ran the bundle before the wave")
        return
    after, before = install.link_after, install.link_before
    need = install.needed_bytes
    if after is None:
        v.lacking.append("no link counters reported since the commit")
        return
    if before is not None and after.bulk_bytes < before.bulk_bytes:
        v.lacking.append(
            "its link counters restarted (an agent restart) between the deployment and the commit, so the fetch "
            "cannot be shown"
        )
        return
    fetched = after.bulk_bytes - (before.bulk_bytes if before is not None else 0)
    if fetched < need and not final:
        v.lacking.append(f"its link counters show {fetched} of the {need} bytes the bundle needs so far")
    elif fetched < need:
        when = ""
        if before is not None and before.received_at is not None and after.received_at is not None:
            when = (f" (reports received {install.deployed_at - before.received_at:.1f} s before the deployment and "
                    f"{after.received_at - install.deployed_at:.1f} s after it)")  # fmt: skip
        v.bad.append(f"committed having fetched {fetched} bytes by its link counters{when}; the bundle needs {need}")
    else:
        v.good.append(f"fetched {fetched} bytes (≥ {need} needed)")


def _min_install_s(facts: BundleFacts, install: InstallEvidence, profile: str | None, t: Thresholds) -> float:
    """The least time an install can take: the fetch at the link ceiling, the golden set at the speed ceiling."""
    least = install.needed_bytes / t.max_link_bytes_per_s
    measured = facts.measured_latency(profile)
    if measured is not None and t.max_speedup is not None and facts.golden_count:
        least += facts.golden_count * measured[0] / 1000.0 / t.max_speedup
    return least


def _in_time(facts: BundleFacts, install: InstallEvidence, profile: str | None, t: Thresholds, v: _Verdict) -> None:
    if install.already_ran:
        return
    if install.committed_at is None:
        v.lacking.append('no "committed" event received')
        return
    took = install.committed_at - install.deployed_at
    least = _min_install_s(facts, install, profile, t)
    if took < 0:
        v.bad.append(f"its commit arrived {-took:.3f} s before the host deployed the bundle")
    elif took < least:
        v.bad.append(f"committed {took * 1000:.1f} ms after the deployment; fetching and checking it takes at least "
                     f"{least * 1000:.1f} ms")  # fmt: skip
    else:
        v.good.append(f"committed {took:.2f} s after the deployment")


def _speed(facts: BundleFacts, observed: Metrics, profile: str | None, t: Thresholds, v: _Verdict) -> None:
    p50, p95 = observed.p50_ms, observed.p95_ms
    if p50 is not None and p95 is not None and p50 > p95 * 1.001 + 1e-6:
        v.bad.append(f"p50 {p50:.3f} ms above its p95 {p95:.3f} ms")
        return
    measured = facts.measured_latency(profile)
    if measured is None or t.max_speedup is None:
        return  # nothing to weigh the latency against; the latency criterion still judges it
    if p95 is None:
        v.lacking.append("no latency reported on the new bundle yet")
        return
    reference, _, where = measured
    floor = reference / t.max_speedup
    fast = [(name, value) for name, value in (("p50", p50), ("p95", p95)) if value is not None and value < floor]
    if fast:
        name, value = fast[0]
        v.bad.append(
            f"{name} {value:.3f} ms is more than {t.max_speedup:g}× faster than the bundle's {reference:.3f} ms "
            f"measured by {where}"
        )
    else:
        v.good.append(f"p95 {p95:.3f} ms plausible against {reference:.3f} ms measured by {where}")


def _golden(facts: BundleFacts, reports: Sequence[GoldenReport], v: _Verdict) -> None:
    if not facts.golden:
        return  # the bundle carries no golden outputs to weigh against
    if not reports:
        v.lacking.append("no golden result reported on the new bundle yet")
        return
    want = set(facts.golden)
    band = facts.agreement_band()
    for report in reports:
        if not report.scores:  # an agent that reports the legacy figure alone: a failure is the golden criterion's
            claimed = report.agreement
            if claimed is not None and band is not None and claimed > band.hi and not band.holds(claimed):
                v.bad.append(f"golden agreement {report.agreement:.4f} is above {band.hi:.4g}, the most outputs "
                             "within the bundle's tolerance of its own golden outputs can score")  # fmt: skip
                return
            continue
        if not all(s.passed for s in report.scores):
            continue  # a failed check: the golden criterion judges that
        named = {s.output for s in report.scores}
        if named != want:
            v.bad.append(
                f"golden scores name outputs {', '.join(sorted(named))[:200]}; the bundle's golden set has "
                f"{', '.join(sorted(want))}"
            )
            return
        for score in report.scores:
            problem = _outside(facts, score)
            if problem:
                v.bad.append(problem)
                return
        if report.agreement is not None and band is not None and not band.holds(report.agreement):
            v.bad.append(f"golden agreement {report.agreement:.4f} is outside {band}, what outputs within the "
                         "bundle's tolerance of its own golden outputs can score")  # fmt: skip
            return
    v.good.append(f"golden scores inside the bands of the bundle's {len(want)} golden output(s)")


def _outside(facts: BundleFacts, score: OutputScore) -> str | None:
    bands = facts.golden[score.output]
    name = f"output {score.output}"
    if bands.score is not None and not bands.score.holds(score.score):
        return f"{name} {score.rule} score {score.score:.4f} is outside {bands.score}, what its golden outputs allow"
    if not bands.agreement.holds(agreement_of(score)):
        return f"{name} agreement {agreement_of(score):.4f} is outside {bands.agreement}"
    for key, band in (("max_abs", bands.max_abs), ("sqnr_db", bands.sqnr_db)):
        if band is None:
            continue
        value = score.detail.get(key)
        if value is None:
            return f"{name} reports no {key}, which every float output's check measures"
        if not band.holds(value):
            return f"{name} {key} {value:.4g} is outside {band}, what its golden outputs allow"
    return None


__all__ = ["IMPLAUSIBLE", "GoldenReport", "InstallEvidence", "LinkSample", "judge_evidence"]
