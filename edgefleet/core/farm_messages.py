"""The fleet as the benchmark farm: the messages between a host that wants candidate bundles measured and the devices
of that profile that measure them.

The host publishes each candidate bundle as usual (signed by the bundle key, marked `benchmark_only` in its
manifest, so no device ever serves or commits it), then sends a BenchmarkRequest to each chosen device. The device
fetches and verifies the candidates through its normal transfer path into a scratch folder, measures each one in a
separate, time-bounded worker process with the providers it really has and its own thread settings, under the CPU
share the request allows (so that serving goes on), and answers with a BenchmarkResult.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from edgefleet.core.messages import Message, now


class BenchmarkRequest(Message):
    """On `devices/{id}/benchmark/request`: measure these candidates and answer on benchmark/result/{client_id}."""

    request_id: str = Field(min_length=1, max_length=128)
    client_id: str = Field(description="the answer goes to devices/{id}/benchmark/result/{client_id}")
    bundle_ids: list[str] = Field(min_length=1, max_length=32)
    cpu_share: float = Field(
        default=0.5, gt=0, le=1, description="share of the device's cores the measuring worker may use"
    )
    rounds: int = Field(default=7, ge=1, le=100, description="interleaved timing rounds per candidate's providers")
    calls: int = Field(default=50, ge=5, le=5000, description="individually timed calls for the percentiles")
    timeout_s: float = Field(default=300.0, gt=0, le=3600, description="the device's budget for the whole request")


class CandidateFigures(Message):
    """One candidate as this device ran it."""

    bundle_id: str
    ok: bool
    error: str | None = None
    provider: str | None = Field(default=None, description="the provider this device would serve it with")
    providers_measured: dict[str, float] = Field(default_factory=dict, description="provider -> median ms")
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    load_ms: float | None = None
    peak_rss_mb: float | None = Field(default=None, description="the measuring worker's peak resident memory")
    golden_passed: bool | None = None
    threads: int = Field(default=0, description="the intra-op threads the device uses (0: the runtime decides)")


class BenchmarkResult(Message):
    """On `devices/{id}/benchmark/result/{client_id}`: the figures, or why the request was refused."""

    request_id: str
    device_id: str
    profile: str
    ok: bool = True
    error: str | None = None
    measured_at: float = Field(default_factory=now)
    cpu_share: float = 1.0
    candidates: list[CandidateFigures] = Field(default_factory=list)


@dataclass
class FarmAnswer:
    """What the devices asked for one profile said: an answer per device that answered in time, the devices that
    did not (silent), and notes on the devices left out (offline, of another profile)."""

    results: dict[str, BenchmarkResult] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
