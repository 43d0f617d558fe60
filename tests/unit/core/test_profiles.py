"""Hardware profiles: YAML validated by a schema, and detection as a pure function of host facts."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import yaml

from edgefleet.core import arm_hwcaps
from edgefleet.core.errors import UnknownNameError, UserInputError
from edgefleet.core.profiles import (
    PROFILES_DIR,
    HostFacts,
    detect,
    detection_reasons,
    device_profiles,
    get_profile,
    int8_notes,
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
    arm.pop("refines", None)
    (tmp_path / "arm-parent.yaml").write_text(yaml.safe_dump({**arm, "name": "arm-parent"}))
    load_profiles.cache_clear()
    with pytest.raises(UserInputError, match=message):
        load_profiles(tmp_path)
    load_profiles.cache_clear()


# /proc/cpuinfo as each board's kernel writes it (the first processor; the fields detection reads).
PI5_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1
"""
ORIN_CPUINFO = """processor\t: 0
model name\t: ARMv8 Processor rev 1 (v8l)
BogoMIPS\t: 62.50
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat
CPU implementer\t: 0x41
CPU part\t: 0xd42
"""
A53_CPUINFO = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd03
"""
TEGRA = "/etc/nv_tegra_release"


def _arm(cpuinfo: str, board: str = "", files: tuple[str, ...] = ()) -> HostFacts:
    return HostFacts.parse(cpuinfo, arch="aarch64", os="Linux", board=board, existing_files=files)


@pytest.mark.parametrize(
    ("facts", "expected", "int8_note"),
    [
        (_arm(PI5_CPUINFO, "Raspberry Pi 5 Model B Rev 1.0"), ["rpi5-arm64", "generic-arm64"], False),
        (_arm(ORIN_CPUINFO, "NVIDIA Jetson AGX Orin Developer Kit", (TEGRA,)), ["jetson-agx-orin", "generic-arm64"],
         False),
        (_arm(ORIN_CPUINFO, "NVIDIA Jetson Orin Nano Developer Kit", (TEGRA,)),
         ["jetson-orin-nano", "generic-arm64"], False),
        (_arm(A53_CPUINFO, "Pine64 PINE A64+"), ["generic-arm64"], True),  # a Cortex-A53 board: no asimddp
        (_arm(""), ["generic-arm64"], True),  # no /proc/cpuinfo at all (a container): still an ARM64 Linux
    ],
)  # fmt: skip
def test_an_arm64_board_detects_the_most_specific_arm_profile_and_falls_back_to_generic_arm64(
    facts: HostFacts, expected: list[str], int8_note: bool
) -> None:
    found = detect(load_profiles().values(), facts)
    assert [p.name for p in found] == expected
    notes = int8_notes(found[-1], facts)  # generic-arm64 says whether INT8 has its dot product here
    assert bool(notes) is int8_note
    if int8_note:
        assert "none of asimddp" in notes[0]


def test_cpuinfo_text_gives_the_flags_vendor_and_features_detection_reads() -> None:
    pi = _arm(PI5_CPUINFO)
    assert {"asimd", "asimddp", "fphp"} <= pi.cpu_flags and pi.arch == "aarch64" and pi.os == "linux"
    x86 = HostFacts.parse("vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512_vnni\n", arch="x86_64", os="Linux")
    assert x86.cpu_vendor == "GenuineIntel" and "avx512_vnni" in x86.cpu_flags


def test_why_an_arm_board_is_not_a_pi_or_a_jetson_is_said() -> None:
    board = _arm(A53_CPUINFO, "Pine64 PINE A64+")
    assert match_reasons(get_profile("rpi5-arm64"), board) == ["board 'Pine64 PINE A64+' is none of ['Raspberry Pi 5']"]
    assert "missing /etc/nv_tegra_release" in match_reasons(get_profile("jetson-orin-nano"), board)


def test_the_arm_profiles_nest_under_generic_arm64_as_the_x86_ones_under_generic_x86_64() -> None:
    for name in ("rpi5-arm64", "jetson-orin-nano", "jetson-agx-orin"):
        assert profile_lineage(name) == [name, "generic-arm64"]
    assert device_profiles("generic-arm64") == [get_profile("generic-arm64")]
    assert get_profile("generic-arm64").targets[0].int8_fast_with == ["asimddp"]
    assert get_profile("generic-x86-64").targets[0].int8_fast_with == ["avx512_vnni", "avx_vnni"]
    assert int8_notes(get_profile("generic-x86-64"), VNNI) == [] and int8_notes(
        get_profile("generic-x86-64"), AVX2_ONLY
    )


def _auxv(hwcap: int, hwcap2: int = 0) -> bytes:
    """An aarch64 auxiliary vector: AT_PAGESZ, AT_HWCAP, AT_HWCAP2, then AT_NULL."""
    words = [(6, 4096), (arm_hwcaps.AT_HWCAP, hwcap), (arm_hwcaps.AT_HWCAP2, hwcap2), (0, 0)]
    return b"".join(struct.pack("<QQ", kind, value) for kind, value in words)


def test_the_kernels_hwcaps_name_the_arm_cpu_features_as_cpuinfo_does() -> None:
    # Cortex-A76 (Raspberry Pi 5): fp asimd ... asimddp; a Neoverse-class CPU adds i8mm and bf16 in AT_HWCAP2.
    a76 = 1 << 0 | 1 << 1 | 1 << 20
    assert arm_hwcaps.decode(_auxv(a76)) == {"fp", "asimd", "asimddp"}
    assert {"i8mm", "bf16", "asimddp"} <= arm_hwcaps.decode(_auxv(a76, 1 << 13 | 1 << 14))
    assert arm_hwcaps.decode(_auxv(1 << 0 | 1 << 1)) == {"fp", "asimd"}  # a Cortex-A53/A72: no dot product
    assert arm_hwcaps.read(Path("/nonexistent/auxv")) == frozenset()


def test_an_emulated_arm_cpu_is_judged_by_its_hwcaps_not_the_hosts_x86_cpuinfo() -> None:
    """QEMU's user mode before 8.1 shows an aarch64 program the host's /proc/cpuinfo; the auxiliary vector is the
    emulated CPU's (tests/e2e/test_arm64_agent.py runs the agent so)."""
    host_text = "vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512_vnni\n"
    emulated = HostFacts.parse(host_text, arch="aarch64", os="Linux", hwcaps=arm_hwcaps.decode(_auxv(0b11 | 1 << 20)))
    assert emulated.cpu_flags == {"fp", "asimd", "asimddp"} and emulated.cpu_vendor == ""
    assert [p.name for p in detect(load_profiles().values(), emulated)] == ["generic-arm64"]
    assert int8_notes(get_profile("generic-arm64"), emulated) == []
    without_dot = HostFacts.parse(host_text, arch="aarch64", os="Linux", hwcaps={"fp", "asimd"})
    assert "none of asimddp" in int8_notes(get_profile("generic-arm64"), without_dot)[0]


def test_detection_says_what_matched_what_did_not_and_what_int8_lacks() -> None:
    lines = detection_reasons(load_profiles().values(), _arm(A53_CPUINFO, "Pine64 PINE A64+"))
    assert lines[0] == "generic-arm64 matches: arch aarch64|arm64, os linux"
    assert "rpi5-arm64 does not: board 'Pine64 PINE A64+' is none of ['Raspberry Pi 5']" in lines
    assert any(line.startswith("jetson-orin-nano does not: missing /etc/nv_tegra_release") for line in lines)
    assert not any(line.startswith("intel-x86-vnni") for line in lines), "only the ARM refinements are explained"
    assert lines[-1].startswith("generic-arm64: onnxruntime INT8: the CPU has none of asimddp")
    pi = detection_reasons(load_profiles().values(), _arm(PI5_CPUINFO, "Raspberry Pi 5 Model B Rev 1.0"))
    assert pi[:2] == [
        "rpi5-arm64 matches: arch aarch64|arm64, os linux, board Raspberry Pi 5; refines generic-arm64",
        "generic-arm64 matches: arch aarch64|arm64, os linux",
    ] and not any("INT8" in line for line in pi)
