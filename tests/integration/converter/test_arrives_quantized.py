"""Models that arrive quantized, one per kind (tests/support/models/quantized.py): `inspect` says what each carries;
`convert` never quantizes it again blindly: it keeps it as it is, offers its float graph to the usual recipes
where it has one (shipped only where the gate and the timing prove they pay), and refuses a target that cannot
run its operators, in one sentence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgefleet.converter import ConvertRequest, convert, inspect_model
from edgefleet.converter.quantized import dequantize, detect
from edgefleet.converter.runners import ort_runner
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.host_cpu import as_this_host
from support.models import quantized as qm

PRIMARY = {"qdq": "qdq", "qoperator": "qoperator", "integer-ops": "integer-ops", "weight-only": "weight-only",
           "matmul-nbits": "weight-only", "contrib": "contrib"}  # fmt: skip
PRECISION = {"qdq": "int8-static", "qoperator": "int8-static", "integer-ops": "int8-dynamic",
             "weight-only": "int8-weights", "matmul-nbits": "int8-weights", "contrib": "int8-dynamic"}  # fmt: skip
FLOAT_GRAPH = {"qdq", "weight-only"}


def _files(tmp_path: Path, kind: str) -> tuple[Path, Path, Path]:
    make, float_model = qm.KINDS[kind]
    path = tmp_path / f"{kind}.onnx"
    onnx.save(make(), str(path))
    base = float_model()
    np.savez(tmp_path / "calib.npz", **qm.data(base, 24))
    np.savez(tmp_path / "eval.npz", **qm.data(base, 24))
    return path, tmp_path / "calib.npz", tmp_path / "eval.npz"


@pytest.mark.parametrize("kind", list(qm.KINDS))
def test_a_model_that_arrives_quantized_is_kept_as_it_is_and_inspect_names_its_kind(
    kind: str, tmp_path: Path, signing_key: SigningKey
) -> None:
    model, calib, evaluation = _files(tmp_path, kind)
    report = inspect_model(model, [])
    assert report.quantization is not None and report.quantization["primary"] == PRIMARY[kind]
    runtimes = ("onnxruntime", "openvino") if kind in ("qdq", "qoperator") else ("onnxruntime",)
    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[as_this_host(get_profile("intel-x86-vnni"))], calib=calib, eval=evaluation,
            out=tmp_path / "out", key=signing_key, name=kind, version="1", threads=2, report=False, runtimes=runtimes,
        )
    )  # fmt: skip
    assert result.bundle, result.error
    names = [str(c["name"]) for c in result.candidates]
    # Never quantized again blindly: every candidate is the model kept as it is, or a recipe on its float graph.
    assert all(n.endswith("-as-quantized") or "-dq-" in n for n in names), names
    assert "ort-as-quantized" in names
    assert any("kept as it is, never quantized again" in n for n in result.notes)
    if kind in FLOAT_GRAPH:
        assert any("-dq-" in n for n in names) and any("its float graph" in n for n in result.notes)
    else:
        assert not any("-dq-" in n for n in names) and any("not dequantized" in n for n in result.notes)
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    if result.recipe and result.recipe.endswith("-as-quantized"):
        assert manifest.recipe.precision == PRECISION[kind]
    else:  # a recipe on the float graph shipped: it met the bar against the model as it arrived
        assert any(p.name == "dequantize" for p in manifest.recipe.passes)
        assert manifest.accuracy.value >= manifest.search.bar  # type: ignore[union-attr]


def test_a_target_that_cannot_run_its_operators_is_refused_in_one_sentence(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    model, calib, evaluation = _files(tmp_path, "contrib")
    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[get_profile("browser-wasm")], calib=calib, eval=evaluation, out=tmp_path / "out",
            key=signing_key, name="contrib", version="1", report=False,
        )
    )  # fmt: skip
    assert result.bundle is None
    refusal = next(n for n in result.notes if "refused" in n)
    assert "arrives quantized" in refusal and "cannot run its com.microsoft operators DynamicQuantizeLSTM" in refusal


def test_the_float_graph_of_a_qdq_model_keeps_what_its_pairs_clip_and_loses_only_the_rounding() -> None:
    quantized = qm.qdq()
    floated = dequantize(quantized)
    assert floated is not None and detect(floated) is None
    assert {n.op_type for n in floated.graph.node} >= {"Conv", "MatMul", "Clip"}  # the Relus the pairs implied
    feeds = {"x": qm.data(qm.conv_matmul(), 1)["x"][0]}
    want = ort_runner(quantized, as_written=True)(feeds)["logits"]
    got = ort_runner(floated)(feeds)["logits"]
    step = max(abs(float(np.max(want))), 1.0) * 0.05  # a few quantization steps of the output's scale
    assert float(np.max(np.abs(got - want))) < step
    assert dequantize(qm.qoperator()) is None and detect(qm.conv_matmul()) is None
