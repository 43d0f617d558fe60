"""`edgefleet rollout start --agent-release FILE`: verifies the release, publishes its signed offer (retained on the
broker), plans an agent-release rollout of the group in waves and records the operator's action in the audit trail;
what it cannot do it refuses before publishing anything."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import pytest

from edgefleet.cli.main import main as cli
from edgefleet.control.credentials import keyring
from edgefleet.control.fleet.registry import enrolment_labels
from edgefleet.control.rollout.commands import load_doc
from edgefleet.control.store import open_store
from edgefleet.core.messages import DeviceStatus, ReleaseOffer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.release import build_release
from edgefleet.core.topics import Topics

from support.servers.brokers import MosquittoBroker

PROFILE = "generic-x86-64"


def _release(tmp_path: Path, keys: keyring.HostKeys) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "edgefleet-0.2.0-py3-none-any.whl").write_bytes(b"the agent " * 500)
    (wheels / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"a dependency " * 900)
    out = tmp_path / "agent-0.2.0.release"
    build_release(wheels, "0.2.0", keys.release_key(), out)
    return out


def _store(tmp_path: Path) -> str:
    url = f"sqlite://{tmp_path}/control.sqlite"
    store = open_store(url)
    for device in ("dc-1", "dc-2"):
        store.upsert_statuses(
            [DeviceStatus(device_id=device, online=True, state="serving", profile=PROFILE, agent_version="0.1.0")], 1.0
        )
        store.set_labels(device, enrolment_labels(PROFILE, ["line"]))
    store.close()
    return url


def test_rollout_start_publishes_the_release_plans_its_waves_and_is_audited(
    tmp_path: Path, host_keys: keyring.HostKeys, capsys: pytest.CaptureFixture[str]
) -> None:
    release, url = _release(tmp_path, host_keys), _store(tmp_path)
    with MosquittoBroker() as broker:
        args = ["rollout", "start", "--agent-release", str(release), "--group", "line", "--canary", "1",
                "--waves", "100%", "--broker", broker.url, "--store", url, "-q"]  # fmt: skip
        assert cli(args) == 0, capsys.readouterr().err
        rollout_id = capsys.readouterr().out.strip()
        offers: queue.Queue[bytes] = queue.Queue()
        conn = Connection(broker.url, "cli-check").start()
        try:
            conn.subscribe(Topics().agent_release_offers(), lambda _t, payload, _r: offers.put(payload), qos=1)
            offer = ReleaseOffer.model_validate_json(offers.get(timeout=30))
        finally:
            conn.stop()
    store = open_store(url)
    try:
        row = store.rollout(rollout_id)
        assert row is not None
        doc = load_doc(row)
        assert doc.spec.agent_release is not None and doc.spec.agent_release.version == "0.2.0"
        assert offer.release_id == doc.spec.agent_release.release_id, "its signed offer is retained on the broker"
        assert doc.spec.bundles == [] and [len(w.devices) for w in doc.waves] == [1, 1]
        (entry,) = [e for e in store.audit() if e.action == "rollout.start"]
        assert (entry.outcome, entry.detail["agent_release"], entry.detail["rollout"]) == (
            "ok", offer.release_id, rollout_id,
        )  # fmt: skip
    finally:
        store.close()
    assert cli(["rollout", "list", "--store", url]) == 0
    capsys.readouterr()  # the table, cut to the terminal's width; what it ships, in full:
    assert cli(["rollout", "list", "--store", url, "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)["rollouts"]
    assert (summary["agent_release"], summary["bundles"]) == (offer.release_id, [])


def test_rollout_start_refuses_an_agent_release_with_bundles_or_nothing_to_roll_out(
    tmp_path: Path, host_keys: keyring.HostKeys, capsys: pytest.CaptureFixture[str]
) -> None:
    release, url = _release(tmp_path, host_keys), _store(tmp_path)
    bundle = tmp_path / "some.bundle"
    bundle.write_bytes(b"x")
    common = ["--group", "line", "--broker", "mqtt://127.0.0.1:1", "--store", url]
    assert cli(["rollout", "start", str(bundle), "--agent-release", str(release), *common]) == 1
    assert "an agent-release rollout ships no bundle" in capsys.readouterr().err
    assert cli(["rollout", "start", *common]) == 1
    assert "rollout start needs BUNDLE files, or --agent-release FILE" in capsys.readouterr().err
    store = open_store(url)
    try:
        assert store.rollouts() == []
    finally:
        store.close()
