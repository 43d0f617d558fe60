"""How near a candidate runs to this machine's limit (a roofline): its work and bytes per inference, its achieved
rates at its measured latency, and the time the measured limits allow for that work.

- compute-limited time: every MAC at the GEMM rate of its precision in the candidate's runtime (an INT8 MAC at
  the INT8 rate, a precision without a native kernel at the FP32 rate); element-wise work is left out (it is
  bandwidth work);
- memory-limited time: the bytes moved at the measured bandwidth.

`% of compute peak` and `% of bandwidth` are those times over the measured latency; the bound is the larger of
the two, and `% of the limit` is its share. A candidate at 5 % of its limit has room that one at 70 % does not.

A limit is an upper bound: no share is above 100 %. A candidate that ran faster than a measured peak allows proves
the peak low, and the peak is raised to what it achieved (`raised` says which figure, from what, to what;
converter.roofline.peak); `raises()` gives them so the caller keeps the raised figure (limits.remember).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from edgefleet.converter.roofline.limits import MachineLimits
from edgefleet.converter.roofline.peak import Raise, raised_rates, share_pct
from edgefleet.converter.roofline.work import Work


@dataclass(frozen=True)
class Roofline:
    work: dict[str, object]  # Work.as_dict(): MACs by op and precision, FLOPs, bytes moved
    latency_ms: float | None
    threads: int
    achieved_gops: float | None  # (2·MACs + other operations) / latency
    achieved_gbs: float | None  # bytes moved / latency
    peaks_gops: dict[str, float]  # precision -> the measured rate its MACs are set against
    bandwidth_gbs: float
    compute_ms: float  # the work at the measured peaks
    memory_ms: float  # the bytes at the measured bandwidth
    compute_pct: float | None
    bandwidth_pct: float | None
    bound: str  # "compute" or "memory": which limit is nearer
    limit_pct: float | None  # the bound's share of the measured latency (at most 100)
    raised: list[str] = field(default_factory=list)  # peaks this candidate beat, raised to what it achieved

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def roofline(
    work: Work, runtime: str, limits: MachineLimits, latency_ms: float | None, name: str = "this candidate"
) -> Roofline:
    line, _ = judged(work, runtime, limits, latency_ms, name)
    return line


def judged(
    work: Work, runtime: str, limits: MachineLimits, latency_ms: float | None, name: str = "this candidate"
) -> tuple[Roofline, list[tuple[str, str, float, Raise]]]:
    """The roofline, and the peaks it raised: (runtime, precision or "bandwidth", the raised rate, why)."""
    rates: dict[str, float] = {}  # the figure's precision -> its rate
    labels: dict[str, str] = {}  # the work's precision -> the figure it is set against
    macs_at: dict[str, int] = {}
    for precision, macs in work.macs_by_precision.items():
        found = limits.peak(runtime, precision)
        if found is None:
            continue
        rate, used = found
        rates[used] = rate
        labels[precision] = used
        macs_at[used] = macs_at.get(used, 0) + macs
    seconds = latency_ms / 1e3 if latency_ms else None
    compute_s = sum(2 * macs / (rates[used] * 1e9) for used, macs in macs_at.items())
    raises: list[tuple[str, str, float, Raise]] = []
    new_rates, factor = raised_rates(rates, compute_s, seconds)
    if factor > 1.0:
        figures = {p: r for p, r in new_rates.items() if macs_at.get(p)}
        for used, rate in figures.items():
            figure = f"{_runtime_of(limits, runtime)} {used} GOP/s"
            raises.append((_runtime_of(limits, runtime), used, rate, Raise(figure, rates[used], rate, name)))
        rates, compute_s = new_rates, compute_s / factor
    bandwidth = limits.bandwidth_gbs
    memory_s = work.bytes_moved / (bandwidth * 1e9) if bandwidth else 0.0
    if seconds and memory_s > seconds:  # it moved its bytes faster than the measured bandwidth: raise it
        achieved = work.bytes_moved / seconds / 1e9
        raises.append(("memory", "bandwidth", achieved, Raise("bandwidth GB/s", bandwidth, achieved, name)))
        bandwidth, memory_s = achieved, seconds
    peaks = {(p if used == p else f"{p} (as {used})"): round(rates[used], 2) for p, used in labels.items()}
    bound = "compute" if compute_s >= memory_s else "memory"
    line = Roofline(
        work=work.as_dict(),
        latency_ms=latency_ms,
        threads=limits.threads,
        achieved_gops=work.flops / seconds / 1e9 if seconds else None,
        achieved_gbs=work.bytes_moved / seconds / 1e9 if seconds else None,
        peaks_gops=peaks,
        bandwidth_gbs=round(bandwidth, 2),
        compute_ms=compute_s * 1e3,
        memory_ms=memory_s * 1e3,
        compute_pct=share_pct(compute_s, seconds),
        bandwidth_pct=share_pct(memory_s, seconds),
        bound=bound,
        limit_pct=share_pct(max(compute_s, memory_s), seconds),
        raised=[why.note() for *_, why in raises],
    )
    return line, raises


def _runtime_of(limits: MachineLimits, runtime: str) -> str:
    """The runtime whose figures `limits.peak` read (ONNX Runtime's where the runtime has none)."""
    return runtime if limits.gemm_gops.get(runtime) else "onnxruntime"
