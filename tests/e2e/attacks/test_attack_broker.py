"""Broker-level attacks against the SHIPPED secure Mosquitto configuration (deploy/fleet/mosquitto.conf: mutual
TLS, certificate CN as user name and client id, the dynamic-security plugin), each recorded in the attack ledger.

The attacker holds a device certificate (dev-evil, a compromised device) and full control of that device's
MQTT client. The fleet: dev-a and dev-b (registry group lab), dev-evil (registry group lab too). Negative checks
never sleep: the forbidden message goes first, an allowed one from the same publisher after it; once the allowed
one has arrived, the forbidden one would have too (Mosquitto keeps the order of one client's messages).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.broker.janitor import RetainedJanitor
from edgefleet.control.rights.sync import DeviceGrant, DynsecRights, open_rights
from edgefleet.core.errors import BrokerError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.attacks.common import WAIT, Inbox
from support.attacks.ledger import AttackLedger
from support.servers.secure_broker import CLI_IDENTITY, Pki, SecureBroker, make_pki

TOPICS = Topics()
DEVICES = {"dev-a": ["lab"], "dev-b": ["lab"], "dev-evil": ["lab"]}
SECOND_HOST = "edgefleet-host-b"


HOSTS = (HOST_IDENTITY, SECOND_HOST, CLI_IDENTITY)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), list(DEVICES), hosts=HOSTS)


@pytest.fixture(scope="module")
def broker(pki: Pki) -> Iterator[SecureBroker]:
    with SecureBroker(pki, DEVICES, host_users=HOSTS) as running:
        yield running


@pytest.fixture
def operator(broker: SecureBroker) -> Iterator[Connection]:
    conn = broker.connect(CLI_IDENTITY)
    yield conn
    conn.stop()


def _nonce() -> bytes:
    return uuid.uuid4().hex.encode()


def _settle(conn: Connection) -> None:
    """Return once every SUBSCRIBE `conn` sent so far is in force (a message to itself came back)."""
    inbox, topic, nonce = Inbox(), TOPICS.status(f"sync-{uuid.uuid4().hex[:12]}"), _nonce()
    conn.subscribe(topic, inbox)
    conn.publish(topic, nonce, qos=1)
    inbox.wait_for(topic, nonce)
    conn.unsubscribe(topic)


def test_a_device_certificate_cannot_take_over_another_clients_id(
    broker: SecureBroker, operator: Connection, attack_ledger: AttackLedger
) -> None:
    victim = broker.connect("dev-a", client_id="edgefleet-agent-dev-a")
    control = broker.connect(HOST_IDENTITY, client_id="edgefleet-control-main")
    try:
        for target, connection in (("dev-a", victim), ("the control plane", control)):
            wanted = connection.client_id
            attacker = broker.connect("dev-evil", client_id=wanted)
            try:
                # The attacker's own traffic flows (its id is its CN now) ...
                own = Inbox()
                operator.subscribe(TOPICS.telemetry("dev-evil"), own)
                _settle(operator)
                probe = _nonce()
                attacker.publish(TOPICS.telemetry("dev-evil"), probe, qos=1, wait=WAIT)
                own.wait_for(TOPICS.telemetry("dev-evil"), probe)
                # ... and the victim was never disconnected: a takeover would have dropped its connection.
                survived = connection.connected and connection.connects == 1
                log = broker.log()
                renamed = "as dev-evil (p5" in log and f"as {wanted} (p5" not in log
                detail = f"asked for client id {wanted!r}; the broker used the CN 'dev-evil'; {target} stayed connected"
                assert not attack_ledger.record(
                    f"client-id takeover of {target} with another device's certificate",
                    not (survived and renamed),
                    detail if survived and renamed else f"victim connects={connection.connects}\n{log[-2000:]}",
                )
            finally:
                attacker.stop()
                operator.unsubscribe(TOPICS.telemetry("dev-evil"))
    finally:
        victim.stop()
        control.stop()


def test_a_device_reads_only_its_own_topics(
    broker: SecureBroker, operator: Connection, attack_ledger: AttackLedger
) -> None:
    # What dev-b is sent, retained and live; a bundle nobody granted dev-evil.
    secrets_ = {
        TOPICS.device_desired("dev-b", "default"): _nonce(),
        TOPICS.infer_request("dev-b"): _nonce(),
        TOPICS.generate_request("dev-b"): _nonce(),
        TOPICS.status("dev-b"): _nonce(),
        TOPICS.telemetry("dev-b"): _nonce(),
        TOPICS.bundle_offer("b-secret"): _nonce(),
        TOPICS.bundle_block("b-secret", 0): _nonce(),
        TOPICS.group_desired("canary", "default"): _nonce(),
        TOPICS.device_desired("dev-b", "detector"): _nonce(),  # another slot of dev-b's
        TOPICS.legacy_device_desired("dev-b"): _nonce(),  # the single-model topic before slots
    }
    for topic, payload in secrets_.items():
        operator.publish(topic, payload, qos=1, retain=True, wait=WAIT)
    filters = [
        *secrets_,
        TOPICS.device_desired_slots("dev-b"),
        TOPICS.group_desired_slots("canary"),
        TOPICS.infer_responses("dev-b"),
        TOPICS.generate_responses("dev-b"),
        f"{TOPICS.prefix}/devices/+/status",
        f"{TOPICS.prefix}/devices/#",
        f"{TOPICS.prefix}/bundles/#",
        f"{TOPICS.prefix}/#",
        "#",
        f"$share/evil/{TOPICS.prefix}/devices/+/telemetry",
        "$CONTROL/dynamic-security/v1/response",
    ]
    inbox = Inbox()
    evil = Connection(broker.url, "evil", protocol="5", tls=broker.pki.tls("dev-evil"))
    for topic_filter in filters:  # forbidden ones first: their retained messages would arrive before the allowed
        evil.subscribe(topic_filter, inbox)
    own = TOPICS.device_desired("dev-evil", "default")
    evil.subscribe(own, inbox)
    evil.start(wait=WAIT)
    try:
        retained_own = _nonce()
        operator.publish(own, retained_own, qos=1, retain=True, wait=WAIT)
        inbox.wait_for(own, retained_own)
        # Live messages too: dev-b's first, dev-evil's after them.
        live = {topic: _nonce() for topic in secrets_}
        for topic, payload in live.items():
            operator.publish(topic, payload, qos=1, wait=WAIT)
        last = _nonce()
        operator.publish(own, last, qos=1, wait=WAIT)
        inbox.wait_for(own, last)
        leaked = sorted(inbox.topics() - {own})
        assert not attack_ledger.record(
            "reading another device's topics (desired, requests, status, telemetry, bundles, wildcards, $share)",
            bool(leaked),
            f"{len(filters)} subscriptions, {2 * len(secrets_)} retained+live messages: "
            + (f"LEAKED {leaked}" if leaked else "0 delivered"),
        )
    finally:
        evil.stop()
        for topic in secrets_:
            operator.publish(topic, b"", qos=1, retain=True, wait=WAIT)
        operator.publish(own, b"", qos=1, retain=True, wait=WAIT)


def test_a_device_certificate_cannot_publish_desired_state_or_offers(
    broker: SecureBroker, operator: Connection, attack_ledger: AttackLedger
) -> None:
    # Whatever the documents look like (signed or not), the broker must not carry them from a device.
    desired = json.dumps({"schema_version": 1, "bundle_id": "b-old", "model_version": "1", "rollback": True}).encode()
    offer = json.dumps({"schema_version": 1, "bundle_id": "b-forged", "transfer": {"size": 2**31}}).encode()
    forged = {
        TOPICS.device_desired("dev-evil", "default"): desired,
        TOPICS.device_desired("dev-a", "default"): desired,
        TOPICS.group_desired("lab", "default"): desired,
        TOPICS.bundle_offer("b-forged"): offer,
        TOPICS.bundle_block("b-forged", 0): b"\x00" * 1024,
        TOPICS.status("dev-a"): b'{"forged": true}',
        TOPICS.generate_response("dev-a", "app"): b'{"forged": "an answer in dev-a\'s name"}',
        TOPICS.generate_request("dev-a"): b'{"prompt": "spend dev-a\'s tokens"}',
        "$CONTROL/dynamic-security/v1": b'{"commands":[{"command":"deleteRole","rolename":"edgefleet-host"}]}',
    }
    seen = Inbox()
    for topic in forged:
        operator.subscribe(topic, seen)
    operator.subscribe(TOPICS.events("dev-evil"), seen)
    _settle(operator)
    evil = broker.connect("dev-evil", client_id="evil")
    refused = 0
    try:
        for topic, payload in forged.items():
            try:
                evil.publish(topic, payload, qos=1, retain=True, wait=WAIT)
            except BrokerError as err:
                assert "Not authorized" in str(err)
                refused += 1
        marker = _nonce()
        evil.publish(TOPICS.events("dev-evil"), marker, qos=1, wait=WAIT)
        seen.wait_for(TOPICS.events("dev-evil"), marker)
        delivered = sorted(seen.topics() & set(forged))
        # Nor was anything retained: a fresh subscriber finds none of it.
        late = Inbox()
        for topic in forged:
            operator.subscribe(topic, late)
        _settle(operator)
        stored = sorted(late.topics())
        # The plugin still answers the control plane: the forged deleteRole did nothing.
        rights = open_rights(operator, TOPICS, "dynsec")
        assert isinstance(rights, DynsecRights)
        assert not attack_ledger.record(
            "a device certificate publishing desired state, offers, blocks, another's status and generation, $CONTROL",
            bool(delivered or stored),
            f"{refused}/{len(forged)} refused with PUBACK 0x87 Not authorized; delivered {delivered or 'none'}, "
            f"retained {stored or 'none'}",
        )
        assert refused == len(forged)
    finally:
        evil.stop()
        for topic in forged:
            operator.unsubscribe(topic)


def test_a_retained_flood_does_not_stay(
    broker: SecureBroker, operator: Connection, attack_ledger: AttackLedger
) -> None:
    evil = broker.connect("dev-evil", client_id="evil")
    flood = [TOPICS.infer_response("dev-evil", f"x{i}") for i in range(200)]
    flood += [TOPICS.telemetry("dev-evil"), TOPICS.events("dev-evil")]
    others = [TOPICS.status("dev-b"), TOPICS.telemetry("dev-b"), TOPICS.infer_response("dev-b", "x")]
    try:
        for topic in others:
            with pytest.raises(BrokerError, match="Not authorized"):
                evil.publish(topic, b"x" * 1000, qos=1, retain=True, wait=WAIT)
        for topic in flood:
            evil.publish(topic, b"x" * 1000, qos=1, retain=True, wait=WAIT)
    finally:
        evil.stop()

    def retained_now() -> set[str]:
        inbox = Inbox()
        conn = broker.connect(CLI_IDENTITY, client_id="retained-census")
        try:
            conn.subscribe(f"{TOPICS.prefix}/devices/#", inbox)
            _settle(conn)
        finally:
            conn.stop()
        return {m[0] for m in inbox.messages if m[2] and m[1]}

    before = retained_now() & set(flood)
    janitor = RetainedJanitor(operator, TOPICS)  # what the control plane runs every retained_sweep_s
    cleared = janitor.sweep()
    after = retained_now()
    stray = sorted(t for t in after if not t.endswith("/status") or t in others)
    assert not attack_ledger.record(
        "a retained flood on device topics (another device's: refused; its own non-status: swept)",
        bool(stray),
        f"{len(others)} refused; {len(before)} retained on its own topics until the sweep cleared {len(cleared)}; "
        f"left after: {len(stray)}",
    )
    assert len(before) == len(flood) and set(cleared) == set(flood)


def test_rights_follow_grants_and_revocations(broker: SecureBroker, operator: Connection) -> None:
    """The mechanism itself: a grant is in force when `follow` returns, a revocation too."""
    rights = open_rights(operator, TOPICS, "auto")
    assert isinstance(rights, DynsecRights)
    inbox = Inbox()
    device = Connection(broker.url, "dev-b", protocol="5", tls=broker.pki.tls("dev-b"))
    device.subscribe(TOPICS.bundle_offer("b-7"), inbox)
    device.start(wait=WAIT)
    try:
        offer = _nonce()
        operator.publish(TOPICS.bundle_offer("b-7"), offer, qos=1, retain=True, wait=WAIT)
        started = time.monotonic()
        change = rights.follow({"dev-b": DeviceGrant("dev-b", frozenset({"lab"}), frozenset({"b-7"}))})
        confirmed = time.monotonic() - started
        assert change.granted == {"dev-b": 8} and not change.unknown  # offer, blocks, chunks by name
        inbox.wait_for(TOPICS.bundle_offer("b-7"), offer)  # after the plugin's reconnect (2.0.11 kicks the client)
        print(f"grant confirmed by the broker in {confirmed:.3f} s; the device had the offer "
              f"{time.monotonic() - started:.2f} s after the grant started")  # fmt: skip
        assert rights.follow({"dev-b": DeviceGrant("dev-b", frozenset({"lab"}), frozenset({"b-7"}))}).granted == {}
        change = rights.follow({"dev-b": DeviceGrant("dev-b", frozenset({"lab"}), frozenset())})
        assert change.revoked == {"dev-b": 8}
        assert device.wait_connected(WAIT)
        _settle(operator)
        later, own = _nonce(), _nonce()
        device.subscribe(TOPICS.device_desired("dev-b", "default"), inbox)
        operator.publish(TOPICS.bundle_offer("b-7"), later, qos=1, retain=True, wait=WAIT)
        operator.publish(TOPICS.device_desired("dev-b", "default"), own, qos=1, wait=WAIT)
        inbox.wait_for(TOPICS.device_desired("dev-b", "default"), own)
        assert (TOPICS.bundle_offer("b-7"), later, False) not in inbox.messages
        # A device the broker does not know is reported, not invented.
        assert rights.follow({"dev-nobody": DeviceGrant("dev-nobody")}).unknown == ["dev-nobody"]
    finally:
        device.stop()
        operator.publish(TOPICS.bundle_offer("b-7"), b"", qos=1, retain=True, wait=WAIT)
        operator.publish(TOPICS.device_desired("dev-b", "default"), b"", qos=1, retain=True, wait=WAIT)


def test_dynsec_config_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "dynamic-security.json"
    cmd = [sys.executable, "-m", "edgefleet", "keys", "dynsec", "--device", "d1:lab", "--host-user", "edgefleet-host"]
    result = subprocess.run([*cmd, "--out", str(out), "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    config = json.loads(out.read_text())
    assert config["defaultACLAccess"] == {
        "publishClientSend": False, "publishClientReceive": False, "subscribe": False, "unsubscribe": True,
    }  # fmt: skip
    assert [c["username"] for c in config["clients"]] == ["edgefleet-host", "d1"]
    d1 = next(r for r in config["roles"] if r["rolename"] == "edgefleet-device-d1")
    assert {
        "acltype": "subscribePattern",
        "topic": TOPICS.group_desired_slots("lab"),
        "priority": 0,
        "allow": True,
    } in d1["acls"]
    again = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "refusing to overwrite" in again.stderr


def test_several_control_plane_processes_each_with_its_own_certificate(broker: SecureBroker, tmp_path: Path) -> None:
    """The client id is the CN, so each control-plane process has its own host certificate; two processes on one
    certificate would take the id from each other, which is what the broker does (shown, not hidden)."""
    from support.rollouts.control_plane import control_plane, wait_until

    with (
        control_plane(broker.url, tmp_path, tls=broker.pki.tls(HOST_IDENTITY)) as first,
        control_plane(broker.url, tmp_path, tls=broker.pki.tls(SECOND_HOST)) as second,
    ):
        leader = wait_until("one engine leader", lambda: [p for p in (first, second) if p.leader])
        assert len(leader) == 1
        for plane in (first, second):
            assert isinstance(plane.publisher.rights, DynsecRights)
            assert plane.conn.connected and plane.conn.connects == 1, "a control plane lost its connection"
        # The same certificate twice: the newer connection takes the CN's id, the older is disconnected.
        same = broker.connect(SECOND_HOST, client_id="edgefleet-control-other")
        try:
            wait_until("the older session taken over", lambda: second.conn.connects > 1, timeout=30)
        finally:
            same.stop()
        assert first.conn.connects == 1


def test_keys_enroll_adds_a_device_to_the_running_broker(broker: SecureBroker, operator: Connection) -> None:
    """A device whose certificate was made after the broker started gets nothing until `keys enroll`; then its
    base rights and its groups' desired topic, nothing more."""
    import subprocess
    import sys

    files = broker.pki.add_device("dev-late")
    cli = broker.pki.tls(SECOND_HOST)  # not the operator fixture's identity: that one is connected (client id = CN)
    late = broker.connect("dev-late", client_id="late")
    with pytest.raises(BrokerError, match="Not authorized"):
        late.publish(TOPICS.status("dev-late"), b"{}", qos=1, wait=WAIT)  # a valid certificate, no role yet
    late.stop()
    tls = ["--ca", cli.ca, "--cert", str(cli.cert), "--key", str(cli.key)]
    cmd = [sys.executable, "-m", "edgefleet", "keys", "enroll", "dev-late", "--group", "lab", "--broker", broker.url,
           *tls, "--json"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"identity": "dev-late", "role": "device", "groups": ["lab"]}
    inbox = Inbox()
    late = Connection(broker.url, "late", protocol="5", tls=broker.pki.tls("dev-late"))
    late.subscribe(TOPICS.group_desired("lab", "default"), inbox)
    late.subscribe(TOPICS.device_desired("dev-a", "default"), inbox)
    late.start(wait=WAIT)
    try:
        marker = _nonce()
        operator.publish(TOPICS.device_desired("dev-a", "default"), _nonce(), qos=1, wait=WAIT)
        late.publish(TOPICS.status("dev-late"), b"{}", qos=1, retain=True, wait=WAIT)  # allowed now
        operator.publish(TOPICS.group_desired("lab", "default"), marker, qos=1, wait=WAIT)
        inbox.wait_for(TOPICS.group_desired("lab", "default"), marker)
        assert inbox.topics() == {TOPICS.group_desired("lab", "default")}
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert again.returncode != 0 and "already exists" in again.stderr, again.stderr
        assert files.cert.exists()
    finally:
        late.stop()
        operator.publish(TOPICS.status("dev-late"), b"", qos=1, retain=True, wait=WAIT)
