"""Bundle rights have one source of truth, the retained signed desired documents, on the SHIPPED secure Mosquitto
configuration with a control plane syncing rights every second and real agent processes.

`edgefleet deploy` (a CLI process) manages one device; the control plane's plan manages another. The sync must
not take back what a CLI deploy granted: the device fetches, installs, re-fetches and rolls back through CLI
deploys while the sync runs. A sync keeps every bundle a retained document names (run, shadow, allowed downgrade)
and takes back what no document names any more. An intruder with a host identity and no ops key cannot buy rights
with a replayed or a forged document.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import clear_desired, device_target, publish_desired
from edgefleet.control.desired.sync import DesiredPublisher, SyncReport
from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.control.rights import sync as broker_rights
from edgefleet.control.rights.deploy import grant_deploy
from edgefleet.control.rights.sync import DynsecClient, DynsecRights
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.messages import Desired, SignedDesired
from edgefleet.core.topics import HOST_IDENTITY, Topics
from edgefleet.core.trust.keyset import sign_payload
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.common import bundle_id_of, cli_deploy, deploy_group, granted_bundles
from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, derive_bundle
from support.rollouts.control_plane import control_plane, publish, wait_until
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki
from support.slots import slot_of

PROFILE = "intel-x86-vnni"
TOPICS = Topics()
CLI_DEVICE, PLAN_DEVICE = "rs-cli", "rs-plan"
INTRUDER = "edgefleet-intruder"  # a host identity without the ops key
OPERATOR, AUDITOR = "edgefleet-operator", "edgefleet-auditor"  # the test's own connections (the CLI's id is taken)


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    hosts = (HOST_IDENTITY, CLI_IDENTITY, INTRUDER, OPERATOR, AUDITOR)
    pki = make_pki(tmp_path / "pki", [CLI_DEVICE, PLAN_DEVICE], hosts=hosts)
    with SecureBroker(pki, {CLI_DEVICE: [], PLAN_DEVICE: []}, host_users=hosts) as broker:  # base rights only
        yield broker


def _agent(broker: SecureBroker, device: str, tmp_path: Path, root_pub: Path, groups: tuple[str, ...]) -> AgentProcess:
    tls = broker.pki.tls(device)
    return AgentProcess(
        device, tmp_path / device, broker=broker.url, trust=root_pub, profile=PROFILE, groups=groups,
        extra=("--ca", tls.ca, "--cert", str(tls.cert), "--key", str(tls.key)),
    ).start()  # fmt: skip


def _count_syncs(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """`settled(n)` waits until the control plane finished n more rights syncs than when it was called. Counted on
    the class: the control plane makes a new publisher whenever it takes a new engine term."""
    original, count, lock = DesiredPublisher.sync, [0], threading.Lock()

    def sync(self: DesiredPublisher) -> SyncReport:
        report = original(self)
        with lock:
            count[0] += 1
        return report

    monkeypatch.setattr(DesiredPublisher, "sync", sync)

    def settled(n: int = 2) -> None:
        with lock:
            target = count[0] + n
        wait_until(f"{n} more rights syncs", lambda: count[0] >= target, 60)

    return settled


def _forged(desired: Desired, device: str, keys: HostKeys) -> bytes:
    """A document bound to `device` with a counter above any real one, signed by a key the root never delegated."""
    intruder_key = SigningKey(Ed25519PrivateKey.generate())
    bound = desired.model_copy(update={"target": device_target(device), "counter": 2**62, "expires_at": 2e9})
    signed = SignedDesired(desired=sign_payload("desired", bound.model_dump_json(), intruder_key), keyset=keys.keyset())
    return signed.encode()


@pytest.mark.slow
def test_a_cli_deploy_keeps_its_rights_while_the_control_plane_syncs(
    secure: SecureBroker, tmp_path: Path, root_pub: Path, signing_key: SigningKey, keys: tuple[Path, Path],
    host_keys: HostKeys, demo_bundles: dict[str, Path], attack_ledger: AttackLedger, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    trusted = TrustedKeys.load([keys[1]])
    v1 = demo_bundles[PROFILE]
    v2, v3, v4 = (derive_bundle(v1, tmp_path, signing_key, trusted, model_version=v) for v in ("2", "3", "4"))
    ids = {name: bundle_id_of(path) for name, path in (("1", v1), ("2", v2), ("3", v3), ("4", v4))}
    operator, auditor = secure.connect(OPERATOR), secure.connect(AUDITOR)
    client = DynsecClient(auditor)  # its own connection: grant_deploy answers on `operator`'s response topic
    watcher = FleetWatcher(operator, TOPICS)
    documents: list[bytes] = []  # every document retained on the CLI device's topic, in order
    operator.subscribe(TOPICS.device_desired(CLI_DEVICE, "default"), lambda _t, payload, _r: documents.append(payload))
    # The CLI's device follows group lab (it may read lab's topic once the registry puts it there).
    agents = [
        _agent(secure, CLI_DEVICE, tmp_path, root_pub, ("lab",)),
        _agent(secure, PLAN_DEVICE, tmp_path, root_pub, ()),
    ]
    try:
        settled = _count_syncs(monkeypatch)
        with control_plane(secure.url, tmp_path, tls=secure.pki.tls(HOST_IDENTITY)) as plane:
            assert isinstance(plane.publisher.rights, DynsecRights), plane.publisher.rights.describe()
            plane.publisher.rights.grace.grace_s = 1.0  # what keeps the CLI's rights is the documents, not the grace
            monkeypatch.setattr(broker_rights, "REREAD_S", 0.0)  # every sync reads the roles the CLI changed
            store = plane.store
            wait_until("both agents in the store", lambda: {CLI_DEVICE, PLAN_DEVICE} <= set(store.device_ids()), 90)
            store.set_labels(PLAN_DEVICE, enrolment_labels(PROFILE, ["line"]))
            deploy_group(store, "line", publish(operator, store, v1))
            watcher.serving(PLAN_DEVICE, ids["1"], timeout=120)

            # The CLI deploys to a device the control plane knows (its status is in the store) but has no plan
            # for: before, the sync revoked the grant within a second and the device never got the offer.
            cli_deploy(secure, v1, "--device", CLI_DEVICE)
            watcher.serving(CLI_DEVICE, ids["1"], timeout=120)
            settled()
            assert granted_bundles(client, CLI_DEVICE) == {ids["1"]}
            assert granted_bundles(client, PLAN_DEVICE) == {ids["1"]}

            # A newer bundle, then a signed rollback to the older one: fetched both times with the sync running;
            # each time the bundle no document names any more is taken back.
            cli_deploy(secure, v2, "--device", CLI_DEVICE)
            watcher.serving(CLI_DEVICE, ids["2"], timeout=120)
            settled()
            wait_until("v1's rights taken back", lambda: granted_bundles(client, CLI_DEVICE) == {ids["2"]})

            # Attacks: an intruder re-publishes the old v1 document (a replay), then a forged one naming v1.
            first_v1 = documents[0]
            intruder = secure.connect(INTRUDER)
            try:
                manifest = parse_manifest(read_signed_manifest(v1).manifest_json)
                forged = _forged(
                    Desired(bundle_id=ids["1"], model_name=manifest.model_name, model_version="1", profile=PROFILE),
                    CLI_DEVICE,
                    host_keys,
                )
                for name, payload in (("a replayed desired document", first_v1), ("a forged desired document", forged)):
                    intruder.publish(TOPICS.device_desired(CLI_DEVICE, "default"), payload, qos=1, retain=True, wait=10)
                    settled()
                    rights = granted_bundles(client, CLI_DEVICE)
                    assert not attack_ledger.record(
                        f"rights for a bundle through {name} (host identity, no ops key)",
                        ids["1"] in rights,
                        f"after two syncs {CLI_DEVICE} may read {sorted(rights)}; v1 is {ids['1'][:12]}…",
                    )
            finally:
                intruder.stop()
            watcher.serving(CLI_DEVICE, ids["2"], timeout=30)

            cli_deploy(secure, v1, "--device", CLI_DEVICE, "--rollback")
            watcher.serving(CLI_DEVICE, ids["1"], timeout=120)
            settled()
            wait_until("v2's rights taken back", lambda: granted_bundles(client, CLI_DEVICE) == {ids["1"]})

            # One document names all three: run v3, shadow v2, allowed downgrade to v1. The sync keeps all three.
            publish_bundle(operator, TOPICS, v3)  # as `edgefleet deploy` does: publish, grant, then the document
            grant_deploy(operator, TOPICS, ids["3"], devices=[CLI_DEVICE])
            manifest = parse_manifest(read_signed_manifest(v3).manifest_json)
            three = Desired(bundle_id=ids["3"], model_name=manifest.model_name, model_version="3", profile=PROFILE,
                            shadow_bundle_id=ids["2"], allow_downgrade_to=ids["1"])  # fmt: skip
            publish_desired(operator, TOPICS, host_keys, three, device=CLI_DEVICE, wait=10)
            watcher.serving(CLI_DEVICE, ids["3"], timeout=120)
            settled(3)
            assert granted_bundles(client, CLI_DEVICE) == {ids["1"], ids["2"], ids["3"]}

            # The control plane moves its own device on meanwhile; its rights follow its plan.
            deploy_group(store, "line", publish(operator, store, v2))
            watcher.serving(PLAN_DEVICE, ids["2"], timeout=120)
            settled()
            assert granted_bundles(client, PLAN_DEVICE) == {ids["2"]}

            # A plain deploy of v3 replaces that document: the shadow's and the downgrade's rights go.
            cli_deploy(secure, v3, "--device", CLI_DEVICE)
            settled()
            wait_until("the rights no document names taken back",
                       lambda: granted_bundles(client, CLI_DEVICE) == {ids["3"]})  # fmt: skip
            assert granted_bundles(client, PLAN_DEVICE) == {ids["2"]}

            # A group deploy by the CLI: the registry puts the device in lab (group topics stay the registry's while
            # a control plane runs), the CLI deploys v4 to lab. Its own document (v3) still wins; the sync keeps
            # both bundles. A signed clear of its own document: it falls back to lab's v4, and v3's rights go.
            store.set_labels(CLI_DEVICE, enrolment_labels(PROFILE, ["lab"]))
            settled()
            cli_deploy(secure, v4, "--group", "lab")
            settled()
            assert granted_bundles(client, CLI_DEVICE) == {ids["3"], ids["4"]}
            assert slot_of(watcher.status[CLI_DEVICE]).active_bundle == ids["3"]
            clear_desired(operator, TOPICS, host_keys, device=CLI_DEVICE, wait=10)
            watcher.serving(CLI_DEVICE, ids["4"], timeout=120)
            settled()
            wait_until("the cleared document's bundle taken back",
                       lambda: granted_bundles(client, CLI_DEVICE) == {ids["4"]})  # fmt: skip
    finally:
        for agent in agents:
            agent.stop()
        operator.stop()
        auditor.stop()
