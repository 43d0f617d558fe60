"""The done-when of issue 4: `edgefleet convert` builds a verified bundle for every profile in device_profiles/ from
the demo CNN, and says which profiles a model cannot target and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgefleet.converter import ConvertRequest, convert
from edgefleet.core.bundle.archive import verify_bundle
from edgefleet.core.profiles import load_profiles
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.paths import DIGITS, REPO

EXPECTED_FORMATS = {
    "apple-silicon": "coreml",
    "browser-wasm": "onnx",
    "generic-arm64": "onnx",
    "generic-x86-64": "onnx",
    "intel-igpu": "openvino-ir",
    "intel-npu": "openvino-ir",
    "intel-x86-vnni": None,  # onnx or openvino-ir, whichever is faster here
    "jetson-agx-orin": "onnx-tensorrt",
    "jetson-orin-nano": "onnx-tensorrt",
    "rpi5-arm64": "onnx",
}


@pytest.mark.slow
def test_edgefleet_convert_builds_a_verified_bundle_for_every_profile(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    assert sorted(load_profiles()) == sorted(EXPECTED_FORMATS)
    out = subprocess.run(
        [sys.executable, "-m", "edgefleet", "convert", str(DIGITS / "digits_cnn.onnx"), "--profile", "all",
         "--calib", str(DIGITS / "calib.npz"), "--eval", str(DIGITS / "eval.npz"), "--out", str(tmp_path / "out"),
         "--key", str(keys[0]), "--name", "digits-cnn", "--no-cache", "--json",
         "--time-budget", "0"],  # each profile's own format, whatever a busy machine's budget would cut
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    results = {r["profile"]: r for r in json.loads(out.stdout)["profiles"]}
    assert sorted(results) == sorted(EXPECTED_FORMATS)
    trusted = TrustedKeys.load([keys[1]])
    for name, result in results.items():
        assert result["bundle"] and not result["error"], f"{name}: {result['error']}"
        manifest = verify_bundle(Path(result["bundle"]), trusted)
        assert manifest.profile == name and manifest.accuracy.passed
        if EXPECTED_FORMATS[name]:
            assert manifest.format == EXPECTED_FORMATS[name], name
        assert manifest.accuracy.value >= manifest.accuracy.reference - manifest.accuracy.budget
    assert verify_bundle(Path(results["browser-wasm"]["bundle"]), trusted).web is not None
    assert verify_bundle(Path(results["jetson-orin-nano"]["bundle"]), trusted).tensorrt is not None


def test_the_converter_says_which_profiles_a_model_cannot_target_and_why(
    tmp_path: Path, signing_key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The custom-op example with decomposition turned off: only runtimes that load custom ops can take it."""
    monkeypatch.setenv("EDGEFLEET_CUSTOM_OPS", str(REPO / "models" / "custom_op" / "swish_op.py"))
    results = convert(
        ConvertRequest(
            model=REPO / "models" / "custom_op" / "swish_cnn.onnx", profiles=list(load_profiles().values()),
            calib=DIGITS / "calib.npz", eval=DIGITS / "eval.npz", out=tmp_path / "out", key=signing_key,
            name="swish-cnn", version="1", report=False, custom_ops="keep",
        )
    )  # fmt: skip
    blocked = {r.profile: r.error or "" for r in results if r.bundle is None}
    assert sorted(blocked) == ["browser-wasm", "intel-igpu", "intel-npu"]
    for name, error in blocked.items():
        assert "edgefleet.ops::Swish" in error and "cannot load custom operators" in error, (name, error)
    apple = next(r for r in results if r.profile == "apple-silicon")
    assert apple.format == "onnx" and any("coreml/coreml" in n and "Swish" in n for n in apple.notes)
