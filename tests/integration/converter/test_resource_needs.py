"""The converter records what each bundle needs of a device (Manifest.resources): the memory the loaded model adds at
its peak on the runtime and provider it was timed on, measured in a fresh process, and the FLOPs of one run; `bundle
show` and the conversion report show them. Real ONNX Runtime, real conversions."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter import deadline
from edgefleet.converter.bundle import PACK_S, _resources
from edgefleet.converter.resources import flops_of, measure_memory
from edgefleet.core.bundle.archive import read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.tensors import Dataset

from support.cli import edgefleet
from support.models.generative import TinylmBundles


def _mlp(path: Path, width: int, layers: int) -> tuple[Path, int]:
    """`layers` distinct [width, width] float32 weights, chained: returns the file and the weights' bytes."""
    rng = np.random.default_rng(width)
    weights = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) / width, f"w{i}")
               for i in range(layers)]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(layers)]
    nodes.append(helper.make_node("Identity", [f"h{layers}"], ["y"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path, width * width * 4 * layers


def test_the_peak_memory_grows_with_the_model_and_stays_within_a_factor_of_its_weights(tmp_path: Path) -> None:
    figures = {}
    for name, width, layers in (("small", 1024, 4), ("large", 2048, 8)):  # 16 MB and 128 MB of weights
        model, weight_bytes = _mlp(tmp_path / f"{name}.onnx", width, layers)
        feeds = {"x": np.ones((1, width), np.float32)}
        figure = measure_memory(model, "onnxruntime", "CPUExecutionProvider", feeds, threads=1, runs=5)
        assert figure.peak_mb is not None, figure.reason
        weights_mb = weight_bytes / 2**20
        assert 0.8 * weights_mb <= figure.peak_mb <= 3 * weights_mb + 64, (name, figure.peak_mb, weights_mb)
        figures[name] = figure.peak_mb
        assert figure.key == "onnxruntime/CPUExecutionProvider"
    assert figures["large"] > 4 * figures["small"] * 0.8, figures  # 8× the weights: well over 3× the memory


def test_a_runtime_this_host_cannot_run_is_not_measured_and_says_why(tmp_path: Path) -> None:
    model, _ = _mlp(tmp_path / "m.onnx", 64, 1)
    feeds = {"x": np.ones((1, 64), np.float32)}
    figure = measure_memory(model, "coreml", "CoreML", feeds)
    assert figure.peak_mb is None and "does not run on this host" in figure.reason
    figure = measure_memory(model, "onnxruntime", "TensorrtExecutionProvider", feeds)
    assert figure.peak_mb is None and "not available" in figure.reason


def test_a_probe_past_its_time_is_stopped_and_says_so(tmp_path: Path) -> None:
    model, _ = _mlp(tmp_path / "m.onnx", 64, 1)
    figure = measure_memory(model, "onnxruntime", "CPUExecutionProvider", {"x": np.ones((1, 64), np.float32)},
                            timeout_s=0.001)  # fmt: skip
    assert figure.timed_out and figure.peak_mb is None and "took over 0 s" in figure.reason


def test_under_a_time_budget_the_probe_runs_only_in_the_time_left_and_the_cut_is_recorded(tmp_path: Path) -> None:
    """The peak-memory probe is a fresh process (imports, load, runs: 12 s for u2netp on a busy 2-core machine): with
    less than MEMORY_MIN_LEFT_S of the budget left it is not started, and the conversion says so."""
    model, _ = _mlp(tmp_path / "m.onnx", 64, 1)
    inputs = SimpleNamespace(evaluation=Dataset({"x": np.ones((2, 1, 64), np.float32)}, None), threads=1)
    built = SimpleNamespace(prepared=SimpleNamespace(model=None), spec=SimpleNamespace(hint=None))
    target = SimpleNamespace(runtime="onnxruntime", providers=("CPUExecutionProvider",))
    parts = (inputs, SimpleNamespace(threads=[1]), built, target, SimpleNamespace(measurable=True), model)
    with deadline.recording_cuts() as cuts:
        late = _resources(*parts, finish_by=time.monotonic() + PACK_S + 1.0)  # type: ignore[arg-type]
    assert late is not None and late.peak_memory_mb == {} and late.flops_per_run  # FLOPs are counted, not run
    ((what, how),) = [(c.what, c.how) for c in cuts]
    assert what == "peak memory" and how.startswith("not measured") and "counts the files' size" in how
    with deadline.recording_cuts() as cuts:
        early = _resources(*parts, finish_by=time.monotonic() + 300.0)  # type: ignore[arg-type]
    assert early is not None and early.peak_memory_mb["onnxruntime/CPUExecutionProvider"] is not None and not cuts


def test_flops_are_the_rooflines_count(tmp_path: Path) -> None:
    model, _ = _mlp(tmp_path / "m.onnx", 256, 3)
    flops = flops_of(model, {"x": np.ones((1, 256), np.float32)})
    assert flops == pytest.approx(3 * 2 * 256 * 256, rel=0.05)


@pytest.mark.parametrize("profile", ["generic-x86-64", "intel-x86-vnni"])
def test_every_bundle_built_records_its_needs_and_bundle_show_prints_them(
    demo_bundles: dict[str, Path], profile: str
) -> None:
    from edgefleet.core.bundle.archive import parse_manifest

    manifest: Manifest = parse_manifest(read_signed_manifest(demo_bundles[profile]).manifest_json)
    needs = manifest.resources
    assert needs is not None and needs.measured_on
    assert needs.flops_per_run is not None and 1e4 < needs.flops_per_run < 1e8, "the digits CNN: about 0.3 MFLOP"
    key = f"{manifest.recipe.runtime}/{manifest.providers[0]}"
    assert set(needs.peak_memory_mb) == {key}
    assert 0 < needs.peak_mb(manifest.recipe.runtime) < 500, "a 60 KB CNN adds megabytes, not hundreds of them"
    shown = edgefleet("bundle", "show", str(demo_bundles[profile]))
    assert shown.returncode == 0, shown.stderr
    assert f"needs     peak memory {needs.peak_memory_mb[key]:.1f} MB on {key}" in shown.stdout


@pytest.mark.slow
def test_a_language_model_bundle_records_its_peak_memory_while_generating(tinylm_bundles: TinylmBundles) -> None:
    manifest = tinylm_bundles.manifest("generic-x86-64")
    needs = manifest.resources
    assert needs is not None and manifest.generation is not None
    key = f"{manifest.recipe.runtime}/{manifest.providers[0]}"
    assert set(needs.peak_memory_mb) == {key}
    model_mb = sum(f.size for f in manifest.files if f.path.startswith("model/")) / 2**20
    assert 0.5 * model_mb < needs.peak_mb(manifest.recipe.runtime) < 3 * model_mb + 200, (needs, model_mb)
