"""Which retained desired documents count for broker rights (edgefleet/control/rights/documents.py), and how long
a right nobody's document names survives (broker_rights_grace.py). No broker: the documents are signed with the
session's real keys, exactly as the control plane and `edgefleet deploy` sign them.

A document counts only as a device would count it: signed by a delegated ops key, bound to the topic it sits on,
not older than the document known for that topic. A refused payload leaves the known document in force."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import sign_desired
from edgefleet.control.rights.documents import DocumentsInForce, load_root, verified_named
from edgefleet.control.rights.external_grants import ForeignGrace
from edgefleet.core.messages import Desired, SignedDesired
from edgefleet.core.topics import Topics
from edgefleet.core.trust.keyset import sign_payload
from edgefleet.core.trust.signing import SigningKey

from support.attacks.ledger import AttackLedger

TOPICS = Topics()


def _desired(bundle: str, **fields: object) -> Desired:
    return Desired(bundle_id=bundle, model_name="m", model_version="1", profile="p", **fields)  # type: ignore[arg-type]


def _signed(keys: HostKeys, desired: Desired, target: str) -> bytes:
    return sign_desired(keys, desired, target).encode()


def test_a_document_names_its_bundle_shadow_and_allowed_downgrade(host_keys: HostKeys) -> None:
    root = load_root(host_keys.root_public())
    assert root is not None
    three = _desired("b-3", shadow_bundle_id="b-2", allow_downgrade_to="b-1")
    named = verified_named(TOPICS, TOPICS.device_desired("d1", "default"), _signed(host_keys, three, "device:d1"), root)
    assert named is not None and named.bundles == {"b-1", "b-2", "b-3"}
    rollback = _desired("b-0", rollback=True)  # a signed rollback names the older bundle as run and downgrade
    named = verified_named(
        TOPICS, TOPICS.group_desired("lab", "default"), _signed(host_keys, rollback, "group:lab"), root
    )
    assert named is not None and named.bundles == {"b-0"}
    clear = Desired(bundle_id="", model_name="", model_version="", profile="", clear=True)
    named = verified_named(TOPICS, TOPICS.device_desired("d1", "default"), _signed(host_keys, clear, "device:d1"), root)
    assert named is not None and named.bundles == frozenset()


def test_documents_a_device_would_refuse_grant_nothing(host_keys: HostKeys, attack_ledger: AttackLedger) -> None:
    root = load_root(host_keys.root_public())
    assert root is not None
    topic = TOPICS.device_desired("d1", "default")
    forged_key = SigningKey(Ed25519PrivateKey.generate())
    bound = _desired("b-evil").model_copy(update={"target": "device:d1", "counter": 2**62, "expires_at": 2e9})
    forged = SignedDesired(
        desired=sign_payload("desired", bound.model_dump_json(), forged_key), keyset=host_keys.keyset()
    )
    cases = {
        "a document signed by an undelegated key": forged.encode(),
        "a document bound to another device": _signed(host_keys, _desired("b-evil"), "device:d2"),
        "a group's document on a device's topic": _signed(host_keys, _desired("b-evil"), "group:lab"),
        "an unsigned document": _desired("b-evil").model_dump_json().encode(),
    }
    for name, payload in cases.items():
        named = verified_named(TOPICS, topic, payload, root)
        assert not attack_ledger.record(f"bundle rights through {name}", named is not None, f"counted: {named}")
    assert verified_named(TOPICS, f"{TOPICS.prefix}/devices/d1/status", _signed(host_keys, _desired("b"), "device:d1"),
                          root) is None  # fmt: skip


def test_a_replayed_or_refused_payload_leaves_the_known_document_in_force(
    host_keys: HostKeys, attack_ledger: AttackLedger
) -> None:
    documents = DocumentsInForce(TOPICS, load_root(host_keys.root_public()))
    topic = TOPICS.device_desired("d1", "default")
    old = _signed(host_keys, _desired("b-1"), "device:d1")
    new = _signed(host_keys, _desired("b-2"), "device:d1")
    documents.consider(topic, old)
    documents.consider(topic, new)
    for payload in (old, b"", b"{not json"):  # a replay, an empty retained message, junk
        documents.consider(topic, payload)
    named = documents.snapshot().named_for("d1", [])
    assert not attack_ledger.record(
        "bundle rights through a replayed document (the rights sync's view)", named != {"b-2"}, f"names {named}"
    )
    group = _signed(host_keys, _desired("b-g"), "group:lab")
    documents.consider(TOPICS.group_desired("lab", "default"), group)
    snapshot = documents.snapshot()
    assert snapshot.named_for("d1", ["lab"]) == {"b-2", "b-g"}
    assert snapshot.named_for("d1", ["lab"], skip_own=True) == {"b-g"}  # a deploy replacing d1's own document
    assert snapshot.named_for("d1", ["lab"], skip_groups=["lab"]) == {"b-2"}
    assert snapshot.named_for("d1", []) == {"b-2"}  # not a member: the group's document is not its


def test_a_right_someone_else_granted_is_kept_for_the_grace_then_revoked() -> None:
    now = [0.0]
    grace = ForeignGrace(grace_s=60.0, clock=lambda: now[0])
    # The sync wanted b-1; a CLI deploy granted b-2 and has not published its document yet.
    assert grace.kept("d1", frozenset({"b-1"}), frozenset({"b-1"})) == frozenset()
    assert grace.kept("d1", frozenset({"b-1", "b-2"}), frozenset({"b-1"})) == {"b-2"}
    now[0] = 59.0
    assert grace.kept("d1", frozenset({"b-1", "b-2"}), frozenset({"b-1"})) == {"b-2"}
    now[0] = 61.0  # the deploy died before its document: the right goes
    assert grace.kept("d1", frozenset({"b-1", "b-2"}), frozenset({"b-1"})) == frozenset()
    # What the sync itself wanted and no longer does goes at once.
    assert grace.kept("d1", frozenset({"b-1"}), frozenset()) == frozenset()
    # A bundle granted again later starts a new grace.
    assert grace.kept("d1", frozenset({"b-3"}), frozenset()) == {"b-3"}
