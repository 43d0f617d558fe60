"""The health gate of an agent on trial: the launcher commits a new release only once this reports.

Passed when, all at once: the agent is connected to the broker; every slot that had a committed bundle when the
agent started serves exactly that bundle (not a start-up fallback), loaded by this agent and through its golden
set; and the device's status, published now, was acknowledged by the broker. Then the report goes to
`launcher/health/TOKEN.json` (written whole). Nothing is reported otherwise: the launcher's deadline, or the agent's
exit, rolls the release back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from edgefleet import __version__
from edgefleet.agent.install import DeviceServing
from edgefleet.core.errors import BrokerError
from edgefleet.core.launcher_files import write_health

log = logging.getLogger(__name__)


class HealthGate:
    def __init__(
        self,
        launcher: Path,
        token: str,
        committed: dict[str, str],
        serving: DeviceServing,
        connected: Callable[[], bool],
        *,
        poll_s: float = 0.5,
        ack_timeout_s: float = 10.0,
    ) -> None:
        self.launcher, self.token, self.committed = launcher, token, dict(committed)
        self.serving, self.connected = serving, connected
        self.poll_s, self.ack_timeout_s = poll_s, ack_timeout_s
        self.passed = False
        self.last_problem = "not checked yet"

    def problems(self) -> list[str]:
        """What still keeps the gate shut (empty: open, once the status is acknowledged)."""
        found = [] if self.connected() else ["not connected to the broker"]
        slots = self.serving.slots()
        for name, bundle_id in sorted(self.committed.items()):
            slot = slots.get(name)
            model = slot.model if slot is not None else None
            if model is None or model.bundle_id != bundle_id:
                found.append(f"slot {name} does not serve its committed bundle {bundle_id}")
            elif model.last_golden is None or not model.last_golden.passed:
                found.append(f"slot {name}: {bundle_id} has not passed its golden set")
        return found

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_s):
            problems = self.problems()
            if problems:
                if problems[0] != self.last_problem:
                    log.info("health gate: %s", "; ".join(problems))
                self.last_problem = problems[0]
                continue
            try:
                self.serving.publish_status(wait=self.ack_timeout_s)
            except BrokerError as err:
                self.last_problem = f"status not acknowledged: {err}"
                continue
            write_health(self.launcher, self.token, {"version": __version__, "slots": self.committed})
            self.passed = True
            log.info("health gate passed: %d slots serve their committed bundles; reported to the launcher",
                     len(self.committed))  # fmt: skip
            return


__all__ = ["HealthGate"]
