"""Rollouts gated on model quality, with simulated devices on a real Mosquitto and the real control plane: the
quality figures travel as real Telemetry messages, are ingested into the store and judged.

- A regression model (one continuous output: its argmax agreement is 1.0 whatever it outputs) whose new build is
  subtly wrong fails its per-output golden check and is rolled back.
- A classifier whose canary answers worse on labelled feedback is rolled back by the field-accuracy guardrail.
- A quiet canary (no client traffic) is judged from its probe traffic; without probes it fails for lack of data.
- A shadow phase: a disagreeing shadow stops the rollout before anything new is served; an agreeing one goes on
  to the waves.
- A device whose input drifts raises an alert."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.core.messages import DriftScore, OutputScore
from edgefleet.core.mqtt.connection import Connection

from support.rollouts.control_plane import finished, wait_until
from support.rollouts.fleet import make_fleet
from support.rollouts.sims import THRESHOLDS, V2, sims
from support.servers.brokers import MosquittoBroker
from support.simulate.quality import QualityBehavior


def golden(score: float, passed: bool) -> tuple[OutputScore, ...]:
    return (OutputScore(output="speech_prob", rule="continuous", score=score, passed=passed,
                        detail={"sqnr_db": 42.0 if passed else 9.5}),)  # fmt: skip


def test_a_subtly_wrong_regression_model_fails_its_golden_check_and_is_rolled_back(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    host: Connection,
    bundles: dict[str, Path],
) -> None:
    behavior = sims(
        QualityBehavior(golden_scores=golden(0.9999, True)), QualityBehavior(golden_scores=golden(0.93, False))
    )
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-golden", behavior=behavior) as fleet:
        doc = finished(fleet.store, fleet.start(thresholds=THRESHOLDS))
        assert doc.state == "rolled-back", doc.log
        assert "golden check of output speech_prob fails: continuous score 0.9300" in doc.waves[0].verdict
        canary = doc.waves[0].devices[0]
        observed = doc.devices[canary].observed
        assert observed is not None and observed.golden_agreement == 1.0, "the old argmax check saw nothing wrong"
        assert set(fleet.active().values()) == {fleet.manifests["v1"].bundle_id}
        alerts = wait_until("the golden alert", lambda: fleet.store.alerts(canary))
        assert alerts[0].kind == "golden" and alerts[0].level == "critical" and alerts[0].bundle_id == V2


def test_a_canary_answering_worse_on_labelled_feedback_is_rolled_back(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    host: Connection,
    bundles: dict[str, Path],
) -> None:
    behavior = sims(QualityBehavior(field_accuracy=0.96, field_samples=400),
                    QualityBehavior(field_accuracy=0.81, field_samples=120))  # fmt: skip
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-field", behavior=behavior) as fleet:
        doc = finished(fleet.store, fleet.start(thresholds=THRESHOLDS))
        assert doc.state == "rolled-back", doc.log
        assert "field accuracy 0.810 (120 feedbacks) is below baseline 0.960 − 0.02 = 0.940" in doc.waves[0].verdict


@pytest.mark.slow
def test_a_quiet_canary_is_judged_from_probe_traffic_and_without_it_fails_for_lack_of_data(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    host: Connection,
    bundles: dict[str, Path],
) -> None:
    quiet = sims(QualityBehavior(), QualityBehavior(), requests_per_s=0.0, probes_per_s=80.0)
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-probe", count=2, behavior=quiet) as fleet:
        doc = finished(fleet.store, fleet.start(waves=["100%"], thresholds=THRESHOLDS))
        assert doc.state == "succeeded", doc.log
        for progress in doc.devices.values():
            assert {f.criterion: f.ok for f in progress.findings} == {
                "latency": True,
                "golden": True,
                "errors": True,
                "evidence": True,
            }
            assert progress.observed is not None and progress.observed.requests == 0
            assert progress.observed.probe_requests >= 20
    silent = sims(QualityBehavior(), QualityBehavior(), requests_per_s=0.0, probes_per_s=0.0)
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-silent", count=2, behavior=silent) as fleet:
        doc = finished(fleet.store, fleet.start(waves=["100%"], thresholds=THRESHOLDS))
        assert doc.state == "rolled-back", doc.log
        assert "no data for latency" in doc.waves[0].verdict


def test_a_disagreeing_shadow_stops_the_rollout_before_anything_new_is_served(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    host: Connection,
    bundles: dict[str, Path],
) -> None:
    behavior = sims(QualityBehavior(), QualityBehavior(shadow_agreement=0.62))
    shadow = {"observe_s": 1.0, "timeout_s": 20.0, "min_requests": 50, "min_agreement": 0.99}
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-shadow-bad", behavior=behavior) as fleet:
        doc = finished(fleet.store, fleet.start(thresholds=THRESHOLDS, shadow=shadow))
        assert doc.state == "rolled-back", doc.log
        assert doc.shadow is not None and doc.shadow.state == "failed"
        assert "shadow agreement 0.6200 is below 0.99" in doc.outcome
        canary = doc.waves[0].devices[0]
        assert doc.shadow.devices[canary].agreement == 0.62 and doc.shadow.devices[canary].requests >= 50
        assert [w.state for w in doc.waves] == ["pending", "pending", "pending"], "no wave ever started"
        v1 = fleet.manifests["v1"].bundle_id
        assert set(fleet.active().values()) == {v1}, "nobody served the candidate"
        wait_until("the shadow dropped", lambda: all(d.shadow is None for d in fleet.sims.devices.values()))
        assert not fleet.store.deployments() or all(d.shadow_bundle_id is None for d in fleet.store.deployments())


def test_an_agreeing_shadow_leads_into_the_waves(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    host: Connection,
    bundles: dict[str, Path],
) -> None:
    behavior = sims(QualityBehavior(), QualityBehavior(shadow_agreement=0.998))
    shadow = {"observe_s": 1.0, "timeout_s": 20.0, "min_requests": 50, "min_agreement": 0.99}
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-shadow-ok", behavior=behavior) as fleet:
        rollout_id = fleet.start(thresholds=THRESHOLDS, shadow=shadow)
        canary = wait_until("the canary running the shadow", lambda: next(
            (d for d, s in fleet.sims.devices.items() if s.shadow is not None), None))  # fmt: skip
        # The sync records what the broker acknowledged, so the device can hear of it before the store has it
        recorded = wait_until("the canary's published desired state in the store", lambda: fleet.store.published().get(
            (canary, "default")))  # fmt: skip
        assert recorded.shadow_bundle_id == fleet.manifests["v2"].bundle_id
        doc = finished(fleet.store, rollout_id)
        assert doc.state == "succeeded", doc.log
        assert doc.shadow is not None and doc.shadow.state == "passed"
        assert set(fleet.active().values()) == {fleet.manifests["v2"].bundle_id}


def test_a_device_whose_input_drifts_raises_an_alert(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    host: Connection,
    bundles: dict[str, Path],
) -> None:
    drifting = (DriftScore(name="input", kind="input", psi=0.41, band="drift", samples=512),)
    behavior = sims(QualityBehavior(drift=drifting), QualityBehavior())
    with make_fleet(mosquitto, tmp_path, host, bundles, "q-drift", count=2, behavior=behavior) as fleet:
        alerts = wait_until("two drift alerts", lambda: (a := fleet.store.alerts()) and len(a) >= 2 and a)
        assert {a.device_id for a in alerts} == set(fleet.sims.devices)
        assert all(a.kind == "drift" and a.level == "critical" and "PSI 0.410" in a.detail for a in alerts)
        assert len(fleet.store.alerts()) == 2, "a device staying in the band raises no further alert"
