"""The converter on real models: silero-vad (If subgraphs, scalar input, recurrent state), a scikit-learn
pipeline (ai.onnx.ml ops), a CNN with dynamic height and width; and bad input refused in one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgefleet.converter import ConvertRequest, ProfileResult, convert
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.errors import DataError, ModelError, UserInputError
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.fleet import deploy_to, silero_model
from support.host_cpu import as_this_host
from support.paths import DIGITS, TESTBED
from support.slots import slot_of


def silero() -> Path:
    return silero_model()


def _convert(
    tmp_path: Path, key: SigningKey, model: Path, stem: str, profiles: list[str], **extra
) -> list[ProfileResult]:  # type: ignore[no-untyped-def]
    """intel-x86-vnni as this host's own CPU, so its candidates are timed on any x86-64 CI machine."""
    return convert(
        ConvertRequest(
            model=model, profiles=[as_this_host(get_profile(p)) if p == "intel-x86-vnni" else get_profile(p)
                                   for p in profiles], calib=TESTBED / f"{stem}_calib.npz",
            eval=TESTBED / f"{stem}_eval.npz", out=tmp_path / "out", key=key, name=stem.replace("_", "-"),
            version="1", **extra,
        )
    )  # fmt: skip


@pytest.mark.slow
def test_silero_pinned_reaches_openvino_gates_int8_by_sqnr_and_serves_on_an_agent(
    tmp_path: Path,
    signing_key: SigningKey,
    start_agent,
    host,
    topics,
    watcher,  # type: ignore[no-untyped-def]
) -> None:
    # An SQNR floor and no metric: judged by SQNR (by default its speech probability would be judged by the
    # mask rule, tests/unit/converter/test_default_task_rules.py).
    (result,) = _convert(tmp_path, signing_key, silero(), "silero", ["intel-x86-vnni"], pins={"sr": "16000"},
                         min_sqnr_db=30.0)  # fmt: skip
    assert result.metric == "sqnr-db"
    names = {c["name"]: c for c in result.candidates}
    # Pinning sr and fixing the shapes from the data is what lets OpenVINO compile it.
    # SQNR is the worst slice (channel groups of one scale) of every output: above the profile's 30 dB floor.
    fp32 = names["ov-static-fp32"]  # compiled and inside the floor (its timing may stop early: a faster one passed)
    assert fp32["sqnr_db"] > 30 and (fp32["error"] is None or str(fp32["error"]).startswith("pruned: timing"))
    assert "cannot compile" in str(names["ov-fp32"]["error"])
    int8 = {n: c for n, c in names.items() if "int8-static" in n or "nncf" in n}
    mixed = {n: c for n, c in int8.items() if "accuracy" in n or "float" in n}  # layers kept in float
    plain = [c for n, c in int8.items() if n not in mixed]
    assert plain and all(c["error"] or "SQNR" in str(c["rejected"]) for c in plain)  # plain INT8 breaks the floor
    # Mixed precision may meet the floor (NNCF accuracy control does here): then it competes on speed.
    assert all(c["error"] or "SQNR" in str(c["rejected"]) or c["sqnr_db"] > 30 for c in mixed.values()), mixed
    assert result.recipe is not None and (result.recipe.endswith(("fp32", "bf16")) or result.recipe in mixed)
    assert result.bundle is not None
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.accuracy.metric == "sqnr-db" and manifest.accuracy.value > 30
    assert [i.name for i in manifest.inputs] == ["input", "state"]  # sr is pinned inside the model
    assert manifest.recipe.passes[0].name == "pin-inputs"
    if manifest.format == "openvino-ir" and result.recipe not in mixed:
        assert {f.path for f in manifest.files} >= {"model/model.xml", "model/model.bin"}
        hint = "bf16" if result.recipe.endswith("bf16") else "f32"
        assert manifest.recipe.passes[-1].params["inference_precision_hint"] == hint
    # The device runs what the converter chose, with the provider it measures best (OpenVINO for IR).
    start_agent("dev-silero")
    bundle_id = deploy_to(host, topics, Path(result.bundle), devices=("dev-silero",))
    status = watcher.serving("dev-silero", bundle_id, timeout=60)
    assert slot_of(status).provider_in_use in manifest.providers
    report = json.loads((tmp_path / "out" / "silero-1.report.json").read_text())
    assert report["metric"] == "sqnr-db" and (tmp_path / "out" / "silero-1.report.html").exists()
    assert (tmp_path / "out" / "silero-1-intel-x86-vnni.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_silero_unpinned_gets_a_clear_openvino_verdict(tmp_path: Path, signing_key: SigningKey) -> None:
    (result,) = _convert(tmp_path, signing_key, silero(), "silero", ["intel-x86-vnni"], runtimes=("openvino",))
    assert result.bundle is None
    errors = " ".join(str(c["error"]) for c in result.candidates)
    assert "OpenVINO cannot" in errors and "Conv-16" in errors


@pytest.mark.slow
def test_sklearn_pipeline_ships_on_onnxruntime_and_says_why_not_openvino(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    results = _convert(tmp_path, signing_key, TESTBED / "sklearn_digits.onnx", "sklearn",
                       ["intel-x86-vnni", "intel-npu", "apple-silicon", "jetson-orin-nano"])  # fmt: skip
    by = {r.profile: r for r in results}
    vnni = by["intel-x86-vnni"]
    assert vnni.metric == "top1" and vnni.bundle and vnni.runtime == "onnxruntime" and vnni.accuracy > 0.85
    ov_errors = [c["error"] for c in vnni.candidates if c["runtime"] == "openvino"]
    assert ov_errors and all("TreeEnsembleClassifier" in str(e) for e in ov_errors)
    assert by["intel-npu"].bundle is None and "no candidate" in (by["intel-npu"].error or "")
    assert by["apple-silicon"].bundle and not by["apple-silicon"].measured
    jetson = by["jetson-orin-nano"]  # ai.onnx.ml nodes run on the CUDA/CPU EPs beside the TensorRT engine
    assert jetson.bundle and any("TensorRT's ONNX parser cannot take" in n for n in jetson.notes)


@pytest.mark.slow
def test_dynamic_hw_cnn_gets_static_shapes_for_the_npu(tmp_path: Path, signing_key: SigningKey) -> None:
    results = _convert(tmp_path, signing_key, TESTBED / "dynamic_cnn.onnx", "dynamic_cnn",
                       ["intel-x86-vnni", "intel-npu"])  # fmt: skip
    by = {r.profile: r for r in results}
    assert by["intel-x86-vnni"].bundle and by["intel-x86-vnni"].accuracy > 0.95
    npu = by["intel-npu"]
    assert npu.bundle and npu.format == "openvino-ir" and not npu.measured
    manifest = parse_manifest(read_signed_manifest(Path(npu.bundle)).manifest_json)
    assert manifest.inputs[0].shape == [1, 1, 8, 8] and manifest.latency is None
    assert manifest.providers == ["openvino:NPU"]
    vnni = parse_manifest(read_signed_manifest(Path(by["intel-x86-vnni"].bundle)).manifest_json)
    assert vnni.inputs[0].shape[2:] in (["height", "width"], [8, 8])


def test_profiles_a_model_cannot_target_get_a_verdict(
    tmp_path: Path, signing_key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    custom_op = DIGITS.parent / "custom_op"
    monkeypatch.setenv("EDGEFLEET_CUSTOM_OPS", str(custom_op / "swish_op.py"))
    results = convert(
        ConvertRequest(
            model=custom_op / "swish_cnn.onnx", profiles=[get_profile(p) for p in ("jetson-agx-orin", "browser-wasm")],
            calib=DIGITS / "calib.npz", eval=DIGITS / "eval.npz", out=tmp_path / "out", key=signing_key,
            name="digits", version="1", custom_ops="keep",
        )
    )  # fmt: skip
    assert results[0].bundle and results[1].bundle is None  # ONNX Runtime (TensorRT EP) loads custom ops
    assert "edgefleet.ops::Swish" in (results[1].error or "") and "cannot load custom operators" in (
        results[1].error or ""
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "digits-1-jetson-agx-orin.bundle", "digits-1.report.html", "digits-1.report.json"
    ]  # fmt: skip


def _request(tmp_path: Path, key: SigningKey, **changes: object) -> ConvertRequest:
    fields: dict = dict(
        model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("generic-x86-64")], calib=DIGITS / "calib.npz",
        eval=DIGITS / "eval.npz", out=tmp_path / "out", key=key, name="digits", version="1",
    )  # fmt: skip
    fields.update(changes)
    return ConvertRequest(**fields)


@pytest.mark.parametrize(
    ("calib", "error", "message"),
    [
        ({"input": np.zeros((4, 1, 1, 8, 8), np.float64)}, DataError, "dtype float64 but the model wants float32"),
        ({"input": np.zeros((4, 1, 1, 9, 9), np.float32)}, DataError, "dimension 2 is 9, the model wants 8"),
        ({"input": np.zeros((0, 1, 1, 8, 8), np.float32)}, DataError, "holds no samples"),
    ],
)
def test_bad_data_is_one_clear_error_and_nothing_is_written(
    tmp_path: Path, signing_key: SigningKey, calib: dict, error: type, message: str
) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, **calib)
    with pytest.raises(error, match=message):
        convert(_request(tmp_path, signing_key, calib=path))
    with pytest.raises(error, match=message):
        convert(_request(tmp_path, signing_key, eval=path))
    assert not (tmp_path / "out").exists()


def test_bad_pins_and_versions_are_refused(tmp_path: Path, signing_key: SigningKey) -> None:
    with pytest.raises(UserInputError, match=r"cannot pin 'sr': the model's inputs are \['input'\]"):
        convert(_request(tmp_path, signing_key, pins={"sr": "16000"}))
    with pytest.raises(UserInputError, match="invalid model version"):
        convert(_request(tmp_path, signing_key, version="v1"))
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes((DIGITS / "digits_cnn.onnx").read_bytes()[:3000])
    with pytest.raises(ModelError):
        convert(_request(tmp_path, signing_key, model=truncated))
    assert not (tmp_path / "out").exists()


def test_the_cache_reuses_builds_across_runs(tmp_path: Path, signing_key: SigningKey) -> None:
    cache = tmp_path / "cache"
    first = convert(_request(tmp_path, signing_key, cache_dir=cache, out=tmp_path / "a"))
    entries = sorted(p.name for p in cache.glob("*/*"))
    second = convert(_request(tmp_path, signing_key, cache_dir=cache, out=tmp_path / "b"))
    # Every build of the first run is reused; a candidate the first run pruned (it could not beat one inside
    # the budget, so it was never cached) may be built by the second, whose timings differ.
    assert entries and set(entries) <= {p.name for p in cache.glob("*/*")}
    scores = [
        {c["name"]: c["accuracy"] for c in run[0].candidates if c["accuracy"] is not None} for run in (first, second)
    ]
    common = scores[0].keys() & scores[1].keys()
    assert common and all(scores[0][name] == scores[1][name] for name in common)
