"""The dashboard's model-quality panel in headless Chromium, over a real control plane fed by simulated devices on
a real Mosquitto. Each quality problem is caught by the control plane and visible on the page:

- drift: a device whose input drifted shows the "drift" band, a PSI sparkline and a critical alert;
- a golden regression on a non-classifier (one continuous output): the canary's new build fails its per-output
  check and is rolled back; the panel shows the failing output, its rule and score;
- a field-accuracy regression: the canary's labelled feedback drops; rolled back; the panel flags the bundle;
- a disagreeing shadow: the shadow phase stops the rollout; the panel shows its agreement beside the served bundle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from edgefleet.control.publish.publisher import deploy
from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout
from edgefleet.control.server import ControlPlane
from edgefleet.core.messages import DriftScore, GoldenTask, OutputScore
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.dashboard import CHROMIUM_ARGS, chromium, get, log_in
from support.rollouts.control_plane import control_plane, enroll, finished, publish, sim_fleet, wait_until
from support.servers.brokers import MosquittoBroker
from support.simulate.agents import Behavior, BundleBehavior, synthetic_bundle
from support.simulate.quality import QualityBehavior

GROUP, DEVICES, DRIFTER = "dq", ["dq-0", "dq-1", "dq-2"], "dq-drift"
TIMING = {"baseline_s": 1.0, "observe_s": 1.5, "install_timeout_s": 15.0, "report_timeout_s": 5.0, "min_reports": 2}
THRESHOLDS = {"max_latency_factor": 3.0, "max_golden_drop": 0.01, "max_error_rate": 0.05, "min_field_samples": 50}


def bid(version: int) -> str:
    return f"sim-model-{version}-generic-x86-64"


TASK_BELOW = GoldenTask(metric="sqnr-db", computable=True, score=21.5, floor=30.0, passed=False)


def golden(score: float, passed: bool) -> tuple[OutputScore, ...]:
    return (OutputScore(output="speech_prob", rule="continuous", score=score, passed=passed),)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> Iterator[ControlPlane]:
    tmp_path = tmp_path_factory.mktemp("dashboard-quality")
    bundles = [synthetic_bundle(tmp_path, signing_key, version=str(v), seed=v) for v in (1, 2, 3, 4)]
    good = QualityBehavior(golden_scores=golden(0.9999, True), field_accuracy=0.96, field_samples=400)
    behavior = Behavior(requests_per_s=100.0, bundles={
        bid(1): BundleBehavior(quality=good),
        bid(2): BundleBehavior(quality=QualityBehavior(golden_scores=golden(0.931, False), field_accuracy=0.96,
                                                       field_samples=400, golden_task=TASK_BELOW)),
        bid(3): BundleBehavior(quality=QualityBehavior(golden_scores=golden(0.9999, True), field_accuracy=0.81,
                                                       field_samples=120)),
        bid(4): BundleBehavior(quality=QualityBehavior(shadow_agreement=0.62)),
    })  # fmt: skip
    drifting = (DriftScore(name="input", kind="input", psi=0.37, band="drift", samples=512),)
    drifter = Behavior(requests_per_s=100.0, bundles={bid(1): BundleBehavior(quality=QualityBehavior(drift=drifting))})
    with (
        MosquittoBroker() as broker,
        control_plane(broker.url, tmp_path, http_port=0) as plane,
        sim_fleet(broker.url, DEVICES, groups=[GROUP], behavior=behavior) as sims,
        sim_fleet(broker.url, [DRIFTER], groups=["dq-edge"], behavior=drifter),
    ):
        host = Connection(broker.url, "dashboard-quality-host").start()
        try:
            manifests = [publish(host, plane.store, b) for b in bundles]
            deploy(host, Topics(), manifests[0], devices=[], groups=[GROUP, "dq-edge"])
            wait_until("every device on v1", lambda: all(
                (r := plane.store.device(d)) and r.running() == bid(1) for d in [*DEVICES, DRIFTER]))  # fmt: skip
            enroll(plane.store, DEVICES, [GROUP])
            enroll(plane.store, [DRIFTER], ["dq-edge"])
            for version, extra in ((2, {}), (3, {}), (4, {"shadow": {"observe_s": 1.0, "timeout_s": 20.0}})):
                spec = make_spec(group=GROUP, bundles=[bundle_ref(manifests[version - 1])], waves=["100%"],
                                 timing=TIMING, thresholds=THRESHOLDS, **extra)  # fmt: skip
                doc = finished(plane.store, prepare_rollout(plane.store, spec).id)
                assert doc.state == "rolled-back", doc.log
                wait_until(
                    "the fleet back on v1", lambda: all(s.active_bundle == bid(1) for s in sims.devices.values())
                )
        finally:
            host.stop()
        yield plane


def test_the_quality_api_says_what_went_wrong(plane: ControlPlane) -> None:
    assert plane.dashboard_url is not None
    with get(plane, "api/quality?window=600") as response:  # the dashboard's API needs a token
        data = json.load(response)
    devices = {d["device_id"]: d for d in data["devices"]}
    assert devices[DRIFTER]["drift_band"] == "drift" and devices[DRIFTER]["drift_series"]
    bundles = [b for d in DEVICES for b in devices[d]["bundles"]]
    assert any(g["passed"] is False and g["rule"] == "continuous" for b in bundles if b["bundle"] == bid(2)
               for g in b["golden"])  # fmt: skip
    assert any(b["field_regression"] for b in bundles if b["bundle"] == bid(3))
    assert any(b["shadow"] and b["shadow"]["agreement"] == 0.62 for b in bundles)
    groups = {g["group"]: g for g in data["groups"]}
    assert groups["dq-edge"]["drift_worst"] == "drift" and groups["dq-edge"]["drifting"] == 1
    assert groups["dq-edge"]["drift_series"] and max(v for _, v in groups["dq-edge"]["drift_series"]) == 0.37
    kinds = {(a["kind"], a["level"]) for a in data["alerts"]}
    assert ("drift", "critical") in kinds and ("golden", "critical") in kinds


def test_the_panel_shows_drift_a_golden_and_a_field_regression_and_a_disagreeing_shadow(plane: ControlPlane) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise RuntimeError("Playwright is not installed: pip install playwright (never `playwright install`)") from err
    url = plane.dashboard_url
    assert url is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            log_in(page, plane)  # a token from the store, through the login page
            page.wait_for_selector("body[data-quality='true']", timeout=15_000)
            drift = page.locator(f"#quality-devices tr[data-device='{DRIFTER}'] td.drift")
            assert drift.get_attribute("data-band") == "drift" and "0.370" in drift.inner_text()
            spark = page.locator(f"#quality-devices tr[data-device='{DRIFTER}'] svg.spark path.psi")
            assert spark.count() == 1 and page.evaluate("p => p.getTotalLength()", spark.element_handle()) > 20
            failing = page.locator(f"#quality td.golden div[data-bundle='{bid(2)}'][data-passed='false']")
            assert failing.count() >= 1
            assert "speech_prob continuous 0.9310 FAIL" in failing.first.inner_text()
            task = page.locator(f"#quality td.golden div.task[data-bundle='{bid(2)}'][data-metric='sqnr-db']")
            assert task.count() >= 1 and "task sqnr-db 21.5000 (floor 30.0000) FAIL" in task.first.inner_text()
            regression = page.locator(f"#quality td.field div[data-bundle='{bid(3)}'][data-regression='true']")
            assert regression.count() >= 1 and "0.810 (n=120) ▼ regression" in regression.first.inner_text()
            shadow = page.locator(f"#quality td.shadow div[data-shadow='disagree'][data-bundle='{bid(4)}']")
            assert shadow.count() >= 1 and "agreement 0.6200" in shadow.first.inner_text()
            assert page.locator("#quality-groups tr[data-group='dq-edge'] td[data-band='drift']").count() == 1
            assert page.locator("#quality-groups tr[data-group='dq-edge'] svg.spark path.psi").count() == 1
            alerts = page.locator("#quality-alerts li.alert.critical")
            assert alerts.count() >= 2 and "drift rose to drift" in page.locator("#quality-alerts").inner_text()
            assert not errors, errors
        finally:
            browser.close()
