"""The control plane's judge of an agent-release wave (rollout/judge/agent_release.py), from what a real store holds:
the devices' statuses, their agent-committed / agent-rolled-back events and their telemetry on the bundle they serve
before and after the new agent. A commit with healthy models passes; the device's own rollback stops the wave with
its reason; a new agent that makes the models slower or fail fails the wave with the guardrail's figure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.rollout.judge.agent_release import (
    AgentInstall,
    AgentVerdict,
    agent_install,
    judge_agent_device,
    judge_agent_wave,
)
from edgefleet.control.rollout.judge.evidence import Thresholds
from edgefleet.control.rollout.judge.wave import summarize
from edgefleet.control.store import DeviceRecord, Store, open_store
from edgefleet.core.messages import DeviceStatus, Event, LatencySummary, SlotStatus, Telemetry

RELEASE, VERSION, BUNDLE = "edgefleet-agent-0.2.0-abc123", "0.2.0", "digits-b1"
DEPLOYED = 10_000.0  # when the wave named the release in the device's desired state


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(str(tmp_path / "control.sqlite"))
    yield opened
    opened.close()


def report_status(store: Store, device: str, agent: str, ts: float) -> None:
    slot = SlotStatus(slot="default", state="serving", active_bundle=BUNDLE, active_model="digits@1", verified=True)
    status = DeviceStatus(device_id=device, online=True, state="serving", ts=ts, agent_version=agent, slots=[slot])
    store.upsert_statuses([status], ts)


def report_telemetry(store: Store, device: str, first_seq: int, start: float, count: int, *, p95_ms: float,
                     errors: int = 0) -> None:  # fmt: skip
    """`count` reports, 10 s apart from `start`, each a window of 10 s with 200 requests."""
    reports = [
        Telemetry(
            device_id=device,
            seq=first_seq + i,
            ts=start + 10.0 * (i + 1),
            bundle_id=BUNDLE,
            provider="cpu",
            window_s=10.0,
            requests=200,
            errors=errors,
            throughput_rps=20.0,
            latency=LatencySummary(count=200, p50_ms=p95_ms * 0.8, p95_ms=p95_ms, p99_ms=p95_ms * 1.1),
            golden_agreement=1.0,
            golden_max_abs_error=0.0,
            cpu_percent=5.0,
            rss_mb=50.0,
        )
        for i in range(count)
    ]
    store.add_telemetry(reports, start + 10.0 * count)


def report_event(store: Store, device: str, seq: int, ts: float, kind: str, detail: str) -> None:
    store.add_events([Event(device_id=device, seq=seq, ts=ts, kind=kind, detail=detail)], ts)


def record(store: Store, device: str) -> DeviceRecord:
    return next(d for d in store.devices() if d.device_id == device)


def judge(store: Store, device: str, now: float) -> tuple[AgentInstall, AgentVerdict]:
    """The engine's reading of one canary at `now`: its install from the store's events and status, its baseline
    (60 s before the release was named) and its reports since the commit."""
    rec = record(store, device)
    install = agent_install(
        RELEASE, VERSION, rec, store.events(device_id=device, since=DEPLOYED - 1),
        deployed_at=DEPLOYED, now=now, timeout_s=300.0,
    )  # fmt: skip
    before = store.telemetry(device, DEPLOYED - 61, DEPLOYED, bundle_id=BUNDLE)
    baseline = summarize(before, bundle_id=BUNDLE, since=DEPLOYED - 60)
    observed = None
    if install.committed_at is not None:
        after = store.telemetry(device, install.committed_at - 1, bundle_id=BUNDLE)
        observed = summarize(after, bundle_id=BUNDLE, since=install.committed_at, fresh_since=None)
    elapsed = now - install.committed_at if install.committed_at is not None else 0.0
    verdict = judge_agent_device(
        device,
        VERSION,
        install,
        rec,
        baseline,
        observed,
        Thresholds(),
        elapsed_s=elapsed,
        observe_s=60.0,
        report_timeout_s=60.0,
        min_reports=2,
    )
    return install, verdict


def canary_before_update(store: Store, device: str, p95_ms: float = 2.0) -> None:
    report_status(store, device, "0.1.0", DEPLOYED - 60)
    report_telemetry(store, device, 1, DEPLOYED - 60, 6, p95_ms=p95_ms)


def test_a_canary_that_commits_the_release_and_keeps_its_models_healthy_passes_the_wave(store: Store) -> None:
    canary_before_update(store, "dc-1")
    install, verdict = judge(store, "dc-1", DEPLOYED + 20)
    assert (install.state, verdict.state) == ("waiting", "deploying")
    # the launcher committed 0.2.0: the event, then the new agent's own status
    report_event(store, "dc-1", 7, DEPLOYED + 40, "agent-committed", f"{RELEASE} (agent {VERSION}) committed: ok")
    install, verdict = judge(store, "dc-1", DEPLOYED + 41)
    assert install.state == "waiting", "the event alone is not the running agent's word"
    report_status(store, "dc-1", VERSION, DEPLOYED + 45)
    install, verdict = judge(store, "dc-1", DEPLOYED + 50)
    assert (install.state, install.committed_at, verdict.state) == ("committed", DEPLOYED + 40, "observing")
    report_telemetry(store, "dc-1", 8, DEPLOYED + 40, 8, p95_ms=2.1)
    _, verdict = judge(store, "dc-1", DEPLOYED + 125)
    assert verdict.state == "passed", verdict.reason
    assert {f.criterion for f in verdict.findings} >= {"latency", "errors", "golden"}
    assert judge_agent_wave([verdict]) == ("passed", "passed (1/1 devices)")


def test_a_canary_whose_launcher_rolled_the_release_back_stops_the_wave_with_the_devices_reason(
    store: Store,
) -> None:
    canary_before_update(store, "dc-1")
    why = "the new agent exited with code 1 before passing its health gate: ImportError"
    report_event(
        store, "dc-1", 7, DEPLOYED + 30, "agent-rolled-back", f"{RELEASE} (agent {VERSION}) rolled back: {why}"
    )
    report_event(store, "dc-1", 8, DEPLOYED + 31, "agent-rolled-back", "another-release (agent 0.9) rolled back: x")
    install, verdict = judge(store, "dc-1", DEPLOYED + 35)
    assert install.state == verdict.state == "failed"
    state, reason = judge_agent_wave([verdict, AgentVerdict("dc-2", "deploying", "")])
    assert state == "failed"
    assert reason.startswith("dc-1 failed: agent-rolled-back: " + RELEASE) and why in reason


def test_a_canary_whose_models_got_slower_under_the_new_agent_fails_with_the_latency_figure(store: Store) -> None:
    canary_before_update(store, "dc-1", p95_ms=2.0)
    report_event(store, "dc-1", 7, DEPLOYED + 40, "agent-committed", f"{RELEASE} (agent {VERSION}) committed: ok")
    report_status(store, "dc-1", VERSION, DEPLOYED + 45)
    report_telemetry(store, "dc-1", 8, DEPLOYED + 40, 8, p95_ms=9.0)  # 4.5x its own baseline p95
    _, verdict = judge(store, "dc-1", DEPLOYED + 125)
    assert verdict.state == "failed"
    assert "latency" in [f.criterion for f in verdict.findings if f.ok is False]
    assert verdict.reason.startswith(f"after agent {VERSION} committed: ")
    assert judge_agent_wave([verdict])[0] == "failed"


def test_a_canary_whose_models_answer_with_errors_under_the_new_agent_fails(store: Store) -> None:
    canary_before_update(store, "dc-1")
    report_event(store, "dc-1", 7, DEPLOYED + 40, "agent-committed", f"{RELEASE} (agent {VERSION}) committed: ok")
    report_status(store, "dc-1", VERSION, DEPLOYED + 45)
    report_telemetry(store, "dc-1", 8, DEPLOYED + 40, 8, p95_ms=2.0, errors=100)
    _, verdict = judge(store, "dc-1", DEPLOYED + 125)
    assert verdict.state == "failed" and "error rate" in verdict.reason


def test_a_canary_that_never_commits_times_out_and_one_that_left_the_version_fails(store: Store) -> None:
    canary_before_update(store, "dc-1")
    _, verdict = judge(store, "dc-1", DEPLOYED + 301)
    assert verdict.state == "timed-out"
    assert "did not commit agent 0.2.0 within 300 s (online, agent 0.1.0)" in verdict.reason
    canary_before_update(store, "dc-2")
    report_event(store, "dc-2", 7, DEPLOYED + 40, "agent-committed", f"{RELEASE} (agent {VERSION}) committed: ok")
    report_status(store, "dc-2", VERSION, DEPLOYED + 45)
    committed, _ = judge(store, "dc-2", DEPLOYED + 50)
    report_status(store, "dc-2", "0.1.0", DEPLOYED + 60)
    rec = record(store, "dc-2")
    verdict = judge_agent_device(
        "dc-2", VERSION, committed, rec, None, summarize([], bundle_id=BUNDLE, since=0.0), Thresholds(),
        elapsed_s=20.0, observe_s=60.0, report_timeout_s=60.0, min_reports=2,
    )  # fmt: skip
    assert (verdict.state, verdict.reason) == ("failed", "left agent 0.2.0: now runs 0.1.0")


def test_a_canary_that_refuses_the_release_fails_with_the_agents_reason(store: Store) -> None:
    canary_before_update(store, "dc-1")
    report_event(store, "dc-1", 7, DEPLOYED + 5, "refused", "agent release other-release: not this one")
    assert judge(store, "dc-1", DEPLOYED + 6)[0].state == "waiting", "another release's refusal is not this one's"
    why = f"agent release {RELEASE}: version 0.2.0 is at or below this device's agent floor 0.2.0"
    report_event(store, "dc-1", 8, DEPLOYED + 10, "refused", why)
    install, verdict = judge(store, "dc-1", DEPLOYED + 11)
    assert (install.state, verdict.state, verdict.reason) == ("failed", "failed", f"refused: {why}")
