"""Provider selection with real runtimes: measured choice, decision cache, hangs, crashes, failures, policy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edgefleet.agent.backends import registered
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.selection import CACHE_FILE, NoProviderError, Policy
from edgefleet.core.manifest import Manifest

from test_runtime_support import FaultBackend, unpack, with_providers

CPU, OV = "CPUExecutionProvider", "openvino:CPU"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def digits(
    demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Manifest]:
    return unpack(demo_bundles["intel-x86-vnni"], keys[1], tmp_path_factory.mktemp("sel") / "bundle")


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
        first = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path)
        assert first.provider == CPU and first.choice.reasons["fault:A"].startswith("slower")
        assert slow.loads == 1
        LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path)
        assert slow.loads == 1, "the cached decision must not load the losers again"
        slow.runtime_version = "2.0"  # e.g. an OpenVINO upgrade
        again = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path)
        assert slow.loads == 2 and not again.choice.cached


def test_a_hanging_load_is_time_bounded_cancelled_skipped_and_not_retried(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    hanging = FaultBackend(hang_s=30)
    with registered(hanging):
        manifest = with_providers(manifest, "fault:A", CPU)
        start = time.monotonic()
        model = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path, policy=Policy(load_timeout_s=0.5))
        assert time.monotonic() - start < 5
        assert model.provider == CPU and model.choice.reasons["fault:A"].startswith("hung: ")
        assert hanging.cancelled.is_set(), "the backend is asked to cancel its load"
        again = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path, policy=Policy(load_timeout_s=0.5))
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
        model = LoadedModel(bundle_dir, with_providers(manifest, "fault:A", CPU), 1, cache_dir=tmp_path)
    assert model.provider == CPU and model.choice.reasons["fault:A"].startswith(reason)


def test_the_policy_can_prefer_a_slower_provider_that_passes(digits: tuple[Path, Manifest], tmp_path: Path) -> None:
    bundle_dir, manifest = digits
    with registered(FaultBackend(run_delay_s=0.0005)):
        model = LoadedModel(
            bundle_dir, with_providers(manifest, CPU, "fault:A"), 1, cache_dir=tmp_path,
            policy=Policy(prefer=["fault:A"]),
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
        from edgefleet.agent.backends import registered
        from edgefleet.agent.runtime import LoadedModel
        from edgefleet.core.bundle import parse_manifest
        from test_runtime_support import FaultBackend, with_providers
        manifest = with_providers(parse_manifest(Path({str(bundle_dir / "manifest.json")!r}).read_text()),
                                  "fault:A", "CPUExecutionProvider")
        threading.Timer(1.0, os._exit, args=(3,)).start()
        with registered(FaultBackend(hang_s=30)):
            LoadedModel(Path({str(bundle_dir)!r}), manifest, 1, cache_dir=Path({str(tmp_path)!r}))
        """
    )
    crashed = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60, check=False)
    assert crashed.returncode == 3
    assert list(tmp_path.glob("selection-inflight-*.json")), "the journal of the interrupted load is left behind"
    fault = FaultBackend()
    with registered(fault):
        model = LoadedModel(bundle_dir, with_providers(manifest, "fault:A", CPU), 1, cache_dir=tmp_path)
    assert model.provider == CPU and fault.loads == 0
    assert "crashed or hung the agent while loading" in model.choice.reasons["fault:A"]
    assert not list(tmp_path.glob("selection-inflight-*.json"))


def test_no_usable_provider_refuses_the_bundle_with_each_reason(digits: tuple[Path, Manifest]) -> None:
    bundle_dir, manifest = digits
    with pytest.raises(NoProviderError, match=r"CUDAExecutionProvider: not available: .*onnxruntime-gpu"):
        LoadedModel(bundle_dir, with_providers(manifest, "CUDAExecutionProvider"), 1)
