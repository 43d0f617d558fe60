"""The whole rollout path on the SHIPPED secure Mosquitto configuration, with no manual ACL step: real agent
processes with their own certificates, `control serve`'s ControlPlane with its own host certificate, rights that
follow deployments through the dynamic-security plugin.

The plugin starts knowing only each device's base rights (its own status, telemetry, events, desired): no bundle,
no group. Then: an operator deployment, a good rollout through every wave, a bad build rolled back automatically
on its canary, a rollout the operator aborts (rolled back), and on the way a device that reports itself in the
canary group (attack ledger) and gets neither canary deployments nor the canary group's topic.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.fleet.registry import EmptyGroupError, enrolment_labels, registry_warnings
from edgefleet.control.rights.sync import DynsecClient, DynsecRights
from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout, request
from edgefleet.core.topics import HOST_IDENTITY
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.common import TOPICS, deploy_group, granted_bundles
from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, derive_bundle
from support.rollouts.agents import Traffic, less_accurate_bundle
from support.rollouts.control_plane import control_plane, finished, publish, rollout, wait_until
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki

PROFILE = "intel-x86-vnni"
LINE = [f"sr-{i}" for i in range(3)]
EVIL = "sr-evil"
# The bad build is caught by its golden drop; latency is not what this test is about
# (tests/unit/control/test_rollout_plan.py
# judges it), and on a loaded 2-core machine a good build's p95 has spiked from 0.28 ms to 5.7 ms.
THRESHOLDS = {
    "max_latency_factor": 10.0, "latency_slack_ms": 20.0, "max_golden_drop": 0.01, "max_error_rate": 0.05,
    "min_requests": 10,
}  # fmt: skip
TIMING = {"baseline_s": 5.0, "observe_s": 3.0, "install_timeout_s": 90.0, "report_timeout_s": 15.0, "min_reports": 2}


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    pki = make_pki(tmp_path / "pki", [*LINE, EVIL])
    with SecureBroker(pki, {device: [] for device in [*LINE, EVIL]}) as broker:  # base rights only
        yield broker


def _agent(broker: SecureBroker, device: str, tmp_path: Path, trust: Path, group: str) -> AgentProcess:
    tls = broker.pki.tls(device)
    return AgentProcess(
        device, tmp_path / device, broker=broker.url, trust=trust, profile=PROFILE, groups=(group,),
        telemetry_interval=0.5, extra=("--ca", tls.ca, "--cert", str(tls.cert), "--key", str(tls.key)),
    ).start()  # fmt: skip


@pytest.mark.slow
def test_the_whole_rollout_path_on_the_secure_configuration(
    secure: SecureBroker, tmp_path: Path, keys: tuple[Path, Path], signing_key: SigningKey,
    demo_bundles: dict[str, Path], attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    trusted = TrustedKeys.load([keys[1]])
    v1 = demo_bundles[PROFILE]
    v2 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="2")
    v3 = less_accurate_bundle(v2, tmp_path, signing_key, trusted, version="3")
    v4 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="4")
    operator = secure.connect(CLI_IDENTITY)
    watcher = FleetWatcher(operator, TOPICS)
    root_pub = keys[0].parent / "root.pub"  # agents pin the root key (tests/conftest.py `host_keys`)
    agents = [_agent(secure, d, tmp_path, root_pub, "line") for d in LINE]
    agents.append(_agent(secure, EVIL, tmp_path, root_pub, "canary"))  # it says it is a canary; the registry disagrees
    host_tls = secure.pki.tls(HOST_IDENTITY)
    started = time.monotonic()
    try:
        with control_plane(secure.url, tmp_path, tls=host_tls, retained_sweep_s=2.0) as plane:
            assert isinstance(plane.publisher.rights, DynsecRights), plane.publisher.rights.describe()
            store = plane.store
            wait_until("every agent's status in the store", lambda: {*LINE, EVIL} <= set(store.device_ids()), 90)
            for device in LINE:
                store.set_labels(device, enrolment_labels(PROFILE, ["line"]))
            store.set_labels(EVIL, enrolment_labels(PROFILE, ["quarantine"]))
            manifests = {name: publish(operator, store, path) for name, path in (("1", v1), ("2", v2), ("3", v3))}

            # The device making itself a canary: a canary deployment exists, and someone published the canary
            # group's desired state too (as `edgefleet deploy --group canary` does). Then the line gets v1: once
            # every line device serves it, the impostor had as long to take the canary bundle.
            deploy_group(store, "canary", manifests["1"])
            operator.publish(
                TOPICS.group_desired("canary", "default"), b'{"bundle_id": "canary-only"}', qos=1, retain=True
            )
            deploy_group(store, "line", manifests["1"])
            for device in LINE:
                watcher.serving(device, manifests["1"].bundle_id, timeout=120)
            evil_record = store.device(EVIL)
            assert evil_record is not None
            taken = [e for e in watcher.events if e.device_id == EVIL and e.bundle_id]
            plan_has = [p for (device, _slot), p in store.published().items() if device == EVIL]  # any slot
            client = DynsecClient(operator)
            rights = granted_bundles(client, EVIL)
            try:
                prepare_rollout(store, make_spec(group="canary", bundles=[bundle_ref(manifests["2"])], canary="1",
                                                 waves=["100%"]))  # fmt: skip
                in_rollout = True
            except EmptyGroupError:
                in_rollout = False
            warnings = registry_warnings(evil_record)
            assert not attack_ledger.record(
                "a device making itself a canary (agent --group canary)",
                bool(taken or plan_has or rights or in_rollout or any(s.active_bundle for s in evil_record.slots)),
                f"desired published: {plan_has or 'none'}; bundle rights: {sorted(rights) or 'none'}; events on a "
                f"bundle: {len(taken)}; in a canary rollout: {in_rollout}; warning: {warnings[-1]}",
            )
            assert any("reports groups canary, the registry says quarantine" in w for w in warnings), warnings
            for device in LINE:
                assert granted_bundles(client, device) == {manifests["1"].bundle_id}

            with Traffic(operator, TOPICS, LINE):
                wait_until(
                    "telemetry from every line agent",
                    lambda: all(store.latest_telemetry().get((d, "default")) for d in LINE),
                )

                # A good rollout through every wave: rights move from v1 to v2, device by device.
                spec = make_spec(group="line", bundles=[bundle_ref(manifests["2"])], canary="1",
                                 waves=["50%", "100%"], thresholds=THRESHOLDS, timing=TIMING)  # fmt: skip
                doc = finished(store, prepare_rollout(store, spec).id, timeout=300)
                assert doc.state == "succeeded", [e.message for e in doc.log]
                assert len(doc.waves) == 3 and all(w.state == "passed" for w in doc.waves), doc.waves
                for device in LINE:
                    watcher.serving(device, manifests["2"].bundle_id, timeout=30)
                    assert granted_bundles(client, device) == {manifests["2"].bundle_id}

                # A bad build: its canary measures the damage, the engine rolls it back, the rest never see it.
                spec = make_spec(group="line", bundles=[bundle_ref(manifests["3"])], canary="1",
                                 waves=["50%", "100%"], thresholds=THRESHOLDS, timing=TIMING)  # fmt: skip
                bad_id = prepare_rollout(store, spec).id
                canary = rollout(store, bad_id).waves[0].devices[0]
                doc = finished(store, bad_id, timeout=300)
                assert doc.state == "rolled-back", [e.message for e in doc.log]
                watcher.event(canary, "committed", bundle_id=manifests["3"].bundle_id, timeout=5)
                watcher.serving(canary, manifests["2"].bundle_id, timeout=60)
                wait_until("the bad build's rights revoked", lambda: granted_bundles(client, canary) ==
                           {manifests["2"].bundle_id})  # fmt: skip
                for device in LINE:
                    if device != canary:
                        assert manifests["3"].bundle_id not in granted_bundles(client, device)

                # The operator aborts a rollout whose canary already runs the new bundle: back to v2.
                manifests["4"] = publish(operator, store, v4)
                held = {**TIMING, "observe_s": 600.0}  # the canary wave waits for the operator
                spec = make_spec(group="line", bundles=[bundle_ref(manifests["4"])], canary="1",
                                 waves=["50%", "100%"], thresholds=THRESHOLDS, timing=held)  # fmt: skip
                abort_id = prepare_rollout(store, spec).id
                canary = rollout(store, abort_id).waves[0].devices[0]
                watcher.serving(canary, manifests["4"].bundle_id, timeout=120)
                request(store, abort_id, "abort")
                doc = finished(store, abort_id, timeout=180)
                assert doc.state == "aborted" and doc.devices[canary].state == "rolled-back", [
                    e.message for e in doc.log
                ]
                watcher.serving(canary, manifests["2"].bundle_id, timeout=60)
        print(f"secure rollout path (deploy, good rollout, automatic and operator rollback): "
              f"{time.monotonic() - started:.1f} s")  # fmt: skip
    finally:
        for agent in agents:
            agent.stop()
        operator.stop()
