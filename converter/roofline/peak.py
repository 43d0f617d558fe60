"""The rules that keep a limit an upper bound: which measured figure stands as this machine's peak, when a cached one
is measured again, how a figure a bundle beat is raised, and the CPU's nominal rate from its ISA and clock.

- A peak is the best the machine has been seen to do: figures merge by their maximum, so a run on a busy machine
  (which only ever measures low) never lowers a stored one.
- A cached figure measured while the machine was busy (a 1-minute load average above its CPU count: runnable work
  waiting for the cores the measurement used) is not trusted alone: it is measured again, and merged.
- A share of a limit is at most 100 %. A bundle that ran faster than the peak allows shows the peak was low: the peak
  is raised to what the bundle achieved (the roofline says so), never reported as more than 100 %.
- The nominal rate (FMA lanes x FMA units x 2 x clock x cores) is an estimate: /proc/cpuinfo names the vector ISA
  and a clock, not the number of FMA units per core, nor the turbo clock a VM hides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


def share_pct(needed_s: float, took_s: float | None) -> float | None:
    """The share of `took_s` that `needed_s` (the time the limit allows) fills, in %, never above 100."""
    if not took_s or took_s <= 0:
        return None
    return min(100.0, 100.0 * needed_s / took_s)


def busy(load_average: float, cpus: int | None) -> bool:
    """Whether a figure measured at this 1-minute load average shared its cores with other work."""
    return load_average > max(1, cpus or 1)


def merged_rates(
    old: Mapping[str, Mapping[str, float]], new: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Runtime -> precision -> rate, each the larger of the two: a limit is the best the machine has reached."""
    out: dict[str, dict[str, float]] = {runtime: dict(rates) for runtime, rates in old.items()}
    for runtime, rates in new.items():
        mine = out.setdefault(runtime, {})
        for precision, rate in rates.items():
            mine[precision] = max(rate, mine.get(precision, 0.0))
    return out


@dataclass(frozen=True)
class Raise:
    """A measured peak a bundle beat: the figure before, the one it achieved, and which bundle."""

    figure: str  # "onnxruntime fp32 GOP/s" or "bandwidth GB/s"
    was: float
    now: float
    by: str

    def note(self) -> str:
        return f"{self.figure} raised from {self.was:.4g} to {self.now:.4g}: {self.by} achieved it"


def raised_rates(rates: Mapping[str, float], needed_s: float, took_s: float | None) -> tuple[dict[str, float], float]:
    """Precision -> rate raised so that work needing `needed_s` at `rates` fits in `took_s`, and the factor (1.0
    when it already fits). Every precision the work used is raised by the same factor: the smallest uniform raise
    the achieved time proves."""
    if not took_s or needed_s <= took_s:
        return dict(rates), 1.0
    factor = needed_s / took_s
    return {precision: rate * factor for precision, rate in rates.items()}, factor


# FP32 lanes of one vector FMA, and FMA units per core, by ISA; an estimate where the unit count varies by core.
_FMA: tuple[tuple[str, int, int, str], ...] = (
    ("avx512f", 16, 2, "AVX-512: 16 FP32 lanes x 2 FMA units (1 on some Xeon SKUs)"),
    ("avx2", 8, 2, "AVX2: 8 FP32 lanes x 2 FMA units"),
    ("asimd", 4, 2, "NEON: 4 FP32 lanes x 2 FMA pipes (1 on in-order cores such as the Cortex-A53)"),
)


@dataclass(frozen=True)
class Nominal:
    """The CPU's nominal FP32 rate at a thread count, and how it was derived (always an estimate)."""

    gflops: float
    flops_per_cycle: int  # per core
    ghz: float
    threads: int
    how: str

    def as_dict(self) -> dict[str, object]:
        return {"gflops": round(self.gflops, 2), "flops_per_cycle": self.flops_per_cycle, "ghz": self.ghz,
                "threads": self.threads, "how": self.how, "estimate": True}  # fmt: skip


def nominal_fp32(cpuinfo: str, threads: int, max_khz: int | None = None) -> Nominal | None:
    """The nominal FP32 rate from /proc/cpuinfo's text (its flags or Features, vendor, family, clock) and the
    cpufreq maximum when the kernel has one; None when the ISA or the clock is unknown."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() not in fields:
            fields[name.strip()] = value.strip()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    found = next(((lanes, units, how) for flag, lanes, units, how in _FMA if flag in flags), None)
    if found is None or ("avx2" in flags and "fma" not in flags and "avx512f" not in flags):
        return None
    lanes, units, how = found
    if fields.get("vendor_id") == "AuthenticAMD" and "avx512f" in flags and fields.get("cpu family") == "25":
        lanes, units, how = 8, 2, "AVX-512 on Zen 4: two 256-bit FMA units (8 FP32 lanes x 2)"
    ghz, clock = _clock(fields, max_khz)
    if ghz is None:
        return None
    per_cycle = lanes * units * 2  # an FMA is two operations
    return Nominal(per_cycle * ghz * threads, per_cycle, ghz, threads, f"{how}, x 2 (FMA) x {ghz:g} GHz {clock} "
                   f"x {threads} core(s); an estimate")  # fmt: skip


def _clock(fields: Mapping[str, str], max_khz: int | None) -> tuple[float | None, str]:
    if max_khz:
        return round(max_khz / 1e6, 3), "(cpufreq maximum)"
    model = fields.get("model name", "")
    if "@" in model and model.rstrip().upper().endswith("GHZ"):
        try:
            return float(model.rsplit("@", 1)[1].strip()[:-3]), "(base clock in the model name; turbo runs above it)"
        except ValueError:
            pass
    mhz = fields.get("cpu MHz")
    if mhz:
        try:
            return round(float(mhz) / 1e3, 3), "(cpu MHz as the kernel reports it; turbo may run above it)"
        except ValueError:
            pass
    return None, ""
