"""A swap closes the replaced model only once no golden-set probe runs on it (agent/quality/probe.py `wait_idle`,
agent/daemon/supervisor.py `_retire`): closed under a probe in flight, onnxruntime aborted the agent's process
("terminate called without an active exception"), seen when a rollout of u2netp (a 1.5 s probe on a loaded 2-core
machine) was rolled back (tests/e2e/test_rollout_corpus_agents.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np

from edgefleet.agent.quality.probe import ProbeConfig, Prober
from edgefleet.core.tensors import Dataset


class _Quiet:
    """A device with no live traffic."""

    def __init__(self) -> None:
        self.probes: list[float] = []

    def live_within(self, seconds: float) -> int:
        return 0

    def record_probe(self, latency_ms: float) -> None:
        self.probes.append(latency_ms)

    def record_failure(self) -> None:
        raise AssertionError("the probe failed")


class _SlowModel:
    """A served model whose run takes until the test lets it finish."""

    def __init__(self) -> None:
        self.golden = SimpleNamespace(inputs=Dataset({"x": np.zeros((2, 1), np.float32)}, None))
        self.running, self.finish = threading.Event(), threading.Event()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.running.set()
        assert self.finish.wait(10)
        return {"y": feeds["x"]}


def test_a_replaced_model_waits_for_the_probe_running_on_it_and_no_other() -> None:
    old, new = _SlowModel(), _SlowModel()
    served = [old]
    stats = _Quiet()
    prober = Prober(lambda: served[0], stats, ProbeConfig(rate=0))
    probe = threading.Thread(target=prober.probe_once)
    probe.start()
    assert old.running.wait(10)
    served[0] = new  # the swap: the slot serves the new model, the old one is retired
    assert not prober.wait_idle(old, 0.05), "the old model is still being probed: it must not be closed yet"
    assert prober.wait_idle(new, 0.05), "nothing runs on the new model"
    old.finish.set()
    assert prober.wait_idle(old, 10)
    probe.join(10)
    assert len(stats.probes) == 1
