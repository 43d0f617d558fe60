"""The host registry decides a device's profile and groups; what a device reports about itself is only compared
(a warning), never believed once it is enrolled. And the rights the control plane asks the broker for follow
that registry view and the resolved deployments, nothing else. Pure logic on a real SQLite store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.desired.sync import plan_desired
from edgefleet.control.fleet.registry import (
    EmptyGroupError,
    enrolment_labels,
    group_members,
    host_view,
    parse_labels,
    registry_warnings,
    require_members,
)
from edgefleet.control.rights.dynsec import (
    Acl,
    base_acls,
    bundle_acls,
    granted_acls,
    is_granted,
    own_desired_acls,
    render_config,
)
from edgefleet.control.rights.sync import DeviceGrant, device_grants
from edgefleet.control.store import Deployment, GroupDef, Store, open_store
from edgefleet.core.errors import UserInputError
from edgefleet.core.messages import DeviceStatus
from edgefleet.core.topics import Topics

PROFILE = "intel-x86-vnni"
TOPICS = Topics()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite://{tmp_path}/control.sqlite")
    reports = [
        DeviceStatus(device_id="cam-1", online=True, state="serving", profile=PROFILE, groups=["line"]),
        DeviceStatus(device_id="cam-2", online=True, state="serving", profile=PROFILE, groups=["line"]),
        # Enrolled in `line`, but it says it is a canary and a Jetson.
        DeviceStatus(device_id="liar", online=True, state="serving", profile="jetson-agx-orin", groups=["canary"]),
        DeviceStatus(device_id="fresh", online=True, state="idle", profile=PROFILE, groups=["canary"]),
    ]
    opened.upsert_statuses(reports, time.time())
    for device in ("cam-1", "cam-2", "liar"):
        opened.set_labels(device, enrolment_labels(PROFILE, ["line"]))
    opened.set_labels("cam-1", enrolment_labels(PROFILE, ["line", "canary"]))
    yield opened
    opened.close()


def _deploy(store: Store, scope: str, target: str, bundle: str) -> None:
    store.put_deployment(
        Deployment(scope=scope, target=target, profile=PROFILE, bundle_id=bundle, model_name="m",  # type: ignore[arg-type]
                   model_version=bundle[-1], updated_at=time.time())
    )  # fmt: skip


def test_the_registry_view_wins_over_what_a_device_reports(store: Store) -> None:
    liar = store.device("liar")
    assert liar is not None
    view = host_view(liar)
    assert (view.profile, view.groups) == (PROFILE, ("line",))
    assert registry_warnings(liar) == [
        f"reports profile jetson-agx-orin, the registry says {PROFILE}",
        "reports groups canary, the registry says line",
    ]
    assert registry_warnings(store.device("cam-2")) == []  # type: ignore[arg-type]
    assert registry_warnings(store.device("fresh"))[0].startswith("not enrolled")  # type: ignore[index]
    canary = [d.device_id for d in group_members("canary", store.groups(), store.devices())]
    # cam-1 is enrolled into canary, so the group is the registry's: "fresh", which only claims it, is no member
    assert canary == ["cam-1"]
    with pytest.raises(UserInputError, match="devices enroll"):
        parse_labels(["registry.groups=canary"])  # only `devices enroll` writes the registry
    with pytest.raises(UserInputError, match="invalid group"):
        enrolment_labels(PROFILE, ["a/b"])


def test_a_device_reporting_itself_a_canary_gets_no_canary_deployment(store: Store) -> None:
    _deploy(store, "group", "line", "b-line-1")
    _deploy(store, "group", "canary", "b-canary-2")
    store.put_group(GroupDef(name="canary", devices=("cam-1",), priority=10))  # host-side: only cam-1
    plan = plan_desired(store)
    assert plan[("cam-1", "default")].bundle_id == "b-canary-2"  # type: ignore[union-attr]
    assert plan[("liar", "default")].bundle_id == "b-line-1"  # type: ignore[union-attr]
    assert plan[("fresh", "default")] is None
    with pytest.raises(EmptyGroupError):
        require_members("nobody", store.groups(), store.devices())
    grants = device_grants(store, plan)
    assert grants["liar"] == DeviceGrant("liar", frozenset({"line"}), frozenset({"b-line-1"}))
    assert grants["cam-1"] == DeviceGrant("cam-1", frozenset({"line", "canary"}), frozenset({"b-canary-2"}))
    # An unenrolled device gets no group's topic and no bundle from its own report, even where the open-fleet
    # resolution would deploy it (an agent-side group the host does not define).
    assert grants["fresh"] == DeviceGrant("fresh", frozenset(), frozenset())
    _deploy(store, "group", "self-made", "b-self-3")
    store.upsert_statuses(
        [DeviceStatus(device_id="fresh", online=True, state="idle", profile=PROFILE, groups=["self-made"])], time.time()
    )
    plan = plan_desired(store)
    assert plan[("fresh", "default")].bundle_id == "b-self-3"  # type: ignore[union-attr]
    assert device_grants(store, plan)["fresh"] == DeviceGrant("fresh", frozenset(), frozenset())


def test_device_roles_hold_only_their_own_topics() -> None:
    base = {a.topic for a in base_acls(TOPICS, "cam-1")}
    # Its own topics, and the agent release offers: signed, public, the same for every device (core/release/).
    assert all("/devices/cam-1/" in topic for topic in base - {TOPICS.agent_release_offers()})
    # Of the base rights, the control plane manages only the device's own desired documents (every slot's, kept
    # current so a role made before slots is upgraded); the rest it never touches.
    managed = {a for a in base_acls(TOPICS, "cam-1") if is_granted(TOPICS, a)}
    assert managed == own_desired_acls(TOPICS, "cam-1")
    assert {a.topic for a in managed} == {TOPICS.device_desired_slots("cam-1")}
    bundle = set(bundle_acls(TOPICS, "b-1"))
    assert Acl("subscribePattern", TOPICS.bundle_blocks("b-1")) in bundle
    assert all(is_granted(TOPICS, a) for a in granted_acls(TOPICS, ["line"], ["b-1"]))
    assert not any(a.acltype == "publishClientSend" for a in granted_acls(TOPICS, ["line"], ["b-1"]))
    with pytest.raises(UserInputError, match="both a host user and a device"):
        render_config({"edgefleet-host": []})
    with pytest.raises(UserInputError, match="invalid group"):
        render_config({"d": ["g#"]})
