"""An ARM64 CPU's features as the Linux kernel hands them to every process: the AT_HWCAP and AT_HWCAP2 words of the
auxiliary vector (/proc/self/auxv), named as the kernel names them in /proc/cpuinfo's `Features` line.

The same bits are what ONNX Runtime's kernels dispatch on (getauxval: asimddp selects its sdot/udot INT8 kernels,
i8mm its smmla ones), so they are read here rather than /proc/cpuinfo alone: QEMU's user-mode emulation before 8.1
shows the host's x86 /proc/cpuinfo to an aarch64 program, while it sets the auxiliary vector to the emulated CPU's.
Names and bit positions: arch/arm64/include/uapi/asm/hwcap.h and arch/arm64/kernel/cpuinfo.c in Linux.
"""

from __future__ import annotations

import struct
from pathlib import Path

AT_HWCAP = 16
AT_HWCAP2 = 26

HWCAP_NAMES = (
    "fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp", "asimdhp", "cpuid",
    "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4", "asimddp", "sha512", "sve", "asimdfhm", "dit",
    "uscat", "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg",
)  # fmt: skip
HWCAP2_NAMES = (
    "dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint", "svei8mm",
    "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng", "bti", "mte", "ecv", "afp", "rpres",
)  # fmt: skip


def decode(auxv: bytes) -> frozenset[str]:
    """The feature names set in a 64-bit little-endian auxiliary vector (pairs of type and value, ending at type 0)."""
    words: dict[int, int] = {}
    for kind, value in struct.iter_unpack("<QQ", auxv[: len(auxv) // 16 * 16]):
        if kind == 0:
            break
        words[kind] = value
    names = {name for bit, name in enumerate(HWCAP_NAMES) if words.get(AT_HWCAP, 0) >> bit & 1}
    names |= {name for bit, name in enumerate(HWCAP2_NAMES) if words.get(AT_HWCAP2, 0) >> bit & 1}
    return frozenset(names)


def read(path: Path = Path("/proc/self/auxv")) -> frozenset[str]:
    """This process's ARM64 CPU features; empty where the auxiliary vector cannot be read."""
    try:
        return decode(path.read_bytes())
    except OSError:
        return frozenset()
