"""Choosing a profile's recipe by what devices of that profile measured (`edgefleet convert --measure-on`).

After the local search, every candidate that passed the accuracy gates is written as a signed benchmark-only bundle
and handed to a `Farm` (edgefleet/control/farm/service.py `FleetFarm`: publish, ask the online devices of the profile,
wait with a deadline). The choice is then made again by the devices' figures instead of this host's timing:

- The figure per candidate is the median over the devices of each device's p50 (the median of its individually
  timed calls). p50, not a tail: the measuring worker runs beside the device's own serving, under a CPU share, so
  its tail says more about what else ran on the device at that moment than about the candidate; the host's own
  choice is by medians too. The median over devices, so one busy or odd device does not decide for the fleet.
- A candidate that a device could not run, or whose outputs left the golden set's tolerance there, is rejected
  with the device's reason.
- No device answered in time (or every one refused): the profile keeps its local timing, or its preference order
  where nothing was timed here, and the notes say so, naming the silent devices. Devices that answered decide
  even when others were silent; the silent ones are named in the notes and the manifest.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from edgefleet.converter.search.choose import Candidate, choose
from edgefleet.converter.search.plan import TargetStatus
from edgefleet.converter.search.request import Progress
from edgefleet.converter.search.result import ProfileSearch
from edgefleet.converter.search.types import Built
from edgefleet.core.bundle.manifest import DeviceMeasurement, FarmReport, LatencyReport
from edgefleet.core.errors import EdgefleetError, UserInputError
from edgefleet.core.farm_messages import BenchmarkResult, CandidateFigures, FarmAnswer
from edgefleet.core.profiles import Target

STATISTIC = "median over the devices of each device's p50 (ms)"


class Farm(Protocol):
    def measure(self, profile: str, bundles: Sequence[Path], progress: Progress) -> FarmAnswer:
        """Have online devices that run `profile` measure these benchmark-only bundles; wait with a deadline."""
        ...


# (the built candidate, its target, its status) -> (the signed benchmark-only bundle, its bundle id)
WriteCandidate = Callable[[Built, Target, TargetStatus], tuple[Path, str]]


@dataclass
class Decision:
    """The candidates with the devices' figures in place of the host's, and what to record."""

    candidates: list[Candidate]
    per_device: dict[str, list[DeviceMeasurement]]  # candidate -> each device's figures, for the manifest
    notes: list[str]
    decided: bool  # False: the devices gave nothing to choose by; the local choice stands


def eligible(candidates: Sequence[Candidate], *, reference: float, max_drop: float, size_limit_bytes: int) -> list[str]:
    """The names of the candidates that pass the accuracy gates and the size limit, whatever their latency."""
    limits = {"reference": reference, "max_drop": max_drop, "size_limit_bytes": size_limit_bytes}
    return [c.name for c in candidates if choose([replace(c, measured=False)], **limits).chosen is not None]  # type: ignore[arg-type]


def decide(candidates: Sequence[Candidate], names: dict[str, str], answer: FarmAnswer) -> Decision:
    """Pure: put the devices' figures (`answer`, keyed by bundle id; `names`: bundle id -> candidate) in place of the
    host's timing of the measured candidates."""
    notes = list(answer.notes)
    if answer.silent:
        notes.append(f"no answer in time from {', '.join(answer.silent)}")
    answered = {d: r for d, r in sorted(answer.results.items()) if r.ok}
    for device, result in sorted(answer.results.items()):
        if not result.ok:
            notes.append(f"device {device} refused to measure: {result.error}")
    figures: dict[str, list[tuple[BenchmarkResult, CandidateFigures]]] = {name: [] for name in names.values()}
    for result in answered.values():
        for fig in result.candidates:
            if fig.bundle_id in names:
                figures[names[fig.bundle_id]].append((result, fig))
    if not any(fig.ok and fig.p50_ms is not None for pairs in figures.values() for _, fig in pairs):
        why = "no device measured any candidate"
        if not answer.results:
            why = "no device answered in time" if answer.silent else "no device was asked"
        notes.append(f"{why}: the choice stays on this host's timing (or the profile's order where none)")
        return Decision(list(candidates), {}, notes, decided=False)
    updated, per_device = [], {}
    for cand in candidates:
        pairs = figures.get(cand.name)
        if pairs is None:
            updated.append(cand)  # not sent: it failed the gates, which reject it again
            continue
        failed = [(r.device_id, f.error or "outputs outside the golden set's tolerance") for r, f in pairs
                  if not f.ok or f.golden_passed is False or f.p50_ms is None]  # fmt: skip
        if failed:
            device, error = failed[0]
            updated.append(replace(cand, error=f"on device {device}: {error}", latency_ms=None))
            continue
        if not pairs:
            updated.append(replace(cand, measured=False, latency_ms=None, p90_ms=None))
            continue
        per_device[cand.name] = [_measurement(r, f) for r, f in pairs]
        provider = Counter(f.provider for _, f in pairs if f.provider).most_common(1)
        updated.append(replace(
            cand, measured=True, latency_ms=_median([f.p50_ms for _, f in pairs]),
            p90_ms=_median([f.p90_ms for _, f in pairs]),
            provider=f"{provider[0][0]} (on {len(pairs)} device(s))" if provider else cand.provider,
        ))  # fmt: skip
    return Decision(updated, per_device, notes, decided=True)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _measurement(result: BenchmarkResult, fig: CandidateFigures) -> DeviceMeasurement:
    return DeviceMeasurement(
        device_id=result.device_id, profile=result.profile, provider=fig.provider, threads=fig.threads,
        cpu_share=result.cpu_share, measured_at=datetime.fromtimestamp(result.measured_at, timezone.utc),
        p50_ms=fig.p50_ms, p90_ms=fig.p90_ms, p99_ms=fig.p99_ms, load_ms=fig.load_ms, peak_rss_mb=fig.peak_rss_mb,
    )  # fmt: skip


def choose_on_devices(
    found: ProfileSearch, farm: Farm, write: WriteCandidate, progress: Progress
) -> tuple[ProfileSearch, FarmReport | None]:
    """Send the profile's gated candidates to the farm and choose again by the devices' figures: the search with
    the devices' candidates, choice and notes, and the report for the manifest (None when the local choice
    stands; the search then keeps its choice, with notes saying why)."""
    found = replace(found, notes=list(found.notes))
    limits = {
        "reference": found.reference,
        "max_drop": found.budget.allowed_drop(found.metric, found.reference),
        "size_limit_bytes": int(found.profile.size_limit_mb * 1e6),
    }
    local = found.choice.chosen.name if found.choice and found.choice.chosen else None
    names = set(eligible(found.candidates, **limits))  # type: ignore[arg-type]
    if not names:
        return found, None
    by_id: dict[str, str] = {}
    bundles: list[Path] = []
    for attempt in found.attempts:
        built = attempt.built
        if built.spec.name in names and built.spec.name not in by_id.values():
            progress(f"{found.profile.name}: signing candidate {built.spec.name} for the devices")
            path, bundle_id = write(built, attempt.target, attempt.status)
            by_id[bundle_id] = built.spec.name
            bundles.append(path)
    progress(f"{found.profile.name}: {len(bundles)} candidate(s) measured on the devices")
    try:
        answer = farm.measure(found.profile.name, bundles, progress)
    except UserInputError:
        raise
    except EdgefleetError as err:  # the broker went away, a grant was refused: the local choice stands
        found.notes.append(f"devices: not measured ({type(err).__name__}: {err}); the choice stays on this host's")
        return found, None
    decision = decide(found.candidates, by_id, answer)
    found.notes.extend(f"devices: {note}" for note in decision.notes)
    if not decision.decided:
        return found, None
    found.candidates = decision.candidates
    found.choice = choose(found.candidates, **limits)  # type: ignore[arg-type]
    chosen = found.choice.chosen
    if chosen is None or chosen.name not in decision.per_device:
        found.notes.append("devices: no candidate the devices measured passed there")
        return found, None
    devices = decision.per_device[chosen.name]
    when = max(d.measured_at for d in devices).isoformat(timespec="seconds")
    found.notes.append(
        f"devices: chose {chosen.name} by the {STATISTIC} on {', '.join(d.device_id for d in devices)} "
        f"(latest {when}); this host's own timing chose {local or 'nothing'}"
    )
    figures = {c.name: c.latency_ms for c in found.candidates if c.name in decision.per_device}
    return found, FarmReport(
        statistic=STATISTIC,
        latency_ms={k: v for k, v in figures.items() if v is not None},
        devices=devices,
        silent=sorted(answer.silent),
    )


def latency_report(report: FarmReport, chosen: Candidate, runtime: str) -> LatencyReport:
    """The manifest's latency block when devices measured it: the combined figures and where they came from."""
    first = report.devices[0]
    return LatencyReport(
        median_ms=report.latency_ms[chosen.name],
        p90_ms=chosen.p90_ms if chosen.p90_ms is not None else report.latency_ms[chosen.name],
        runtime=runtime,
        provider=first.provider or "",
        threads=first.threads,
        machine="devices " + ", ".join(f"{d.device_id} ({d.profile}, {d.threads} threads)" for d in report.devices),
    )
