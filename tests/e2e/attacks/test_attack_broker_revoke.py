"""A stolen device certificate, revoked with `edgefleet keys revoke-device ID` on the SHIPPED secure Mosquitto
configuration (mutual TLS, CN = user name = client id, the dynamic-security plugin), counted in the attack ledger.

The thief holds dev-stolen's certificate and key. Before the revocation it reads what dev-stolen may read and
writes what dev-stolen may write (the test proves its checks can see that); after it, whatever the thief tries:
its live session is gone, and a new connection gets nothing delivered and every publish refused. dev-ok, in the
same group, keeps everything. Negative checks never sleep: the forbidden message goes first, an allowed one from the
same publisher to dev-ok after it, then a round trip on the thief's own connection.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.desired.sync import plan_desired
from edgefleet.control.farm.devices import for_profile
from edgefleet.control.fleet.registry import enrolment_labels, host_view, memberships, registry_warnings
from edgefleet.control.rights.dynsec import bundle_acls
from edgefleet.control.rights.sync import DeviceGrant, DynsecRights, device_grants, open_rights
from edgefleet.control.store import open_store
from edgefleet.core.errors import BrokerError
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.attacks.common import Inbox
from support.attacks.ledger import AttackLedger
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki

WAIT = 10.0
TOPICS = Topics()
DEVICES = {"dev-ok": ["lab"], "dev-stolen": ["lab"]}
ADMIN = "edgefleet-admin"  # the operator running `keys revoke-device` (its own host certificate)
BUNDLE = "b-granted"


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    hosts = (HOST_IDENTITY, CLI_IDENTITY, ADMIN)
    pki = make_pki(tmp_path / "pki", list(DEVICES), hosts=hosts)
    with SecureBroker(pki, DEVICES, host_users=hosts) as broker:
        yield broker


def _nonce() -> bytes:
    return uuid.uuid4().hex.encode()


def _readable(device: str) -> list[str]:
    """What a device of group lab, granted BUNDLE, may read."""
    return [TOPICS.device_desired(device, "default"), TOPICS.group_desired("lab", "default"),
            TOPICS.bundle_offer(BUNDLE), TOPICS.infer_request(device)]  # fmt: skip


def _writable(device: str) -> list[str]:
    return [TOPICS.status(device), TOPICS.telemetry(device), TOPICS.events(device)]


def _try_everything(thief: Connection, inbox: Inbox, operator: Connection) -> tuple[list[str], int]:
    """A retained message on every topic the device could read, then every publish it could make: (topics
    delivered to the thief, publishes the broker accepted). A retained message reaches a subscription whenever it
    comes into force; each publish is a round trip on the thief's connection after its SUBSCRIBEs and after the
    broker queued what it would deliver, so what is not in the inbox then was never sent."""
    for topic in _readable("dev-stolen"):
        operator.publish(topic, _nonce(), qos=1, retain=True, wait=WAIT)
    accepted = 0
    for topic in _writable("dev-stolen"):
        try:
            thief.publish(topic, b'{"stolen": true}', qos=1, wait=WAIT)
            accepted += 1
        except BrokerError as err:
            assert "Not authorized" in str(err), err
    return sorted(inbox.topics()), accepted


def _wait_topic(inbox: Inbox, topic: str) -> None:
    deadline = time.monotonic() + WAIT
    while topic not in inbox.topics():
        assert time.monotonic() < deadline, f"{topic} not received within {WAIT:g} s; got {inbox.topics()}"
        time.sleep(0.02)


def test_a_revoked_device_certificate_can_do_nothing_on_the_broker(
    secure: SecureBroker, tmp_path: Path, attack_ledger: AttackLedger
) -> None:
    store_url = f"sqlite://{tmp_path / 'control.sqlite'}"
    store = open_store(store_url)
    for device in DEVICES:
        store.upsert_statuses([DeviceStatus(device_id=device, online=True, state="idle")], 0.0)
        store.set_labels(device, enrolment_labels("intel-x86-vnni", ["lab"]))
    store.close()
    operator = secure.connect(CLI_IDENTITY)
    rights = open_rights(operator, TOPICS, "dynsec")
    assert isinstance(rights, DynsecRights)
    grants = {d: DeviceGrant(d, frozenset({"lab"}), frozenset({BUNDLE})) for d in DEVICES}
    per_device = len(bundle_acls(TOPICS, BUNDLE))  # offer, blocks and chunks (dynsec.bundle_acls)
    assert rights.follow(grants).granted == {"dev-ok": per_device, "dev-stolen": per_device}
    witness = Inbox()
    legit = Connection(secure.url, "dev-ok", protocol="5", tls=secure.pki.tls("dev-ok"))
    legit.subscribe(TOPICS.device_desired("dev-ok", "default"), witness)
    legit.subscribe(TOPICS.group_desired("lab", "default"), witness)
    legit.start(wait=WAIT)
    inbox = Inbox()
    thief = Connection(secure.url, "thief", protocol="5", tls=secure.pki.tls("dev-stolen"))
    for topic in _readable("dev-stolen"):
        thief.subscribe(topic, inbox)
    thief.start(wait=WAIT)
    late: Connection | None = None
    try:
        # Before: the stolen certificate is as good as the device (so the checks below can see a success).
        _, accepted = _try_everything(thief, inbox, operator)
        for topic in _readable("dev-stolen"):
            _wait_topic(inbox, topic)
        assert accepted == len(_writable("dev-stolen"))

        admin = secure.pki.tls(ADMIN)
        tls = ["--ca", admin.ca, "--cert", str(admin.cert), "--key", str(admin.key)]
        cmd = [sys.executable, "-m", "edgefleet", "keys", "revoke-device", "dev-stolen", "--store", store_url,
               "--broker", secure.url, *tls, "--json"]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert "disconnected" in report["broker"] and "no rights left" in report["broker"], report
        assert report["registry"].startswith("marked revoked at"), report

        # The live session: kicked by the plugin. paho reconnects by itself: that connection is the attack below.
        deadline = time.monotonic() + WAIT
        while thief.connects < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        kicked = thief.connects >= 2
        assert thief.wait_connected(WAIT)
        inbox.messages.clear()
        after, accepted = _try_everything(thief, inbox, operator)
        # A fresh connection with the stolen certificate (the same CN: the first one goes first, or they would take
        # the client id from each other), subscribing to everything it once could read and more.
        thief.stop()
        late_inbox = Inbox()
        late = Connection(secure.url, "thief-again", protocol="5", tls=secure.pki.tls("dev-stolen"))
        for topic in [*_readable("dev-stolen"), f"{TOPICS.prefix}/#"]:
            late.subscribe(topic, late_inbox)
        late.start(wait=WAIT)
        again, accepted_again = _try_everything(late, late_inbox, operator)
        succeeded = bool(after or again or accepted or accepted_again) or not kicked
        assert not attack_ledger.record(
            "a stolen device certificate after `keys revoke-device` (reconnect, subscribe, publish)",
            succeeded,
            f"live session kicked: {kicked}; 2 connections, {len(_readable('dev-stolen')) * 2 + 1} subscriptions: "
            f"{len(after) + len(again)} topics delivered; {accepted + accepted_again}/"
            f"{2 * len(_writable('dev-stolen'))} publishes accepted (the CONNECT itself is accepted: Mosquitto "
            "2.0.11 has no plugin check at connect for certificate identities)",
        )
        # The control plane and the registry: revoked, in no group, granted nothing; dev-ok keeps everything.
        store = open_store(store_url)
        try:
            record = store.device("dev-stolen")
            assert record is not None
            assert registry_warnings(record)[0].startswith("revoked at"), registry_warnings(record)
            assert memberships(store.groups(), store.devices())["dev-stolen"] == set()
            assert set(device_grants(store, plan_desired(store))) == {"dev-ok"}
            chosen, notes = for_profile([host_view(record)], "intel-x86-vnni")  # nor measures farm candidates
            assert chosen == [] and "revoked" in notes[0], notes
        finally:
            store.close()
        legit.publish(TOPICS.status("dev-ok"), b"{}", qos=1, wait=WAIT)  # not refused
        again_marker = _nonce()
        operator.publish(TOPICS.group_desired("lab", "default"), again_marker, qos=1, wait=WAIT)
        witness.wait_for(TOPICS.group_desired("lab", "default"), again_marker)
        # Revoking again says what is left to revoke (the client stays as a disabled tombstone, its role is gone).
        repeat = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert repeat.returncode == 0 and "disconnected" in json.loads(repeat.stdout)["broker"], repeat.stderr
    finally:
        for conn in (thief, late, legit, operator):
            if conn is not None:
                conn.stop()


def test_disabling_the_client_alone_would_not_revoke_a_certificate_identity(secure: SecureBroker) -> None:
    """Why `revoke-device` deletes the role: Mosquitto 2.0.11 skips the plugin's authentication for certificate
    identities and its ACL checks ignore `disabled`, so a disabled client keeps every right its role gives."""
    operator = secure.connect(CLI_IDENTITY)
    try:
        rights = open_rights(operator, TOPICS, "dynsec")
        assert isinstance(rights, DynsecRights)
        rights.client.check([{"command": "disableClient", "username": "dev-stolen"}])
        stolen = secure.connect("dev-stolen", client_id="stolen")
        try:
            stolen.publish(TOPICS.status("dev-stolen"), b"{}", qos=1, wait=WAIT)  # accepted: disabled is not enough
        finally:
            stolen.stop()
    finally:
        operator.stop()


@pytest.mark.slow
def test_with_the_optional_crl_a_revoked_certificate_cannot_even_connect(
    tmp_path: Path, attack_ledger: AttackLedger
) -> None:
    """The shipped configuration with its optional `crlfile` line on: `revoke-device --crl` adds the certificate,
    a reload (SIGHUP) applies it, and the handshake itself is refused; every other certificate still connects."""
    hosts = (HOST_IDENTITY, CLI_IDENTITY, ADMIN)
    pki = make_pki(tmp_path / "pki", list(DEVICES), hosts=hosts)
    crl = tmp_path / "crl.pem"
    cli = [sys.executable, "-m", "edgefleet", "keys"]
    made = subprocess.run([*cli, "crl", "--ca-dir", str(pki.directory), "--out", str(crl), "--json"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0 and json.loads(made.stdout)["revoked"] == [], made.stderr
    with SecureBroker(pki, DEVICES, host_users=hosts, crl=crl) as broker:
        before = broker.connect("dev-stolen", client_id="thief")  # an empty CRL refuses nobody
        admin = broker.pki.tls(ADMIN)
        tls = ["--ca", admin.ca, "--cert", str(admin.cert), "--key", str(admin.key)]
        result = subprocess.run(
            [*cli, "revoke-device", "dev-stolen", "--crl", str(crl), "--ca-dir", str(pki.directory),
             "--store", f"sqlite://{tmp_path / 'control.sqlite'}", "--broker", broker.url, *tls, "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["crl"] == str(crl)
        before.stop()
        broker.reload()
        reloaded_at = len(broker.log())
        refused = 0
        for attempt in range(3):
            thief = Connection(broker.url, f"thief-{attempt}", protocol="5", tls=broker.pki.tls("dev-stolen"))
            try:
                thief.start(wait=5.0)
                thief.stop()
            except BrokerError:
                refused += 1
        legit = broker.connect("dev-ok", client_id="dev-ok")  # the CRL refuses only the revoked certificate
        legit.publish(TOPICS.status("dev-ok"), b"{}", qos=1, wait=WAIT)  # and the plugin still answers for it
        legit.stop()
        # No CONNACK ever came; the broker says why: the handshake failed verification (dev-ok's, identical but for
        # the CRL entry, passed it).
        failed_handshakes = broker.log()[reloaded_at:].count("certificate verify failed")
        assert failed_handshakes >= refused, broker.log()[reloaded_at:]
        assert not attack_ledger.record(
            "a stolen device certificate after `keys revoke-device --crl` and a reload (connect)",
            refused < 3,
            f"{refused}/3 connections refused at the TLS handshake (broker: certificate verify failed, "
            f"{failed_handshakes} log lines); dev-ok still connects and publishes",
        )
