"""An idle device is idle (issue 33 item 9): a real agent serving the digits CNN with no requests at all, its
golden-set probes running as on any quiet device, uses at most 1 % of a core, and says what it used in telemetry."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.fleet import AgentProcess, FleetWatcher, deploy_to

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@pytest.mark.slow
@pytest.mark.serial  # a CPU share of 1 %: other tests beside it add their cache misses and wake-ups to it
def test_an_agent_serving_a_model_with_no_requests_uses_at_most_one_percent_of_a_core(
    start_agent: Callable[..., AgentProcess], host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path],
) -> None:  # fmt: skip
    # Two inference threads: ONNX Runtime then has a worker pool, whose spinning after each probe was the cost.
    agent = start_agent("idle-1", telemetry_interval=2.0, extra=("--threads", "2", "--no-http"))
    bundle_id = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=("idle-1",))
    watcher.serving("idle-1", bundle_id, timeout=120)
    assert agent.proc is not None
    seen = len(watcher.telemetry)
    watcher.wait_for("probes running", lambda: any(t.probe_requests for t in watcher.telemetry[seen:]), timeout=30)
    before, start = _cpu_s(agent.proc.pid), time.monotonic()
    time.sleep(20)
    used = 100 * (_cpu_s(agent.proc.pid) - before) / (time.monotonic() - start)
    assert used <= 1.0, f"an idle agent used {used:.2f} % of a core"
    idle = [t for t in watcher.telemetry[seen:] if t.device_id == "idle-1" and t.idle_cpu_percent is not None]
    assert idle and all(t.requests == 0 for t in idle)
    # One 2 s window may hold a probe round's or a report's burst (CI saw one over 5 % with the whole 20 s at <= 1 %):
    # the windows' median is what the device says it idles at.
    shares = sorted(t.idle_cpu_percent for t in idle if t.idle_cpu_percent is not None)
    assert shares[len(shares) // 2] <= 5.0, f"idle CPU per telemetry window: {shares}"
