"""A cold provider selection does no more than its decision needs: runtimes that cannot load the bundle's format are
ruled out in the agent (no worker), the timing ends once one provider is clearly the fastest, the CPU EP winner is
loaded in the agent while the worker measures the rest, and the worker can be started while the bundle downloads.
Real runtimes, a real worker process, the real demo bundle."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from edgefleet.agent.runtime.backends import Session, registered
from edgefleet.agent.runtime.model import LoadedModel, RuntimeOptions
from edgefleet.agent.runtime.selection import process as selection_process
from edgefleet.agent.runtime.selection import selector as selection
from edgefleet.agent.runtime.selection.concurrent_load import EarlyLoads
from edgefleet.agent.runtime.selection.selector import Policy
from edgefleet.agent.runtime.selection.trial import CLEAR_AFTER_ROUNDS, Trial, clear_leader, time_interleaved, try_load
from edgefleet.agent.runtime.selection.warm_start import worker_candidates
from edgefleet.core.bundle.manifest import Manifest

from support.runtime import FaultBackend, golden, unpack, with_providers

CPU, OV, COREML = "CPUExecutionProvider", "openvino:CPU", "coreml:ALL"


@pytest.fixture(scope="module")
def digits(
    demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Manifest]:
    return unpack(demo_bundles["intel-x86-vnni"], keys[1], tmp_path_factory.mktemp("cold") / "bundle")


@pytest.fixture(autouse=True)
def no_prestarted_worker_left() -> object:
    yield None
    selection_process.discard()


def test_a_clear_leader_is_one_whose_every_round_beat_every_round_of_the_others_by_the_margin() -> None:
    assert clear_leader({"a": [1.0, 1.1, 1.0], "b": [2.0, 2.2, 1.9]}, 0.05) == "a"
    assert clear_leader({"a": [1.0, 1.9, 1.0], "b": [2.0, 2.2, 1.9]}, 0.05) is None, "one round of a was as slow"
    assert clear_leader({"a": [1.0, 1.0, 1.0], "b": [1.04, 1.04, 1.04]}, 0.05) is None, "inside the tie margin"
    assert clear_leader({"a": [1.0], "b": [3.0], "c": [1.2]}, 0.05) == "a"
    assert clear_leader({"a": [1.0], "b": [3.0], "c": [1.02]}, 0.05) is None, "c is as fast as a"
    assert clear_leader({"a": [1.0]}, 0.05) is None, "nothing to compare"


class _Busy(Session):
    """A session that computes for a fixed time per call (a model of that latency) and counts its calls."""

    def __init__(self, seconds: float) -> None:
        self.provider, self.output_names, self.seconds, self.calls = "busy", [], seconds, 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return {}


def test_timing_ends_early_once_one_provider_is_clearly_the_fastest_and_runs_every_round_otherwise() -> None:
    fast, slow = _Busy(0.0), _Busy(0.02)
    medians = time_interleaved({"fast": fast, "slow": slow}, [{}], {"fast": 1, "slow": 1}, rounds=7, clear_margin=0.05)
    assert medians["fast"] < medians["slow"]
    assert CLEAR_AFTER_ROUNDS <= slow.calls < 7, "a 20 ms gap is clear long before the seventh round"
    fast, slow = _Busy(0.0), _Busy(0.02)
    time_interleaved({"fast": fast, "slow": slow}, [{}], {"fast": 1, "slow": 1}, rounds=7)
    assert fast.calls == slow.calls == 7, "without a margin every round runs"


def test_a_provider_that_cannot_load_the_bundles_format_is_ruled_out_in_the_agent_without_a_worker(
    digits: tuple[Path, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle_dir, manifest = digits
    started: list[object] = []
    real_start = selection_process.start
    monkeypatch.setattr(selection_process, "start", lambda job: started.append(job) or real_start(job))
    model = LoadedModel(bundle_dir, with_providers(manifest, COREML, CPU), 1, cache_dir=tmp_path)
    assert model.provider == CPU and model.check_golden().passed
    assert model.choice.reasons[COREML].startswith("not available: CoreML cannot load onnx bundles")
    assert not started, "one candidate left: it is loaded in the agent, no worker starts"
    assert worker_candidates(with_providers(manifest, COREML, CPU), 1, Policy(), tmp_path / "other") == []


def test_the_cpu_ep_winner_is_loaded_in_the_agent_while_the_worker_measures_the_others(
    digits: tuple[Path, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle_dir, manifest = digits
    loads: list[tuple[str, str]] = []
    real_load = selection._load

    def spy(provider: str, *args: object) -> Trial:
        loads.append((provider, threading.current_thread().name))
        return real_load(provider, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(selection, "_load", spy)
    model = LoadedModel(bundle_dir, with_providers(manifest, CPU, OV), 1, cache_dir=tmp_path)
    assert set(model.choice.medians_ms) == {CPU, OV}, "both are still timed side by side in the worker"
    assert model.check_golden().passed
    cpu_loads = [thread for provider, thread in loads if provider == CPU]
    assert cpu_loads and cpu_loads[0].startswith("early load"), loads
    if model.provider == CPU:
        assert len(cpu_loads) == 1, "the session loaded early is the one served"
    else:
        assert (OV, threading.current_thread().name) in loads, "OpenVINO won: the agent loads it after the worker"


def test_an_early_load_that_fails_the_golden_set_in_the_agent_is_closed_and_not_kept(
    digits: tuple[Path, Manifest],
) -> None:
    bundle_dir, manifest = digits
    drifting = FaultBackend(drift=1.0)
    reference = golden(bundle_dir, manifest)
    options = selection.load_options(manifest, 1, None, bundle_dir, ())
    with registered(drifting):
        early = EarlyLoads(lambda p: try_load("fault:A", bundle_dir / manifest.model_path, options, reference,
                                              manifest, 30, None, ""))  # fmt: skip
        early.passed_in_worker(OV)  # not a provider loaded early
        early.passed_in_worker(CPU)
        early.passed_in_worker(CPU)  # reported again by a second worker: loaded once
        assert early.finish() == {}
    assert drifting.loads == 1


def test_the_worker_is_prestarted_only_when_a_cold_selection_will_need_one(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    both = with_providers(manifest, CPU, OV)
    assert worker_candidates(both, 1, Policy(), tmp_path) == [CPU, OV]
    assert worker_candidates(both, 1, Policy(measure_in_worker=False), tmp_path) == []
    assert worker_candidates(both, 1, Policy(exclude=[OV]), tmp_path) == []
    assert worker_candidates(with_providers(manifest, CPU), 1, Policy(), tmp_path) == []
    LoadedModel(bundle_dir, both, 1, cache_dir=tmp_path)  # decides and caches
    assert worker_candidates(both, 1, Policy(), tmp_path) == [], "a cached decision loads the winner alone"
    assert not RuntimeOptions(1, tmp_path).prestart(both)
    assert selection_process.take() is None


def test_a_worker_prestarted_at_the_offer_measures_the_bundle_and_ends_with_the_selection(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    both = with_providers(manifest, CPU, OV)
    runtime = RuntimeOptions(1, tmp_path)
    assert runtime.prestart(both)
    worker = selection_process._SLOT[0]
    assert worker.ready.wait(120), "the prestarted worker imports its runtimes and waits for its job"
    model = runtime.load(bundle_dir, both)
    assert set(model.choice.medians_ms) == {CPU, OV} and model.check_golden().passed
    assert worker.proc.wait(30) == 0, "the prestarted worker did the measuring and exited"
    assert selection_process.take() is None


def test_a_prestarted_worker_no_selection_takes_is_ended(digits: tuple[Path, Manifest], tmp_path: Path) -> None:
    bundle_dir, manifest = digits
    worker = selection_process.prestart([CPU])
    model = LoadedModel(bundle_dir, with_providers(manifest, CPU), 1, cache_dir=tmp_path)  # one candidate: no worker
    assert model.provider == CPU
    assert worker.proc.wait(30) is not None and selection_process.take() is None


def test_a_worker_that_died_before_its_job_is_replaced_by_a_fresh_one(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    dead = selection_process.prestart([])
    dead.proc.kill()
    dead.proc.wait()
    model = LoadedModel(bundle_dir, with_providers(manifest, CPU, OV), 1, cache_dir=tmp_path)
    assert set(model.choice.medians_ms) == {CPU, OV} and model.check_golden().passed
