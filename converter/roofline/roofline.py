"""How near a candidate runs to this machine's limit (a roofline): its work and bytes per inference, its achieved
rates at its measured latency, and the time the measured limits allow for that work.

- compute-limited time: every MAC at the GEMM rate of its precision in the candidate's runtime (an INT8 MAC at
  the INT8 rate, a precision without a native kernel at the FP32 rate); element-wise work is left out (it is
  bandwidth work);
- memory-limited time: the bytes moved at the measured bandwidth.

`% of compute peak` and `% of bandwidth` are those times over the measured latency; the bound is the larger of
the two, and `% of the limit` is its share. A candidate at 5 % of its limit has room that one at 70 % does not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edgefleet.converter.roofline.limits import MachineLimits
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
    limit_pct: float | None  # the bound's share of the measured latency

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def roofline(work: Work, runtime: str, limits: MachineLimits, latency_ms: float | None) -> Roofline:
    peaks: dict[str, float] = {}
    compute_s = 0.0
    for precision, macs in work.macs_by_precision.items():
        found = limits.peak(runtime, precision)
        if found is None:
            continue
        rate, used = found
        peaks[precision if used == precision else f"{precision} (as {used})"] = round(rate, 2)
        compute_s += 2 * macs / (rate * 1e9)
    memory_s = work.bytes_moved / (limits.bandwidth_gbs * 1e9) if limits.bandwidth_gbs else 0.0
    bound = "compute" if compute_s >= memory_s else "memory"
    seconds = latency_ms / 1e3 if latency_ms else None
    return Roofline(
        work=work.as_dict(),
        latency_ms=latency_ms,
        threads=limits.threads,
        achieved_gops=work.flops / seconds / 1e9 if seconds else None,
        achieved_gbs=work.bytes_moved / seconds / 1e9 if seconds else None,
        peaks_gops=peaks,
        bandwidth_gbs=round(limits.bandwidth_gbs, 2),
        compute_ms=compute_s * 1e3,
        memory_ms=memory_s * 1e3,
        compute_pct=100 * compute_s / seconds if seconds else None,
        bandwidth_pct=100 * memory_s / seconds if seconds else None,
        bound=bound,
        limit_pct=100 * max(compute_s, memory_s) / seconds if seconds else None,
    )
