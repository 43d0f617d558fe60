"""The dashboard in headless Chromium (Debian `chromium`, driven by Playwright), after logging in with a token: the
fleet table, each device's latency and golden-agreement plots, a group's plots, rollout progress with its timeline;
a screenshot proves the plots are drawn; nothing is fetched from anywhere but the control plane. Fails (never skips)
without Chromium or Playwright. The operator's actions are in test_dashboard_actions.py, access control in
test_dashboard_auth.py."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.dashboard.server import api_fleet, api_series
from edgefleet.control.publish.publisher import deploy
from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout
from edgefleet.control.server import ControlPlane
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.dashboard import CHROMIUM_ARGS, chromium, get, log_in
from support.rollouts.control_plane import control_plane, enroll, finished, publish, sim_fleet, wait_until
from support.servers.brokers import MosquittoBroker
from support.simulate.agents import Behavior, BundleBehavior, SimFleet, synthetic_bundle

DEVICES = [f"dash-{i}" for i in range(5)]
P95_RGB, GOLDEN_RGB = (0xD6, 0x27, 0x28), (0x2C, 0xA0, 0x2C)

# Counts, in the browser, the pixels of a PNG within a small distance of each given colour.
COUNT_PIXELS = """async ([png, colours]) => {
  const image = new Image();
  image.src = "data:image/png;base64," + png;
  await image.decode();
  const canvas = document.createElement("canvas");
  canvas.width = image.width; canvas.height = image.height;
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  const counts = colours.map(() => 0);
  for (let i = 0; i < data.length; i += 4) {
    colours.forEach(([r, g, b], k) => {
      if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 40) counts[k] += 1;
    });
  }
  return counts;
}"""


@pytest.fixture(scope="module")
def dashboard(
    tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey
) -> Iterator[tuple[ControlPlane, SimFleet]]:
    """Its own broker (no retained devices from other tests), a control plane with its dashboard, five simulated
    devices reporting, one rollout that passed and one that was rolled back."""
    tmp_path = tmp_path_factory.mktemp("dashboard")
    v1, v2, v3 = (synthetic_bundle(tmp_path, signing_key, version=v, seed=int(v)) for v in "123")
    behavior = Behavior(requests_per_s=100.0, bundles={"sim-model-3-generic-x86-64": BundleBehavior(latency_factor=4)})
    timing = {"baseline_s": 1.0, "observe_s": 1.0, "install_timeout_s": 10.0, "min_reports": 2}
    with (
        MosquittoBroker() as broker,
        control_plane(broker.url, tmp_path, http_port=0) as plane,
        sim_fleet(broker.url, DEVICES, groups=["dash"], behavior=behavior, telemetry_interval=0.25) as sims,
    ):
        host = Connection(broker.url, "dashboard-test-host").start()
        try:
            manifests = [publish(host, plane.store, b) for b in (v1, v2, v3)]
            deploy(host, Topics(), manifests[0], devices=[], groups=["dash"])
            wait_until("telemetry on v1", lambda: all(
                (t := plane.store.latest_telemetry().get((d, "default"))) and t.p95_ms for d in DEVICES))  # fmt: skip
            enroll(plane.store, DEVICES, ["dash"])
            for manifest in manifests[1:]:
                spec = make_spec(group="dash", bundles=[bundle_ref(manifest)], waves=["100%"], timing=timing)
                finished(plane.store, prepare_rollout(plane.store, spec).id)
        finally:
            host.stop()
        yield plane, sims


def test_the_api_answers_json(dashboard: tuple[ControlPlane, SimFleet]) -> None:
    plane, _ = dashboard
    with get(plane, "api/fleet") as response:
        fleet = json.load(response)
    assert [d["device_id"] for d in fleet["devices"]] == DEVICES and fleet["engine"]["alive"]
    assert api_fleet(plane.store)["counters"]["ingest.telemetry"] > 0
    series = api_series(plane.store, DEVICES[0], 300.0, 60)
    assert series["points"] and any(p["p95_ms"] for p in series["points"])
    with get(plane, "api/rollouts") as response:
        states = [r["state"] for r in json.load(response)["rollouts"]]
    assert states == ["rolled-back", "succeeded"]
    with get(plane, "api/groups/dash/series?window=300&points=60") as response:
        group = json.load(response)
    assert group["members"] == DEVICES and any(p["p95_ms_max"] for p in group["points"])
    assert max(p["devices"] for p in group["points"]) == len(DEVICES)
    for bad in ("api/devices/a%2Fb/series", "api/groups/nope/series", "nowhere"):
        with pytest.raises(urllib.error.HTTPError) as caught:
            get(plane, bad)
        assert caught.value.code in (400, 404)


def test_the_dashboard_draws_the_fleet_the_plots_and_the_rollouts(
    dashboard: tuple[ControlPlane, SimFleet], tmp_path: Path
) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise RuntimeError("Playwright is not installed: pip install playwright (never `playwright install`)") from err
    plane, _ = dashboard
    url = plane.dashboard_url
    assert url is not None
    requested: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.on("request", lambda request: requested.append(request.url))
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            log_in(page, plane)
            page.wait_for_selector("body[data-charts='true']", timeout=15_000)
            page.wait_for_function(f"() => document.querySelectorAll('#fleet tbody tr').length === {len(DEVICES)}")

            rows = page.locator("#fleet tbody tr")
            assert rows.count() == len(DEVICES)
            assert "dash-0" in rows.nth(0).inner_text() and "sim-model-2" in rows.nth(0).inner_text()

            cards = page.locator("#charts .card")
            assert cards.count() == len(DEVICES)
            lengths: list[dict[str, Any]] = page.eval_on_selector_all(
                "#charts svg.chart path.line",
                "paths => paths.map(p => ({series: p.dataset.series, length: p.getTotalLength(),"
                " points: (p.getAttribute('d').match(/[ML]/g) || []).length}))",
            )
            by_series = {s: [x for x in lengths if x["series"] == s] for s in ("p50_ms", "p95_ms", "golden_agreement")}
            for series, paths in by_series.items():
                assert len(paths) >= len(DEVICES), f"a {series} line per device"
                assert all(x["length"] > 20 and x["points"] >= 3 for x in paths), (series, paths)

            rollouts = page.locator("#rollouts .rollout")
            assert rollouts.count() == 2
            assert page.locator(".rollout[data-state='succeeded'] .wave[data-state='passed']").count() == 2
            assert page.locator(".rollout[data-state='rolled-back'] .wave[data-state='failed']").count() == 1
            assert "p95" in page.locator(".rollout[data-state='rolled-back']").inner_text()
            assert page.locator(".rollout[data-state='succeeded'] svg.timeline rect.passed").count() == 2
            assert page.locator(".rollout[data-state='rolled-back'] svg.timeline rect.failed").count() == 1

            page.select_option("#group-chart", "dash")  # the group's plots: members averaged, the worst p95
            page.wait_for_selector("#group-charts .card[data-group='dash'] path.line[data-series='p95_ms_max']")

            shot = page.locator("#charts").screenshot(path=str(tmp_path / "charts.png"))
            counts = page.evaluate(COUNT_PIXELS, [base64.b64encode(shot).decode(), [P95_RGB, GOLDEN_RGB]])
            assert counts[0] > 300 and counts[1] > 300, f"plot colours on the screenshot: {counts}"

            page.locator("#fleet tbody tr").nth(1).click()  # choosing a device shows only its plots
            page.wait_for_function("() => document.querySelectorAll('#charts .card').length === 1")
            assert page.locator("#charts .card").get_attribute("data-device") == "dash-1"
            assert not errors, errors
        finally:
            browser.close()
    foreign = [u for u in requested if not u.startswith(url)]
    assert not foreign, f"the page fetched from elsewhere: {foreign}"
