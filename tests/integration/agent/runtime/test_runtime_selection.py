"""Provider selection with real runtimes: measured choice, decision cache, hangs, crashes, failures, policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edgefleet.agent.runtime.backends import registered
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.runtime.selection.selector import CACHE_FILE, NoProviderError, Policy
from edgefleet.core.bundle.manifest import Manifest

from support.paths import REPO
from support.runtime import FaultBackend, unpack, with_providers

CPU, OV = "CPUExecutionProvider", "openvino:CPU"
# Backends registered in this process (the fault injectors below) exist only here: measure in this process.
HERE = Policy(measure_in_worker=False)
HUNG_HERE = Policy(load_timeout_s=0.5, measure_in_worker=False)


@pytest.fixture(scope="module")
def digits(
    demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Manifest]:
    return unpack(demo_bundles["intel-x86-vnni"], keys[1], tmp_path_factory.mktemp("sel") / "bundle")


MEASURED_IN_A_WORKER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from edgefleet.agent.runtime import LoadedModel, Policy
from edgefleet.core.bundle.archive import parse_manifest
from support.runtime import with_providers
manifest = with_providers(parse_manifest(Path({manifest!r}).read_text()), *{providers!r})
model = LoadedModel(Path({bundle!r}), manifest, 1, cache_dir=Path({cache!r}),
                    policy=Policy.model_validate_json({policy!r}))
print(json.dumps({{"provider": model.provider, "medians": model.choice.medians_ms, "reasons": model.choice.reasons,
                  "openvino_loaded": any(m == "openvino" or m.startswith("openvino.") for m in sys.modules),
                  "golden": model.check_golden().passed}}))
"""


def _select_in_a_fresh_agent(
    bundle_dir: Path, cache: Path, providers: tuple[str, ...], policy: Policy | None = None, **env: str
) -> dict[str, object]:
    script = MEASURED_IN_A_WORKER.format(
        tests=str(REPO / "tests"), manifest=str(bundle_dir / "manifest.json"), bundle=str(bundle_dir),
        cache=str(cache), providers=providers, policy=(policy or Policy()).model_dump_json(),
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_candidates_are_measured_in_a_worker_and_leave_no_runtime_behind(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, _ = digits
    chosen = _select_in_a_fresh_agent(bundle_dir, tmp_path, (CPU, OV))
    assert set(chosen["medians"]) == {CPU, OV}, "both real runtimes are timed, side by side, in the worker"  # type: ignore[arg-type]
    assert chosen["golden"]
    if chosen["provider"] == CPU:
        assert not chosen["openvino_loaded"], "OpenVINO was measured in the worker, never loaded by the agent"


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("hang", "hung: loading and the golden run took over 2 s"), ("crash", "crashed the measuring worker")],
)
def test_a_candidate_that_hangs_or_crashes_its_worker_is_killed_and_skipped(
    fault: str, reason: str, digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, _ = digits
    plugin = str(REPO / "tests" / "support" / "fault_backend_plugin.py")
    chosen = _select_in_a_fresh_agent(
        bundle_dir, tmp_path, ("plugin-fault:A", CPU), Policy(load_timeout_s=2), EDGEFLEET_BACKENDS=plugin,
        EDGEFLEET_FAULT=fault,
    )  # fmt: skip
    assert chosen["provider"] == CPU
    assert str(chosen["reasons"]["plugin-fault:A"]).startswith(reason)  # type: ignore[index]
    stored = json.loads((tmp_path / CACHE_FILE).read_text())["decisions"]
    assert any("plugin-fault:A" in entry.get("poisoned", {}) for entry in stored.values()), stored


def test_real_candidates_are_measured_and_the_decision_is_cached(digits: tuple[Path, Manifest], tmp_path: Path) -> None:
    bundle_dir, manifest = digits
    manifest = with_providers(manifest, CPU, OV, "OpenVINOExecutionProvider", "CUDAExecutionProvider")
    first = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path)
    assert first.provider in (CPU, OV) and not first.choice.cached
    assert set(first.choice.medians_ms) == {CPU, OV}, "both real runtimes are timed"
    other = OV if first.provider == CPU else CPU
    assert first.choice.reasons[other].startswith(("slower", "as fast"))
    assert first.choice.reasons["CUDAExecutionProvider"].startswith("not available: ")
    assert first.choice.reasons["OpenVINOExecutionProvider"].startswith("not available: ")
    stored = json.loads((tmp_path / CACHE_FILE).read_text())["decisions"]
    assert [entry["provider"] for entry in stored.values()] == [first.provider]
    second = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path)
    assert second.choice.cached and second.provider == first.provider
    assert second.choice.reasons == first.choice.reasons
    assert second.check_golden().passed


def test_a_cached_decision_loads_only_the_winner_until_a_runtime_version_changes(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    slow = FaultBackend(run_delay_s=0.0005)  # a real session, 0.5 ms slower per call
    with registered(slow):
        manifest = with_providers(manifest, "fault:A", CPU)
        first = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path, policy=HERE)
        assert first.provider == CPU and first.choice.reasons["fault:A"].startswith("slower")
        assert slow.loads == 1
        LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path, policy=HERE)
        assert slow.loads == 1, "the cached decision must not load the losers again"
        slow.runtime_version = "2.0"  # e.g. an OpenVINO upgrade
        again = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path, policy=HERE)
        assert slow.loads == 2 and not again.choice.cached


def test_a_hanging_load_is_time_bounded_cancelled_skipped_and_not_retried(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    hanging = FaultBackend(hang_s=30)
    with registered(hanging):
        manifest = with_providers(manifest, "fault:A", CPU)
        start = time.monotonic()
        model = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path, policy=HUNG_HERE)
        assert time.monotonic() - start < 5
        assert model.provider == CPU and model.choice.reasons["fault:A"].startswith("hung: ")
        assert hanging.cancelled.is_set(), "the backend is asked to cancel its load"
        again = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path, policy=HUNG_HERE)
        assert again.provider == CPU and hanging.loads == 1, "a provider that hung is not tried again"


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (FaultBackend(fail="NPU driver missing"), "failed: NPU driver missing"),
        (FaultBackend(drift=1.0), "outputs leave the golden tolerance: max |error|"),
        (FaultBackend(available=False), "not available: switched off by the test"),
    ],
    ids=["load-fails", "outputs-drift", "unavailable"],
)
def test_a_faulty_candidate_is_skipped_with_its_reason(
    fault: FaultBackend, reason: str, digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    with registered(fault):
        model = LoadedModel(bundle_dir, with_providers(manifest, "fault:A", CPU), 1, cache_dir=tmp_path, policy=HERE)
    assert model.provider == CPU and model.choice.reasons["fault:A"].startswith(reason)


def test_the_policy_can_prefer_a_slower_provider_that_passes(digits: tuple[Path, Manifest], tmp_path: Path) -> None:
    bundle_dir, manifest = digits
    with registered(FaultBackend(run_delay_s=0.0005)):
        model = LoadedModel(
            bundle_dir, with_providers(manifest, CPU, "fault:A"), 1, cache_dir=tmp_path,
            policy=Policy(prefer=["fault:A"], measure_in_worker=False),
        )  # fmt: skip
    assert model.provider == "fault:A" and "policy prefers fault:A" in model.choice.reasons[CPU]
    assert model.choice.summary.startswith("preferred by the agent's policy")


def test_a_provider_that_crashed_the_agent_while_loading_is_skipped_after_restart(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """A real process dies (os._exit, as a segfault would) in the middle of a load; the next start skips it."""
    bundle_dir, manifest = digits
    script = textwrap.dedent(
        f"""
        import os, sys, threading
        sys.path.insert(0, {str(REPO / "tests")!r})
        from pathlib import Path
        from edgefleet.agent.runtime.backends import registered
        from edgefleet.agent.runtime import LoadedModel, Policy
        from edgefleet.core.bundle.archive import parse_manifest
        from support.runtime import FaultBackend, with_providers
        manifest = with_providers(parse_manifest(Path({str(bundle_dir / "manifest.json")!r}).read_text()),
                                  "fault:A", "CPUExecutionProvider")
        threading.Timer(1.0, os._exit, args=(3,)).start()
        with registered(FaultBackend(hang_s=30)):
            LoadedModel(Path({str(bundle_dir)!r}), manifest, 1, cache_dir=Path({str(tmp_path)!r}),
                        policy=Policy(measure_in_worker=False))
        """
    )
    crashed = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60, check=False)
    assert crashed.returncode == 3
    assert list(tmp_path.glob("selection-inflight-*.json")), "the journal of the interrupted load is left behind"
    fault = FaultBackend()
    with registered(fault):
        model = LoadedModel(bundle_dir, with_providers(manifest, "fault:A", CPU), 1, cache_dir=tmp_path, policy=HERE)
    assert model.provider == CPU and fault.loads == 0
    assert "crashed or hung the agent while loading" in model.choice.reasons["fault:A"]
    assert not list(tmp_path.glob("selection-inflight-*.json"))


def test_no_usable_provider_refuses_the_bundle_with_each_reason(digits: tuple[Path, Manifest]) -> None:
    bundle_dir, manifest = digits
    with pytest.raises(NoProviderError, match=r"CUDAExecutionProvider: not available: .*onnxruntime-gpu"):
        LoadedModel(bundle_dir, with_providers(manifest, "CUDAExecutionProvider"), 1)
