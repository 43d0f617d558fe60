"""Rollouts: the spec an operator gives, the wave plan (a pure function) and the persisted state document.

A rollout takes one bundle per hardware profile to a group in waves: a canary (a count or a percentage
of the group), then growing waves given as cumulative sizes ("25%", "50%", "100%"; a final wave to
100% is added when the last one stops short). Each wave is measured before it is touched (baseline),
deployed, observed and judged (`edgefleet.control.rollout.judge.wave`); the engine (`rollout_engine`) drives it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgefleet.control.fleet.registry import EmptyGroupError
from edgefleet.control.rollout.judge.evidence import JUDGED, Criterion, Finding, Metrics, Thresholds, check_thresholds
from edgefleet.control.store import DeviceRecord, TelemetryPoint
from edgefleet.core.errors import UserInputError
from edgefleet.core.profiles import profile_lineage
from edgefleet.core.topics import DEFAULT_SLOT, check_segment, check_slot

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")

# "failed": a wave failed and no device could be returned (each kept the bundle or refused it); "rolled-back": a
# wave failed and the devices it touched went back to their previous bundles.
RolloutState = Literal["pending", "running", "paused", "rolling-back", "succeeded", "rolled-back", "failed", "aborted"]
ACTIVE_STATES: tuple[RolloutState, ...] = ("pending", "running", "paused", "rolling-back")
WaveState = Literal["pending", "baseline", "deploying", "observing", "passed", "failed", "aborted"]
# What happened to each device: "refused" (it turned the bundle down: nothing installed), "installed" (serving it,
# under observation), "passed", "failed" (it installed and broke a criterion), "timed-out", "rolled-back" (back on
# its previous bundle), "kept" (the rollout failed but there was nothing to return it to: it still runs the bundle).
DeviceState = Literal[
    "waiting", "baseline", "deploying", "installed", "passed", "failed", "refused", "timed-out",
    "rolling-back", "rolled-back", "rollback-timed-out", "kept",
]  # fmt: skip
FAILED_STATES: tuple[DeviceState, ...] = ("failed", "refused", "timed-out")
Command = Literal["pause", "resume", "abort"]


class RolloutSpecError(UserInputError):
    """A rollout that cannot be started as asked."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BundleRef(Frozen):
    bundle_id: str
    model_name: str
    model_version: str
    profile: str
    accuracy_budget: float | None = None


class AgentReleaseRef(Frozen):
    """An agent release (`edgefleet release build`) a rollout names in its devices' desired state instead of a
    bundle: the devices' launchers trial it under a health gate (docs/agent.md, agent updates)."""

    release_id: str
    version: str
    allow_downgrade_to: str | None = None


class Timing(Frozen):
    baseline_s: float = Field(default=30.0, description="window of telemetry before a wave that makes its baseline")
    observe_s: float = Field(default=60.0, description="how long each wave is watched after it installed")
    install_timeout_s: float = Field(default=300.0, description="a device that has not committed by then timed out")
    report_timeout_s: float = Field(default=60.0, description="grace after observe_s for telemetry that is late")
    min_reports: int = Field(default=2, description="telemetry reports needed per device and bundle")


class ShadowPhase(Frozen):
    """Before the first wave, the canary devices run the candidate as a shadow beside what they serve (desired
    state `shadow_bundle_id`): it sees a sampled share of live requests and never answers. The rollout goes on
    to the waves when every canary's shadow agrees and keeps up, and stops otherwise (nothing was served)."""

    observe_s: float = Field(default=60.0, description="how long the shadow runs at least")
    timeout_s: float = Field(default=300.0, description="without enough mirrored requests by then, the phase fails")
    min_requests: int = Field(default=50, description="requests mirrored to the shadow before it is judged")
    min_agreement: float = Field(default=0.99, description="worst per-output agreement with the served bundle")
    max_latency_factor: float | None = Field(default=1.5, description="shadow p95 ≤ factor × the served p95")
    latency_slack_ms: float = Field(default=0.0)

    @model_validator(mode="after")
    def _sense(self) -> ShadowPhase:
        if self.observe_s <= 0 or self.timeout_s < self.observe_s:
            raise ValueError("shadow observe must be > 0 s and its timeout at least that")
        if self.min_requests < 1 or not 0 < self.min_agreement <= 1:
            raise ValueError("shadow min requests must be ≥ 1 and min agreement in (0, 1]")
        if self.max_latency_factor is not None and self.max_latency_factor < 1:
            raise ValueError("shadow max latency factor must be ≥ 1")
        return self


class RolloutSpec(Frozen):
    group: str
    slot: str = Field(
        default=DEFAULT_SLOT,
        description="the one slot (model) of the group's devices the rollout replaces; their other slots are left "
        "alone. A rollout stored before slots reads as the default slot.",
    )
    bundles: list[BundleRef] = Field(default_factory=list, description="one per profile; none for an agent release")
    agent_release: AgentReleaseRef | None = Field(
        default=None,
        description="an agent-release rollout: each wave's devices are named this release and judged on its commit "
        "and on the models they serve staying healthy (rollout/agent_waves.py); it ships no bundle",
    )
    canary: str = Field(default="1", description="first wave: a device count or a percentage of the group")
    waves: list[str] = Field(default_factory=lambda: ["25%", "50%", "100%"], description="cumulative sizes")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    timing: Timing = Field(default_factory=Timing)
    max_failed_devices: int = Field(default=0, description="devices per wave that may fail before it fails")
    allow_unjudged: list[Criterion] = Field(
        default_factory=list,
        description="criteria the operator allows to pass unjudged when data lacks (otherwise: no data, wave fails)",
    )
    shadow: ShadowPhase | None = Field(default=None, description="a shadow phase on the canary before the waves")

    @field_validator("group")
    @classmethod
    def _group(cls, value: str) -> str:
        return check_segment("group", value)

    @field_validator("slot")
    @classmethod
    def _slot(cls, value: str) -> str:
        return check_slot(value)

    @model_validator(mode="after")
    def _sense(self) -> RolloutSpec:
        problems = check_thresholds(self.thresholds)
        if self.agent_release is None and not self.bundles:
            problems.append("bundles: a rollout ships at least one bundle (or an agent release)")
        if self.agent_release is not None and (self.bundles or self.shadow is not None):
            problems.append("an agent-release rollout ships no bundle and has no shadow phase")
        profiles = [b.profile for b in self.bundles]
        duplicated = sorted({p for p in profiles if profiles.count(p) > 1})
        if duplicated:
            problems.append(f"more than one bundle for profile(s) {', '.join(duplicated)}")
        names = sorted({b.model_name for b in self.bundles})
        if len(names) > 1:
            problems.append(f"the bundles are of different models ({', '.join(names)}); a rollout ships one model")
        t = self.timing
        if t.baseline_s < 0 or t.observe_s <= 0 or t.install_timeout_s <= 0 or t.report_timeout_s < 0:
            problems.append("baseline and report timeout must be ≥ 0 s, observe and install timeout > 0 s")
        if t.min_reports < 1:
            problems.append("min reports must be at least 1")
        if self.max_failed_devices < 0:
            problems.append("max failed devices must be ≥ 0")
        unknown = sorted(set(self.allow_unjudged) - set(JUDGED))
        if unknown:
            problems.append(f"allow unjudged: {', '.join(unknown)} cannot be allowed; choose from {', '.join(JUDGED)}")
        try:
            sizes = [parse_size(s) for s in [self.canary, *self.waves]]
        except RolloutSpecError as err:
            problems.append(str(err))
        else:
            percents = [v for v, pct in sizes if pct]
            if any(v > 100 for v in percents):
                problems.append("a wave cannot be more than 100% of the group")
            if not all(b > a for a, b in itertools.pairwise(sizes[1:]) if a[1] == b[1]):
                problems.append(f"waves must grow: {', '.join(self.waves)}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def bundle_for(self, profile: str | None) -> BundleRef | None:
        """The most specific bundle a device of `profile` runs: its own profile's, else one it refines."""
        if profile is None:
            return None
        for name in profile_lineage(profile):
            found = next((b for b in self.bundles if b.profile == name), None)
            if found is not None:
                return found
        return None


def parse_size(text: str) -> tuple[float, bool]:
    """ "3" → (3, False): a device count; "10%" → (10, True): a share of the group."""
    match = _SIZE.match(text)
    if not match:
        raise RolloutSpecError(f"wave size {text!r} is neither a device count (3) nor a percentage (10%)")
    value, pct = float(match[1]), bool(match[2])
    if value <= 0:
        raise RolloutSpecError(f"wave size {text!r} must be more than zero")
    if not pct and not value.is_integer():
        raise RolloutSpecError(f"wave size {text!r}: a device count is a whole number")
    return value, pct


def _count(size: tuple[float, bool], total: int) -> int:
    value, pct = size
    return max(1, math.ceil(value * total / 100 - 1e-9)) if pct else int(value)


def order_devices(device_ids: Sequence[str], online: Sequence[bool], seed: str) -> list[str]:
    """Online devices first (a canary should answer), then a stable shuffle seeded by the rollout id."""
    keyed = [
        (not up, hashlib.sha256(f"{seed}/{d}".encode()).hexdigest(), d)
        for d, up in zip(device_ids, online, strict=True)
    ]
    return [d for _, _, d in sorted(keyed)]


def plan_waves(devices: Sequence[str], canary: str, waves: Sequence[str]) -> list[list[str]]:
    """Split ordered devices into the canary and cumulative waves; every device lands in exactly one."""
    total = len(devices)
    if total == 0:
        raise EmptyGroupError("a rollout needs at least one device")
    canary_size = parse_size(canary)
    first = _count(canary_size, total)
    if not canary_size[1] and first > total:
        raise RolloutSpecError(f"a canary of {first} devices is more than the group's {total}")
    targets = [first] + [min(total, _count(parse_size(w), total)) for w in waves]
    if targets[-1] < total:
        targets.append(total)
    plan: list[list[str]] = []
    done = 0
    for target in targets:
        target = min(target, total)
        if target > done:
            plan.append(list(devices[done:target]))
            done = target
    return plan


class LogEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ts: float
    message: str


class DeviceProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_id: str
    profile: str | None
    wave: int
    state: DeviceState = "waiting"
    reason: str = ""
    target_bundle: str | None = None
    previous_bundle: str | None = Field(
        default=None, description="the rollback target: a bundle the store published and the device committed"
    )
    previous_model: str | None = Field(default=None, description="name@version of the rollback target (the store's)")
    reported_bundle: str | None = Field(default=None, description="what the device said it ran (its word)")
    already_ran: bool = Field(default=False, description="it ran (and had committed) the bundle before the wave")
    rollback_note: str = Field(default="", description="why there is no rollback target, when there is none")
    warnings: list[str] = Field(default_factory=list, description="where its report disagrees with host records")
    deployed_at: float | None = None
    installed_at: float | None = Field(default=None, description="device clock: when it committed the new bundle")
    baseline: Metrics | None = None
    observed: Metrics | None = None
    findings: list[Finding] = Field(default_factory=list)
    rollback_at: float | None = None
    previous_release: AgentReleaseRef | None = Field(
        default=None, description="an agent-release rollout: the release the store named for the device before it"
    )
    previous_agent: str = Field(default="", description="an agent-release rollout: the agent version it ran before")


class WaveProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    devices: list[str]
    state: WaveState = "pending"
    started_at: float | None = None
    phase_started_at: float | None = None
    paused_s: float = Field(default=0.0, description="time paused during the current phase")
    finished_at: float | None = None
    verdict: str = ""


class ShadowDevice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_id: str
    served_bundle: str | None = None
    state: Literal["waiting", "running", "passed", "failed"] = "waiting"
    requests: int = 0
    agreement: float | None = None
    shadow_p95_ms: float | None = None
    served_p95_ms: float | None = None
    findings: list[Finding] = Field(default_factory=list)
    reason: str = ""


class ShadowProgress(BaseModel):
    """The shadow phase as it stands: per canary device, the candidate's figures beside the served bundle."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["pending", "running", "passed", "failed"] = "pending"
    started_at: float | None = None
    finished_at: float | None = None
    paused_s: float = 0.0
    devices: dict[str, ShadowDevice] = Field(default_factory=dict)
    verdict: str = ""


class RolloutDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    spec: RolloutSpec
    state: RolloutState = "pending"
    created_at: float
    updated_at: float
    current_wave: int = 0
    waves: list[WaveProgress]
    devices: dict[str, DeviceProgress]
    paused_at: float | None = None
    outcome: str = Field(default="", description="why it ended: passed, the breach, or the abort")
    ends_as: RolloutState | None = Field(default=None, description="the final state once a rollback completes")
    finished_at: float | None = None
    log: list[LogEntry] = Field(default_factory=list)
    shadow: ShadowProgress | None = Field(default=None, description="the shadow phase, when the spec asks for one")
    step_error: str = Field(default="", description="why the engine's last step of it failed (empty: it did not)")
    step_failures: int = Field(default=0, description="ticks in a row its step failed")
    left_out: dict[str, str] = Field(
        default_factory=dict, description="devices that claim the group but host records leave out, and why"
    )

    def note(self, now: float, message: str) -> None:
        self.log.append(LogEntry(ts=now, message=message))
        del self.log[:-200]

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def counts(self) -> dict[str, int]:
        result: dict[str, int] = {}
        for device in self.devices.values():
            result[device.state] = result.get(device.state, 0) + 1
        return result


@dataclass
class Tick:
    """What one engine tick reads once and shares between the rollouts it steps."""

    now: float
    devices: dict[str, DeviceRecord]
    latest: dict[tuple[str, str], TelemetryPoint]  # (device, slot) -> its latest report
    desired_changed: bool = False


__all__ = [
    "ACTIVE_STATES",
    "FAILED_STATES",
    "AgentReleaseRef",
    "BundleRef",
    "DeviceProgress",
    "RolloutDoc",
    "RolloutSpec",
    "RolloutSpecError",
    "ShadowPhase",
    "ShadowProgress",
    "Thresholds",
    "Tick",
    "Timing",
    "WaveProgress",
    "order_devices",
    "parse_size",
    "plan_waves",
]
