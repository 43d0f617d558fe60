"""Judging one device of an agent-release wave: did the new agent commit, and do its models stay healthy?

An agent release changes no bundle: the device serves the same bundles before and after, so its own telemetry on
the bundle of the rolled-out slot before the release was named (the baseline, as for a bundle wave) is compared with
its telemetry on that same bundle sent wholly after the new agent committed. The steps, for one device:

- the install (`agent_install`): the device's `agent-rolled-back` event for the release (its launcher ended the new
  agent, the previous one runs again) or its `refused` event naming the release fails it with the device's own
  reason; an `agent-committed` event for the release, and a status that reports the release's version, installs it
  (the event alone is not enough: the status is the running agent's own word); otherwise it is still waiting, and
  it times out past the install timeout;
- the guardrails (`judge_agent_device`): once committed, the existing criteria of `judge.wave.judge_device`
  (latency against the device's own pre-update p95, error rate, golden agreement, field accuracy, drift) over the
  reports sent since the commit. A new agent process starts its latency window empty, so every window it reports is
  its own (no freshness share to apply). A device that runs another agent version after the commit fails.

`judge_agent_wave` folds the devices into the wave's verdict as the engine does for bundle waves (more than
`max_failed_devices` failures fail the wave, with the first failure's reason). Pure functions over the store's
records; tests/integration/control/rollout/test_agent_release_wave.py judges them from a real store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from edgefleet.control.rollout.judge.evidence import Criterion, Finding, Metrics, Thresholds
from edgefleet.control.rollout.judge.wave import breached, judge_device, pending, settle
from edgefleet.control.store import DeviceRecord, EventRecord
from edgefleet.core.untrusted import safe_text

InstallState = Literal["waiting", "committed", "failed", "timed-out"]
AgentState = Literal["deploying", "observing", "passed", "failed", "timed-out"]
WaveVerdict = Literal["pending", "passed", "failed"]


@dataclass(frozen=True)
class AgentInstall:
    state: InstallState
    reason: str = ""
    committed_at: float | None = None  # the device's time of its agent-committed event


@dataclass(frozen=True)
class AgentVerdict:
    device_id: str
    state: AgentState
    reason: str
    findings: tuple[Finding, ...] = ()


def _names(event: EventRecord, release_id: str) -> bool:
    """Whether a device event is about this release: the launcher's outcomes read `RELEASE_ID (agent V) ...`, the
    agent's refusals `agent release RELEASE_ID: why` (agent/release/updater.py)."""
    return event.detail.startswith((f"{release_id} ", f"agent release {release_id}:"))


def agent_install(
    release_id: str, version: str, record: DeviceRecord | None, events: Iterable[EventRecord], *,
    deployed_at: float, now: float, timeout_s: float,
) -> AgentInstall:  # fmt: skip
    """Where the device stands with the release named in its desired state at `deployed_at`: its events since then
    (any order), its latest status."""
    committed: EventRecord | None = None
    for event in sorted(events, key=lambda e: e.ts):
        if event.slot is not None or not _names(event, release_id):
            continue
        if event.kind in ("agent-rolled-back", "refused"):
            return AgentInstall("failed", f"{event.kind}: {safe_text(event.detail, 300)}")
        if event.kind == "agent-committed" and committed is None:
            committed = event
    running = record.agent_version if record is not None else ""
    if committed is not None and record is not None and record.online and running == version:
        return AgentInstall("committed", f"agent {version} committed", committed.ts)
    if now - deployed_at > timeout_s:
        seen = "never seen" if record is None else f"{'online' if record.online else 'offline'}, agent {running or '?'}"
        heard = "; its agent-committed event arrived" if committed is not None else ""
        return AgentInstall("timed-out", f"did not commit agent {version} within {timeout_s:g} s ({seen}{heard})")
    return AgentInstall("waiting")


def judge_agent_device(
    device_id: str, version: str, install: AgentInstall, record: DeviceRecord | None,
    baseline: Metrics | None, observed: Metrics | None, t: Thresholds, *,
    elapsed_s: float, observe_s: float, report_timeout_s: float, min_reports: int,
    allow_unjudged: Sequence[Criterion] = (),
) -> AgentVerdict:  # fmt: skip
    """One device's verdict. `observed`: its reports on the slot's bundle sent wholly after the commit
    (`summarize(..., since=install.committed_at, fresh_since=None)`); `elapsed_s`: since the commit."""
    if install.state in ("failed", "timed-out"):
        return AgentVerdict(device_id, install.state, install.reason)
    if install.state == "waiting" or observed is None:
        return AgentVerdict(device_id, "deploying", "waiting for the new agent to commit")
    if record is not None and record.online and record.agent_version != version:
        return AgentVerdict(
            device_id, "failed", f"left agent {version}: now runs {safe_text(record.agent_version, 64)}"
        )
    final = elapsed_s >= observe_s
    findings = judge_device(baseline, observed, t, None, final)
    deadline = observe_s + report_timeout_s
    if elapsed_s >= deadline:
        findings = settle(findings, allow_unjudged)
    bad = breached(findings)
    enough = observed.reports >= min_reports
    if bad and (enough or elapsed_s < deadline):
        why = "; ".join(f.detail for f in bad)
        return AgentVerdict(device_id, "failed", f"after agent {version} committed: {why}", tuple(findings))
    if final and enough and not pending(findings):
        why = "; ".join(f.detail for f in findings) or "committed"
        return AgentVerdict(device_id, "passed", f"agent {version} committed; {why}", tuple(findings))
    if elapsed_s >= deadline:
        why = f"{observed.reports} telemetry report(s) after agent {version} committed; {min_reports} needed"
        return AgentVerdict(device_id, "timed-out", why, tuple(findings))
    return AgentVerdict(device_id, "observing", "observing the models under the new agent", tuple(findings))


def judge_agent_wave(verdicts: Sequence[AgentVerdict], max_failed_devices: int = 0) -> tuple[WaveVerdict, str]:
    """The wave's verdict from its devices': failed (with the first failure's reason) once more than
    `max_failed_devices` failed, passed when none is still deploying or observing, else pending."""
    failed = [v for v in verdicts if v.state in ("failed", "timed-out")]
    if len(failed) > max_failed_devices:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return "failed", f"{first.device_id} {first.state}: {first.reason}{more}"
    if any(v.state in ("deploying", "observing") for v in verdicts):
        return "pending", ""
    return "passed", f"passed ({len(verdicts) - len(failed)}/{len(verdicts)} devices)"


__all__ = ["AgentInstall", "AgentVerdict", "agent_install", "judge_agent_device", "judge_agent_wave"]
