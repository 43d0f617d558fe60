"""Hardware profiles: YAML validated by a schema, and detection as a pure function of host facts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgefleet.core.errors import UnknownNameError, UserInputError
from edgefleet.core.profiles import (
    PROFILES_DIR,
    HostFacts,
    detect,
    device_profiles,
    get_profile,
    load_profiles,
    match_reasons,
    profile_lineage,
)

VNNI = HostFacts(arch="x86_64", os="linux", cpu_flags=frozenset({"avx2", "avx512_vnni"}))
AVX2_ONLY = HostFacts(arch="x86_64", os="linux", cpu_flags=frozenset({"avx2"}))
ARM = HostFacts(arch="aarch64", os="linux", cpu_flags=frozenset({"asimd"}))


def test_the_starting_profiles_exist_and_validate() -> None:
    profiles = load_profiles()
    assert {"intel-x86-vnni", "generic-x86-64"} <= set(profiles)
    for profile in profiles.values():
        assert profile.targets and profile.opset.min <= profile.opset.max


@pytest.mark.parametrize(
    ("facts", "expected"),
    [(VNNI, ["intel-x86-vnni", "generic-x86-64"]), (AVX2_ONLY, ["generic-x86-64"])],
)
def test_detection_prefers_the_most_specific_match(facts: HostFacts, expected: list[str]) -> None:
    found = [p.name for p in detect(load_profiles().values(), facts) if p.name in expected]
    assert found == expected


def test_detection_says_why_a_profile_does_not_fit() -> None:
    reasons = match_reasons(get_profile("intel-x86-vnni"), AVX2_ONLY)
    assert reasons == ["CPU has none of avx512_vnni, avx_vnni"]
    assert "arch aarch64" in match_reasons(get_profile("generic-x86-64"), ARM)[0]


def test_an_unknown_profile_lists_the_valid_names() -> None:
    with pytest.raises(UnknownNameError) as err:
        get_profile("jetson-nope")
    assert "intel-x86-vnni" in str(err.value) and "generic-x86-64" in str(err.value)


def _copy_with(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load((PROFILES_DIR / "generic-x86-64.yaml").read_text())
    data.update(changes)
    (tmp_path / "generic-x86-64.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"surprise": 1}, "Extra inputs are not permitted"),
        ({"opset": {"min": 18, "max": 7}}, "opset min 18 is above max 7"),
        ({"targets": []}, "at least 1 item"),
        ({"name": "other-name"}, "they must match"),
    ],
)
def test_invalid_profile_files_are_refused_with_the_reason(tmp_path: Path, change: dict, message: str) -> None:
    load_profiles.cache_clear()
    with pytest.raises(UserInputError, match=message):
        load_profiles(_copy_with(tmp_path, **change))


def test_a_profile_runs_the_bundles_of_the_profiles_it_refines() -> None:
    assert [p.name for p in device_profiles("intel-x86-vnni")] == ["intel-x86-vnni", "generic-x86-64"]
    assert [p.name for p in device_profiles("generic-x86-64")] == ["generic-x86-64"]
    assert profile_lineage("intel-npu") == ["intel-npu", "generic-x86-64"]
    assert profile_lineage("a-profile-the-host-does-not-know") == ["a-profile-the-host-does-not-know"]


def test_detection_ranks_a_refinement_before_what_it_refines() -> None:
    intel_vnni = HostFacts(
        arch="x86_64", os="linux", cpu_flags=frozenset({"avx512_vnni"}), cpu_vendor="GenuineIntel",
        existing_files=frozenset({"/dev/dri/renderD128"}),
    )  # fmt: skip
    found = [p.name for p in detect(load_profiles().values(), intel_vnni)]
    assert found[-1] == "generic-x86-64" and {"intel-igpu", "intel-x86-vnni"} <= set(found)


@pytest.mark.parametrize(
    ("refines", "message"),
    [
        (["tpu-9000"], r"refines unknown profile\(s\) \['tpu-9000'\]"),
        (["generic-x86-64"], "refines itself"),
        (["arm-parent"], r"matches arch \['amd64', 'x86_64'\] it does not"),
    ],
)
def test_a_refinement_must_name_real_profiles_without_cycles(tmp_path: Path, refines: list[str], message: str) -> None:
    _copy_with(tmp_path, refines=refines)
    arm = yaml.safe_load((PROFILES_DIR / "rpi5-arm64.yaml").read_text())
    (tmp_path / "arm-parent.yaml").write_text(yaml.safe_dump({**arm, "name": "arm-parent"}))
    load_profiles.cache_clear()
    with pytest.raises(UserInputError, match=message):
        load_profiles(tmp_path)
    load_profiles.cache_clear()
