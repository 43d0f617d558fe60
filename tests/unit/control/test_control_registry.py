"""The registry's pure logic: selectors, group membership, and which deployment wins for a device."""

from __future__ import annotations

import pytest

from edgefleet.control.fleet.registry import (
    EmptyGroupError,
    Selector,
    SelectorError,
    group_members,
    memberships,
    parse_labels,
    require_members,
    resolve_desired,
)
from edgefleet.control.store import Deployment, DeviceRecord, GroupDef
from edgefleet.core.errors import UserInputError


def device(device_id: str, profile: str = "intel-x86-vnni", groups: tuple[str, ...] = (), online: bool = True,
           **labels: str) -> DeviceRecord:  # fmt: skip
    return DeviceRecord(device_id=device_id, online=online, state="serving", profile=profile, groups=groups,
                        labels=labels, arch="x86_64", os="linux", agent_version="0.1.0")  # fmt: skip


FLEET = [
    device("a1", site="berlin", tier="canary"),
    device("a2", site="berlin", groups=("line-1",)),
    device("b1", profile="generic-x86-64", site="paris", groups=("line-1", "line-2")),
    device("b2", profile="generic-x86-64", online=False),
]


@pytest.mark.parametrize(
    ("selector", "members"),
    [
        ("site=berlin", ["a1", "a2"]),
        ("site!=berlin", ["b1", "b2"]),
        ("site", ["a1", "a2", "b1"]),
        ("!site", ["b2"]),
        ("site in (berlin|paris), tier!=canary", ["a2", "b1"]),
        ("profile=generic-x86-64", ["b1", "b2"]),
        ("profile=generic-x86-64,online=true", ["b1"]),
        ("group=line-1", ["a2", "b1"]),
        ("group=line-2,site=paris", ["b1"]),
        ("arch=x86_64,os=linux,agent-version=0.1.0", ["a1", "a2", "b1", "b2"]),
    ],
)
def test_selectors(selector: str, members: list[str]) -> None:
    parsed = Selector.parse(selector)
    assert [d.device_id for d in FLEET if parsed.matches(d)] == members


@pytest.mark.parametrize("text", ["", " , ", "site==x", "a b", "site in ()", "=x", "site in (a|b"])
def test_bad_selectors_say_how_to_write_one(text: str) -> None:
    with pytest.raises(SelectorError):
        Selector.parse(text)


def test_static_lists_and_selectors_make_one_group() -> None:
    groups = {"berlin-plus": GroupDef("berlin-plus", ("b2",), "site=berlin")}
    assert [d.device_id for d in group_members("berlin-plus", groups, FLEET)] == ["a1", "a2", "b2"]


def test_an_undefined_group_name_means_the_agents_own_group() -> None:
    assert [d.device_id for d in group_members("line-1", {}, FLEET)] == ["a2", "b1"]


def test_an_empty_group_is_a_clear_error_listing_the_groups_that_exist() -> None:
    groups = {"tokyo": GroupDef("tokyo", (), "site=tokyo")}
    with pytest.raises(EmptyGroupError, match=r"group 'tokyo' has no devices .*groups: line-1, line-2, tokyo"):
        require_members("tokyo", groups, FLEET)
    with pytest.raises(EmptyGroupError, match="no host-side group or agent --group has that name"):
        require_members("nowhere", groups, FLEET)


def test_labels_from_the_command_line() -> None:
    assert parse_labels(["site=berlin", "rack=3"]) == {"site": "berlin", "rack": "3"}
    with pytest.raises(UserInputError, match="comes from the device's status"):
        parse_labels(["profile=x"])
    with pytest.raises(UserInputError, match="use key=value"):
        parse_labels(["novalue"])


def dep(scope: str, target: str, bundle: str, profile: str = "intel-x86-vnni") -> Deployment:
    return Deployment(scope, target, profile, bundle, "m", "1")  # type: ignore[arg-type]


def test_the_most_specific_deployment_wins() -> None:
    groups = {
        "berlin": GroupDef("berlin", (), "site=berlin", priority=10),
        "canaries": GroupDef("canaries", (), "tier=canary", priority=20),
    }
    deployments = [
        dep("fleet", "*", "base-vnni"),
        dep("fleet", "*", "base-generic", profile="generic-x86-64"),
        dep("group", "berlin", "berlin-v2"),
        dep("group", "canaries", "canary-v3"),
        dep("group", "line-1", "line-v4", profile="generic-x86-64"),
        dep("device", "a2", "pinned-v1"),
    ]
    member = memberships(groups, FLEET, ["line-1"])
    resolved = {d.device_id: resolve_desired(d, deployments, groups, member[d.device_id]) for d in FLEET}
    assert {k: v.bundle_id if v else None for k, v in resolved.items()} == {
        "a1": "canary-v3",  # in berlin (10) and canaries (20): the higher priority wins
        "a2": "pinned-v1",  # a device override beats every group
        "b1": "line-v4",  # the agent's own group, for its profile
        "b2": "base-generic",  # nothing more specific: the fleet base for its profile
    }


def test_no_deployment_for_the_devices_profile_means_none() -> None:
    assert resolve_desired(FLEET[3], [dep("fleet", "*", "base-vnni")], {}, set()) is None


def test_a_device_gets_the_most_specific_bundle_available_for_its_profile() -> None:
    vnni, generic = FLEET[0], FLEET[2]
    only_generic = [dep("fleet", "*", "base-generic", profile="generic-x86-64")]
    assert resolve_desired(vnni, only_generic, {}, set()).bundle_id == "base-generic"  # type: ignore[union-attr]
    both = [*only_generic, dep("fleet", "*", "base-vnni")]
    assert resolve_desired(vnni, both, {}, set()).bundle_id == "base-vnni"  # type: ignore[union-attr]
    assert resolve_desired(generic, both, {}, set()).bundle_id == "base-generic"  # type: ignore[union-attr]
    assert resolve_desired(generic, [dep("fleet", "*", "base-vnni")], {}, set()) is None
