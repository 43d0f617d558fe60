"""One definition of "good enough" from converter to device (issue 31, item 2).

The converter computes the golden figures the device will report (edgefleet.core.quality.golden_hold: the device's
own golden check on the bundle's outputs, from the bundle's runtime on this host), refuses any candidate whose
figures would fail the rollout's default golden guardrail, and records them in the manifest (`golden_hold`), the
conversion report and the table `edgefleet convert` prints. The agent's golden check on the same bundle, on the
same runtime, reports the same figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.converter import ConvertRequest, convert
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.cli import edgefleet
from support.golden_sets import int8_only
from support.host_cpu import as_this_host
from support.paths import DIGITS
from support.runtime import unpack


def _device_check(bundle: Path, public_key: Path, dest: Path) -> tuple[Manifest, float, dict[str, float]]:
    """The bundle unpacked as the agent's store holds it, loaded and golden-checked by the agent's own code
    (agent/runtime/model.py: what the installer runs before commit and the heartbeat reports)."""
    bundle_dir, manifest = unpack(bundle, public_key, dest)
    result = LoadedModel(bundle_dir, manifest, 1).check_golden()
    assert result.passed, result.reason
    return manifest, result.agreement, {s.output: s.score for s in result.scores}


@pytest.mark.parametrize(
    "name, runtime, int8",
    [
        ("generic-x86-64", "onnxruntime", True),
        ("intel-x86-vnni", "onnxruntime", False),
        ("intel-x86-vnni", "openvino", False),
    ],
)
def test_the_device_reports_the_golden_figure_the_manifest_carries(
    name: str, runtime: str, int8: bool, tmp_path: Path, signing_key: SigningKey, keys: tuple[Path, Path]
) -> None:
    profile = as_this_host(get_profile(name))  # this host is the device: it runs the bundle's own runtime
    profile = int8_only(profile) if int8 else profile
    (result,) = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[profile], calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz", out=tmp_path / "out", key=signing_key, name="digits", version="1",
            runtimes=(runtime,), report=False,
        )
    )  # fmt: skip
    assert result.bundle is not None and result.golden is not None
    manifest, agreement, scores = _device_check(Path(result.bundle), keys[1], tmp_path / "device")
    held = manifest.golden_hold
    assert held is not None and held.same_runtime and held.runtime.startswith(runtime)
    assert held.model_dump(mode="json") == result.golden  # the table's figure is the signed manifest's
    assert agreement == pytest.approx(held.agreement, abs=1e-6)
    assert scores == pytest.approx(held.scores, abs=1e-6)
    assert held.passed and held.agreement >= held.floor


def _near_tie_classifier(directory: Path) -> tuple[Path, Path, Path]:
    """A classifier whose nine live classes score within 0.2 % of each other (class 9 never wins), with labels that
    are all class 9: top-1 against the labels is 0 for FP32 and for any INT8 build, so the task metric cannot see
    INT8 reorder the nine, while the device's golden check (argmax agreement with FP32) does."""
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 1, (64, 1)) + 0.002 * rng.normal(0, 1, (64, 10))
    bias = np.zeros(10)
    bias[9] = -100.0
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["logits"])],
        "near-tie",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 10])],
        [numpy_helper.from_array(weights.astype(np.float32), "w"),
         numpy_helper.from_array(bias.astype(np.float32), "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(directory / "near_tie.onnx"))
    np.savez(directory / "calib.npz", input=rng.normal(0, 1, (32, 1, 64)).astype(np.float32))
    np.savez(
        directory / "eval.npz",
        input=rng.normal(0, 1, (96, 1, 64)).astype(np.float32),
        labels=np.full(96, 9, np.int64),
    )
    return directory / "near_tie.onnx", directory / "calib.npz", directory / "eval.npz"


@pytest.mark.slow
def test_int8_inside_the_task_budget_but_failing_the_rollouts_golden_floor_is_refused_and_the_table_says_so(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """The issue's seam, reproduced: the plain INT8 candidate meets the task metric's budget (top-1 0.0 against FP32's
    0.0) while the golden agreement the device would report is far below the rollout's floor. The converter refuses
    it with that figure and floor, and what it ships reports on the device the figure its table printed."""
    model, calib, evaluation = _near_tie_classifier(tmp_path)
    out = tmp_path / "out"
    run = edgefleet(
        "convert", str(model), "--profile", "generic-x86-64", "--calib", str(calib), "--eval", str(evaluation),
        "--out", str(out), "--key", str(keys[0]), "--name", "near-tie", "--runtime", "onnxruntime", "--no-prune",
        "--no-cache",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    (profile,) = json.loads((out / "near-tie-1.report.json").read_text("utf-8"))["profiles"]
    rejected = {c["name"]: c for c in profile["candidates"] if c.get("rejected")}
    plain = rejected["ort-int8-static-u8s8-reduce-range"]
    assert plain["accuracy"] >= profile["reference_accuracy"] - 0.01  # the task metric alone would ship it
    assert (
        "on the device (onnxruntime CPUExecutionProvider) would fail the rollout's default guardrail"
        in (plain["rejected"])
    )
    # FP32 at 1.0, the default drop 0.01, widened by the drop the build plans (at most 0.01 more)
    assert "below the floor 0.9800" in plain["rejected"]
    figure = float(plain["rejected"].split("golden agreement ")[1].split()[0])
    assert figure < 0.9  # near ties: INT8 reorders most of the golden samples
    manifest, agreement, _ = _device_check(Path(profile["bundle"]), keys[1], tmp_path / "device")
    assert manifest.golden_hold is not None and manifest.golden_hold.passed
    assert agreement == pytest.approx(manifest.golden_hold.agreement, abs=1e-6)
    held = manifest.golden_hold
    assert f"generic-x86-64: {held.summary()}" in run.stdout  # the table's line under the figures
    assert "rejected ort-int8-static-u8s8-reduce-range: golden agreement" in run.stdout
    show = edgefleet("bundle", "show", profile["bundle"])
    assert show.returncode == 0 and manifest.golden_hold.summary() in show.stdout
    report = (out / "near-tie-1.report.html").read_text("utf-8")
    assert "golden agreement the rollout will hold" in report and "would fail the rollout" in report
