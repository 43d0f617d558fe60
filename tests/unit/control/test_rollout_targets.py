"""Who a rollout targets and where a device goes back to: the host's own records decide, never a device's report."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.control.fleet.registry import REGISTRY_REVOKED, enrolment_labels
from edgefleet.control.rollout.targets import group_choices, plan_targets, rollback_target
from edgefleet.control.store import BundleRecord, DeviceRecord, GroupDef


def device(device_id: str, *, reports: tuple[str, ...] = (), profile: str | None = "generic-x86-64",
           enrol: tuple[str | None, tuple[str, ...]] | None = None, **labels: str) -> DeviceRecord:  # fmt: skip
    host = dict(enrolment_labels(enrol[0], enrol[1])) if enrol is not None else {}
    host.update(labels)
    return DeviceRecord(device_id=device_id, online=True, state="serving", profile=profile, groups=reports,
                        labels=host)  # fmt: skip


LAB = ("generic-x86-64", ("lab",))
FLEET = [
    device("enrolled", reports=("lab",), enrol=LAB),
    device("quiet-enrolled", enrol=LAB),  # reports nothing: the registry still has it in lab
    device("claimer", reports=("lab",)),  # never enrolled, claims lab
    device("elsewhere", reports=("lab",), enrol=("generic-x86-64", ("prod",))),  # enrolled into prod, claims lab
    device("no-profile", enrol=(None, ("lab",))),
    device("revoked", reports=("lab",), enrol=LAB, **{REGISTRY_REVOKED: "2024-01-01"}),
    device("liar-profile", reports=("lab",), profile="intel-x86-vnni", enrol=LAB),  # reports another profile
]


def test_only_devices_the_registry_has_in_the_group_are_planned() -> None:
    targets = plan_targets("lab", {}, FLEET)
    assert sorted(d.device_id for d in targets.members) == ["enrolled", "liar-profile", "quiet-enrolled"]
    assert sorted(targets.left_out) == ["claimer", "elsewhere", "no-profile", "revoked"]
    assert targets.left_out["claimer"].startswith("not enrolled: reports group lab")
    assert targets.left_out["elsewhere"] == "reports group lab, the registry says prod"
    assert "without a profile" in targets.left_out["no-profile"]


def test_a_members_profile_is_the_registrys_and_its_own_report_is_a_warning_beside_it() -> None:
    targets = plan_targets("lab", {}, FLEET)
    liar = next(d for d in targets.members if d.device_id == "liar-profile")
    assert liar.profile == "generic-x86-64"
    assert targets.warnings["liar-profile"] == ["reports profile intel-x86-vnni, the registry says generic-x86-64"]
    assert "enrolled" not in targets.warnings


@pytest.mark.parametrize(
    ("definition", "planned", "left_out"),
    [
        (GroupDef("lab", devices=("enrolled", "claimer")), ["enrolled", "liar-profile", "quiet-enrolled"],
         {"claimer": "not enrolled: is listed in group lab"}),
        (GroupDef("lab", selector="site=a"), ["enrolled", "liar-profile", "quiet-enrolled"], {}),
    ],
    ids=["static-list", "selector"],
)  # fmt: skip
def test_host_side_groups_still_need_an_enrolled_device(
    definition: GroupDef, planned: list[str], left_out: dict[str, str]
) -> None:
    fleet = [*FLEET, device("labelled-claimer", site="a")]
    targets = plan_targets("lab", {"lab": definition}, fleet)
    assert sorted(d.device_id for d in targets.members) == planned
    for device_id, why in left_out.items():
        assert targets.left_out[device_id].startswith(why)


def test_the_forms_offer_groups_from_host_records_only() -> None:
    fleet = [*FLEET, device("stranger", reports=("made-up",))]
    assert group_choices({"nightly": GroupDef("nightly", selector="x=y")}, fleet) == ["lab", "nightly", "prod"]


def record(bundle_id: str = "m-1-generic-x86-64", profile: str = "generic-x86-64") -> BundleRecord:
    return BundleRecord(bundle_id, "m", "1", profile, 100, 0.01, 0.0)


@pytest.mark.parametrize(
    ("claimed", "published", "committed", "profile", "target", "why"),
    [
        ("m-1-generic-x86-64", record(), True, "generic-x86-64", "m-1-generic-x86-64", ""),
        ("m-1-generic-x86-64", record(), True, "intel-x86-vnni", "m-1-generic-x86-64", ""),  # a refined profile
        (None, None, False, "generic-x86-64", None, "ran no bundle before the rollout"),
        ("made-up\x1b[2J", None, False, "generic-x86-64", None, "which the store never published"),
        ("m-1-generic-x86-64", record(), False, "generic-x86-64", None, "no commit of it from this device"),
        ("m-1-generic-x86-64", record(profile="jetson-orin-nano"), True, "generic-x86-64", None,
         "built for jetson-orin-nano"),
        ("other", record(), True, "generic-x86-64", None, "never published"),  # a record of another id
    ],
    ids=["published-and-committed", "refined-profile", "none", "made-up", "never-committed", "other-profile",
         "mismatched-record"],
)  # fmt: skip
def test_a_rollback_target_is_published_and_committed(
    claimed: str | None, published: BundleRecord | None, committed: bool, profile: str, target: str | None, why: str
) -> None:
    found = rollback_target(claimed, profile, published, committed)
    assert (found.bundle.bundle_id if found.bundle else None) == target
    assert why in found.reason
    assert "\x1b" not in found.reason, "a device's string is escaped before it is shown"


def test_a_targets_strings_are_the_stores_never_the_devices() -> None:
    found = rollback_target("m-1-generic-x86-64", "generic-x86-64", record(), True)
    fields: dict[str, Any] = {"id": found.bundle.bundle_id, "name": found.bundle.model_name} if found.bundle else {}
    assert fields == {"id": "m-1-generic-x86-64", "name": "m"}
