"""Drift as an optional rollout guardrail: tables over the pure judge functions, then a rollout on a real Mosquitto
with the real control plane and simulated devices whose telemetry carries drift scores.

- Off unless the rollout sets `max_drift_psi`.
- With it set, the new bundle's worst PSI (inputs and outputs, the latest report with drift) must stay at or
  below the limit once enough live samples stand behind every score.
- It never passes blind: no drift scores, or too few samples, keeps the device pending, and when the wave's time
  is up it fails with "no data for drift: …", unless the operator allowed it unjudged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.rollout.judge.evidence import check_thresholds
from edgefleet.control.rollout.judge.wave import Metrics, Thresholds, judge_device, settle, summarize
from edgefleet.control.store import QualityPoint, TelemetryPoint
from edgefleet.core.messages import DriftScore
from edgefleet.core.mqtt.connection import Connection

from support.rollouts.control_plane import finished
from support.rollouts.fleet import make_fleet
from support.rollouts.sims import THRESHOLDS, sims
from support.servers.brokers import MosquittoBroker
from support.simulate.quality import QualityBehavior

T = Thresholds(max_latency_factor=None, max_golden_drop=None, max_error_rate=None, max_drift_psi=0.25,
               min_drift_samples=100)  # fmt: skip


def metrics(**fields: Any) -> Metrics:
    base: dict[str, Any] = {
        "bundle_id": "b", "reports": 5, "requests": 100, "errors": 0, "p95_ms": 1.0, "fresh_reports": 5,
        "golden_agreement": 1.0,
    }  # fmt: skip
    return Metrics(**(base | fields))


def score(name: str, psi: float, samples: int = 512, kind: str = "input") -> DriftScore:
    band = "drift" if psi > 0.25 else "moderate" if psi >= 0.1 else "none"
    return DriftScore(name=name, kind=kind, psi=psi, band=band, samples=samples)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("observed", "ok", "pending", "says"),
    [
        (metrics(drift_psi=0.04, drift_worst="input x", drift_samples=512), True, False,
         "worst drift PSI 0.040 (input x) within the limit 0.25 over 512 live samples"),
        (metrics(drift_psi=0.41, drift_worst="output y", drift_samples=512), False, False,
         "worst drift PSI 0.410 (output y) exceeds the limit 0.25"),
        (metrics(), None, True, "not judged: no drift scores reported for the new bundle"),
        (metrics(drift_psi=0.02, drift_worst="input x", drift_samples=30), None, True,
         "not judged: 30 live samples behind the drift scores, 100 needed"),
    ],
)  # fmt: skip
def test_the_drift_criterion(observed: Metrics, ok: bool | None, pending: bool, says: str) -> None:
    (finding,) = judge_device(metrics(), observed, T)
    assert (finding.criterion, finding.ok, finding.pending) == ("drift", ok, pending)
    assert says in finding.detail


def test_drift_is_off_unless_the_rollout_sets_it() -> None:
    off = T.model_copy(update={"max_drift_psi": None})
    assert judge_device(metrics(), metrics(drift_psi=3.0, drift_worst="input x", drift_samples=900), off) == []


def test_without_drift_data_the_wave_fails_unless_the_operator_allowed_it() -> None:
    (failed,) = settle(judge_device(metrics(), metrics(), T))
    assert failed.ok is False and failed.detail.startswith("no data for drift: no drift scores reported")
    (allowed,) = settle(judge_device(metrics(), metrics(), T), allowed=["drift"])
    assert allowed.ok is None and allowed.detail.startswith("not judged, allowed by the operator")


def test_summarize_takes_the_worst_score_of_the_latest_report_with_drift() -> None:
    points = [
        TelemetryPoint("d", i, 100.0 + i, "b", None, 1.0, 50, 0, 1.0, 1.5, 2.0, 20, 1.0, 0.0, 1.0, 50.0, None)
        for i in range(1, 4)
    ]
    quality = [
        QualityPoint("d", 1, 101.0, "b", drift=(score("x[0]", 0.9),)),  # older: superseded
        QualityPoint("d", 2, 102.0, "b", drift=(score("x[0]", 0.05), score("y", 0.3, 400, "output"))),
        QualityPoint("d", 3, 103.0, "b"),  # no drift in the newest: the one before counts
    ]
    m = summarize(points, bundle_id="b", since=99.0, quality=quality)
    assert (m.drift_psi, m.drift_worst, m.drift_samples) == (0.3, "output y", 400)


def test_drift_thresholds_are_checked() -> None:
    assert check_thresholds(T) == []
    assert "max drift PSI 0 must be in (0, 10]" in check_thresholds(T.model_copy(update={"max_drift_psi": 0.0}))[0]


DRIFTING = (score("input", 0.41),)
STEADY = (score("input", 0.03),)


def test_a_rollout_with_the_drift_criterion_rolls_back_a_drifting_canary_and_never_passes_without_data(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    host: Connection,
    bundles: dict[str, Path],
) -> None:
    with_drift = {**THRESHOLDS, "max_drift_psi": 0.25, "min_drift_samples": 100}
    behavior = sims(QualityBehavior(drift=STEADY), QualityBehavior(drift=DRIFTING))
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-drift-gate", behavior=behavior) as fleet:
        doc = finished(fleet.store, fleet.start(thresholds=with_drift))
        assert doc.state == "rolled-back", doc.log
        assert "worst drift PSI 0.410 (input input) exceeds the limit 0.25" in doc.waves[0].verdict
        assert set(fleet.active().values()) == {fleet.manifests["v1"].bundle_id}
    blind = sims(QualityBehavior(drift=STEADY), QualityBehavior())  # the new bundle reports no drift at all
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-drift-blind", count=2, behavior=blind) as fleet:
        doc = finished(fleet.store, fleet.start(waves=["100%"], thresholds=with_drift))
        assert doc.state == "rolled-back", doc.log
        assert "no data for drift: no drift scores reported for the new bundle" in doc.waves[0].verdict
