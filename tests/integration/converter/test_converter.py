"""The converter: the fastest recipe inside the accuracy budget, with a reason for every refusal."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from edgefleet.converter import ConvertRequest, convert, load_model
from edgefleet.converter.onnx_graph import count_ops
from edgefleet.converter.passes import optimize_portable
from edgefleet.converter.search.choose import Candidate, choose
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.errors import DataError, ModelError
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.host_cpu import matches_this_host
from support.paths import DIGITS


def test_demo_bundles_carry_accuracy_latency_recipe_and_golden_set(demo_bundles: dict[str, Path]) -> None:
    for profile, path in demo_bundles.items():
        manifest = parse_manifest(read_signed_manifest(path).manifest_json)
        assert manifest.profile == profile and manifest.format == "onnx"
        assert manifest.accuracy.metric == "top1" and manifest.accuracy.value >= 0.95
        assert manifest.accuracy.value >= manifest.accuracy.reference - manifest.accuracy.budget
        # The fixture builds both profiles with this host as their hardware (tests/conftest.py _demo_profile):
        # each is timed here, whatever CPU the suite runs on.
        assert manifest.latency is not None and manifest.latency.median_ms > 0
        assert manifest.recipe.precision in ("fp32", "int8-static", "int8-dynamic")
        assert (manifest.format, manifest.recipe.runtime) in (("onnx", "onnxruntime"), ("openvino-ir", "openvino"))
        assert manifest.inputs[0].name == "input" and manifest.opset == {"": 17}
        assert manifest.golden.count == 64  # at least 64 golden samples by default
        assert [(c.output, c.rule) for c in manifest.golden.outputs] == [("logits", "class-agreement")]
        assert manifest.drift_reference == "drift_reference.json"


def test_a_profile_whose_hardware_this_host_is_not_is_judged_for_accuracy_and_left_untimed(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    """rpi5-arm64 on an x86-64 host: accuracy is gated on this machine (a proxy), latency is left to the devices."""
    profile = get_profile("rpi5-arm64")
    assert not matches_this_host(profile)
    (result,) = convert(_request(tmp_path, signing_key, profiles=[profile], runtimes=("onnxruntime",)))
    assert result.bundle is not None and result.recipe is not None
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.latency is None
    assert manifest.accuracy.value >= manifest.accuracy.reference - manifest.accuracy.budget


def test_optimization_fuses_batchnorm_into_conv_and_stays_portable(tmp_path: Path) -> None:
    result = optimize_portable(DIGITS / "digits_cnn.onnx", tmp_path / "opt.onnx")
    assert result.ops_before["BatchNormalization"] == 3
    assert "BatchNormalization" not in result.ops_after
    model = onnx.load(str(tmp_path / "opt.onnx"))
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}


def test_choose_keeps_the_fastest_candidate_inside_the_budget() -> None:
    candidates = [
        Candidate("fp32", "fp32", "onnxruntime", 100, accuracy=0.99, latency_ms=2.0),
        Candidate("int8", "int8-static", "onnxruntime", 30, accuracy=0.985, latency_ms=1.0),
        Candidate("int8-aggressive", "int8-static", "onnxruntime", 20, accuracy=0.90, latency_ms=0.5),
        Candidate("fp16", "fp16", "onnxruntime", error="unsupported op"),
    ]
    choice = choose(candidates, reference=0.99, max_drop=0.01, size_limit_bytes=1000)
    assert choice.chosen is not None and choice.chosen.name == "int8"
    reasons = {c.name: c.rejected for c in choice.rejected}
    assert "below the budget floor 0.9800" in reasons["int8-aggressive"]
    assert reasons["fp32"].startswith("slower: 2.000 ms median vs 1.000 ms for int8 (2.00x)")
    assert reasons["fp16"] == "failed: unsupported op"


def test_choose_refuses_everything_over_the_size_limit() -> None:
    candidates = [Candidate("fp32", "fp32", "onnxruntime", 5000, accuracy=0.99, latency_ms=1.0)]
    choice = choose(candidates, reference=0.99, max_drop=0.01, size_limit_bytes=1000)
    assert choice.chosen is None and "over the profile's limit" in (choice.rejected[0].rejected or "")


def test_a_zero_budget_ships_only_a_recipe_that_loses_nothing(tmp_path: Path, signing_key: SigningKey) -> None:
    """max_drop 0: FP32, the reference, always qualifies; a faster recipe ships only if it lost nothing at all
    (INT8 on the digits CNN does on some CPUs), and every recipe that lost anything is refused for it."""
    results = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("intel-x86-vnni")], calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz", out=tmp_path, key=signing_key, name="digits", version="2", max_drop=0.0,
        )
    )  # fmt: skip
    (result,) = results
    assert result.recipe is not None and result.accuracy == result.reference_accuracy
    for candidate in result.candidates:
        accuracy = candidate.get("accuracy")
        if isinstance(accuracy, float) and accuracy < result.reference_accuracy:
            assert candidate.get("rejected"), candidate


def _request(tmp_path: Path, key: SigningKey, **changes: object) -> ConvertRequest:
    fields: dict = dict(
        model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("generic-x86-64")], calib=DIGITS / "calib.npz",
        eval=DIGITS / "eval.npz", out=tmp_path / "out", key=key, name="digits", version="1",
    )  # fmt: skip
    fields.update(changes)
    return ConvertRequest(**fields)


def test_a_file_that_is_not_onnx_is_refused_and_nothing_is_written(tmp_path: Path, signing_key: SigningKey) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"\x00\x01garbage" * 50)
    with pytest.raises(ModelError, match="is not an ONNX model"):
        convert(_request(tmp_path, signing_key, model=bogus))
    assert not (tmp_path / "out").exists()


def test_a_truncated_model_is_refused(tmp_path: Path, signing_key: SigningKey) -> None:
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes((DIGITS / "digits_cnn.onnx").read_bytes()[:5000])
    with pytest.raises(ModelError):
        load_model(truncated)


def test_calibration_data_without_the_model_input_is_refused(tmp_path: Path, signing_key: SigningKey) -> None:
    import numpy as np

    calib = tmp_path / "calib.npz"
    np.savez(calib, pixels=np.zeros((4, 1, 1, 8, 8), np.float32))
    with pytest.raises(DataError, match=r"lacks model input\(s\) \['input'\]"):
        convert(_request(tmp_path, signing_key, calib=calib))
    assert not (tmp_path / "out").exists()


def test_op_counts_include_every_node() -> None:
    counts = count_ops(load_model(DIGITS / "digits_cnn.onnx").proto)
    assert counts["Conv"] == 3 and counts["Relu"] == 3 and counts["Gemm"] == 1


def test_the_report_says_how_near_this_machines_limit_each_timed_candidate_runs(
    demo_bundles: dict[str, Path],
) -> None:
    """converter.roofline: work from the candidate's own graph, limits measured here at the timing's threads."""
    import json

    out = next(iter(demo_bundles.values())).parent
    document = json.loads((out / "digits-cnn-1.report.json").read_text())
    for profile in document["profiles"]:
        limits, lines = profile["limits"], profile["roofline"]
        assert limits["gemm_gops"]["onnxruntime"]["fp32"] > 0 and limits["bandwidth_gbs"] > 0
        chosen = lines[profile["recipe"]]
        assert chosen["work"]["macs_by_op"]["Conv"] > 0 and chosen["work"]["bytes_moved"] > 0
        assert chosen["latency_ms"] == pytest.approx(profile["latency_ms"])
        assert chosen["bound"] in ("compute", "memory") and chosen["limit_pct"] > 0
        assert chosen["limit_pct"] == pytest.approx(max(chosen["compute_pct"], chosen["bandwidth_pct"]))
        row = next(c for c in profile["candidates"] if c["name"] == profile["recipe"])
        assert row["limit_pct"] == chosen["limit_pct"]
    page = (out / "digits-cnn-1.report.html").read_text()
    assert "% of the limit" in page and "% bandwidth" in page
