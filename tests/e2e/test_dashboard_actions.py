"""An operator acts from the dashboard, in headless Chromium, on real agents (subprocesses) over a real Mosquitto:
logs in with a token from the store, starts a rollout from a published bundle and watches it pass wave by wave,
starts another and aborts it (the canary goes back), labels a device, sets and clears a device's desired bundle.
Requests without the token, and a POST without the session's CSRF token, are refused; every action and refusal is in
the audit trail with who did it. Nothing is fetched from anywhere but the control plane."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.dashboard.auth import issue_token
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.dashboard import CHROMIUM_ARGS, chromium
from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle
from support.rollouts.agents import Traffic
from support.rollouts.control_plane import control_plane, enroll, publish, rollout, wait_until
from support.servers.brokers import MosquittoBroker

GROUP = "dash-line"
DEVICES = ["da-0", "da-1"]
# Loose enough for a loaded 2-core machine running two agents, the traffic and a browser (a p95 of 0.3 ms measured
# 1.6 ms while other work ran): this test is about the operator's path; test_rollout_agents.py tests the judge.
RELAXED = {"#rf-latency": "10", "#rf-slack": "5", "#rf-errors": "0.05", "#rf-min-requests": "10",
           "#rf-golden": "0.01", "#rf-min-reports": "2", "#rf-install": "120"}  # fmt: skip


def wait_js(page: Any, expression: str, timeout: float = 20_000) -> None:
    """Wait until a JavaScript expression holds on the page (as a function: the page's CSP forbids eval)."""
    page.wait_for_function(f"() => {expression}", timeout=timeout)


@pytest.fixture
def fleet(
    start_agent: Callable[..., AgentProcess], host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path],
) -> Iterator[str]:  # fmt: skip
    for device in DEVICES:
        start_agent(device, groups=(GROUP,), telemetry_interval=0.5)
    v1 = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], groups=(GROUP,))
    for device in DEVICES:
        watcher.serving(device, v1, timeout=90)
    yield v1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_operator_logs_in_starts_a_rollout_that_passes_aborts_another_and_is_audited(
    fleet: str, mosquitto: MosquittoBroker, host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], tmp_path: Path, signing_key: SigningKey, keys: tuple[Path, Path],
) -> None:  # fmt: skip
    from playwright.sync_api import sync_playwright

    trusted = TrustedKeys.load([keys[1]])
    v2_path = derive_bundle(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, model_version="2")
    v3_path = derive_bundle(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, trusted, model_version="3")
    requested: list[str] = []
    errors: list[str] = []
    with (
        control_plane(mosquitto.url, tmp_path, http_port=0) as plane,
        Traffic(host, topics, DEVICES),
        sync_playwright() as p,
    ):
        store, url = plane.store, plane.dashboard_url
        assert url is not None
        wait_until(
            "telemetry from every agent", lambda: all(store.latest_telemetry().get((d, "default")) for d in DEVICES)
        )
        publish(host, store, demo_bundles["intel-x86-vnni"])  # the host's record of v1: the rollback target
        enroll(store, DEVICES, [GROUP], profile=None)
        v2, v3 = publish(host, store, v2_path).bundle_id, publish(host, store, v3_path).bundle_id
        token = issue_token(store, "alice")

        # Without the token: refused, for the API and for the page.
        for path in ("api/fleet", "api/rollouts", "api/audit"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url + path, timeout=10)
            assert refused.value.code == 401
        denied = urllib.request.Request(url + "api/rollouts", data=b"{}", method="POST",
                                        headers={"Content-Type": "application/json"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(denied, timeout=10)
        assert refused.value.code == 401

        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.on("request", lambda request: requested.append(request.url))
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.on("dialog", lambda dialog: dialog.accept())

            page.goto(url)
            assert page.url == url + "login"
            page.fill("#token", token)
            page.click("#login button[type=submit]")
            page.wait_for_selector("body[data-loaded='true']", timeout=20_000)
            assert page.inner_text("#user") == "signed in as alice"

            # Start a rollout from a published bundle, and watch it pass.
            wait_js(page, f"[...document.querySelectorAll('#rf-bundles option')].some(o => o.value === '{v2}')")
            wait_js(page, f"[...document.querySelectorAll('#rf-group option')].some(o => o.value === '{GROUP}')")
            page.select_option("#rf-bundles", [v2])
            page.select_option("#rf-group", GROUP)
            for selector, value in {**RELAXED, "#rf-waves": "100%", "#rf-baseline": "3", "#rf-observe": "3"}.items():
                page.fill(selector, value)
            page.click("#rf-start")
            page.wait_for_selector("#rollout-result.ok", timeout=20_000)
            first = page.inner_text("#rollout-result").split()[1].rstrip(":")
            box = f".rollout[data-rollout='{first}']"
            state = f'document.querySelector("{box}")?.dataset.state'
            ended = f"['succeeded', 'rolled-back', 'aborted'].includes({state})"
            wait_js(page, ended, timeout=240_000)
            doc = rollout(store, first)
            assert doc.state == "succeeded", "\n".join(e.message for e in doc.log)
            assert page.locator(f"{box} .wave[data-state='passed']").count() == 2  # the canary and the rest
            assert page.locator(f"{box} svg.timeline rect.passed").count() == 2
            page.locator(f"{box} details.findings summary").first.click()
            findings = page.inner_text(f"{box} details.findings[open] table")
            assert "✓ latency" in findings and "✓ golden" in findings and "✓ errors" in findings, findings
            for device in DEVICES:
                watcher.serving(device, v2, timeout=30)

            # Start another, then abort it while its canary is being watched: the canary goes back to v2.
            page.select_option("#rf-bundles", [v3])
            page.fill("#rf-observe", "600")
            page.click("#rf-start")
            result = "document.querySelector('#rollout-result').textContent"
            wait_js(page, f"{result}.startsWith('started ') && !{result}.includes('{first}')")
            second = page.inner_text("#rollout-result").split()[1].rstrip(":")
            box = f".rollout[data-rollout='{second}']"
            wave = f"document.querySelector(\"{box} .wave[data-wave='0']\")?.dataset.state"
            wait_js(page, f"['observing', 'failed', 'aborted'].includes({wave})", timeout=180_000)
            doc = rollout(store, second)
            assert doc.waves[0].state == "observing", "\n".join(e.message for e in doc.log)
            canary = rollout(store, second).waves[0].devices[0]
            watcher.serving(canary, v3, timeout=30)

            # A POST from this very session without its CSRF token is refused.
            status = page.evaluate(
                "async (id) => (await fetch(`/api/rollouts/${id}/pause`, {method: 'POST',"
                " headers: {'Content-Type': 'application/json'}, body: '{}'})).status",
                second,
            )
            assert status == 403

            page.click(f"{box} button[data-action='abort']")
            page.wait_for_selector(f"{box}[data-state='aborted']", timeout=180_000)
            watcher.serving(canary, v2, timeout=60)
            assert "aborted by operator" in page.inner_text(box)

            # Label a device; set, then clear, a device's desired bundle.
            page.select_option("#lf-device", DEVICES[1])
            page.fill("#lf-set", "site=berlin")
            page.click("#label-form button[type=submit]")
            page.wait_for_selector("#label-result.ok", timeout=20_000)
            labels = f"document.querySelector(\"#fleet tr[data-device='{DEVICES[1]}'] td.labels\").textContent"
            wait_js(page, f"{labels}.includes('site=berlin')")
            page.select_option("#df-scope", "device")
            page.fill("#df-target", DEVICES[1])
            page.select_option("#df-bundle", v2)
            page.click("#desired-form button[type=submit]")
            page.wait_for_selector("#desired-result.ok", timeout=20_000)
            wait_js(page, f"document.querySelector('#desired tbody').textContent.includes('{DEVICES[1]}')")
            page.click("#desired-clear")
            wait_js(page, "document.querySelector('#desired-result').textContent === 'removed 1'")

            # The audit trail, in the store and on the page.
            wait_js(page, "document.querySelectorAll(\"#audit tr[data-action='rollout.abort']\").length > 0")
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)  # kept for a look after the run
            assert not errors, errors
        finally:
            browser.close()
        trail = [(e.actor, e.action, e.outcome.split(":")[0]) for e in reversed(store.audit())]
        alice = [(a, o) for actor, a, o in trail if actor == "token:alice"]
        assert alice[:1] == [("login", "ok")]
        for action in ("rollout.start", "rollout.abort", "device.label", "desired.set", "desired.clear"):
            assert (action, "ok") in alice, (action, trail)
        assert alice.count(("rollout.start", "ok")) == 2
        assert ("rollout.pause", "refused") in alice, "the POST without a CSRF token is on record"
        assert ("anonymous", "rollout.start", "refused") in trail, "the POST without a token is on record"
        started = [e for e in store.audit() if e.action == "rollout.start" and e.outcome == "ok"]
        assert {e.detail["rollout"] for e in started} == {first, second}
        assert all(e.via == "dashboard" and e.remote == "127.0.0.1" for e in started)
        assert rollout(store, first).state == "succeeded"
    foreign = [u for u in requested if not u.startswith(url)]
    assert not foreign, f"the page fetched from elsewhere: {foreign}"
