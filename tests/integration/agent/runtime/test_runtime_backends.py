"""Contract tests over every registered backend and every provider it documents, on real runtimes.

An available provider must load the demo CNN, run it thread-safely and agree with ONNX Runtime's CPU
outputs; an unavailable one must say why in a sentence. Nothing here is mocked.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgefleet.agent.runtime import backends
from edgefleet.agent.runtime.backends import CancelToken, LoadOptions, availability, backend_for, optional_import
from edgefleet.core.errors import UnknownNameError

from support.paths import REPO
from support.runtime import DIGITS_MODEL

PROVIDERS = sorted({(b.key, p) for b in backends.backends() for p in b.known_providers})
SAMPLES = np.random.default_rng(0).random((4, 1, 1, 8, 8), dtype=np.float32)


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    session = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    return [session.run(["logits"], {"input": x})[0] for x in SAMPLES]


def test_every_runtime_the_design_names_has_a_backend() -> None:
    keys = {b.key for b in backends.backends()}
    assert {"onnxruntime", "openvino", "coreml"} <= keys
    for provider in ("CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider",
                     "OpenVINOExecutionProvider", "CoreMLExecutionProvider"):  # fmt: skip
        assert backend_for(provider).key == "onnxruntime"
    for device in ("CPU", "GPU", "NPU", "AUTO"):
        assert backend_for(f"openvino:{device}").key == "openvino"
    assert backend_for("coreml:ALL").key == "coreml"


def test_an_unknown_provider_names_the_ones_that_exist() -> None:
    with pytest.raises(UnknownNameError, match="CPUExecutionProvider"):
        backend_for("tpu:0")
    assert not availability("tpu:0", "onnx").ok


@pytest.mark.parametrize(("key", "provider"), PROVIDERS, ids=[p for _, p in PROVIDERS])
def test_backend_contract(key: str, provider: str, tmp_path: Path, reference: list[np.ndarray]) -> None:
    backend = backend_for(provider)
    assert backend.key == key and backend.claims(provider)
    assert backend.version(provider).strip()
    fmt = "coreml" if key == "coreml" else "onnx"
    found = availability(provider, fmt)
    if not found.ok:
        assert len(found.reason) > 20, f"{provider}: an unavailable provider must say why ({found.reason!r})"
        return
    options = LoadOptions(threads=1, precision="fp32", cache_dir=tmp_path / "cache", outputs=("logits",))
    session = backend.load(DIGITS_MODEL, provider, options, CancelToken())
    assert session.provider == provider and session.output_names == ["logits"]
    errors: list[BaseException] = []
    results: dict[int, np.ndarray] = {}

    def worker(index: int) -> None:  # run is thread-safe: four threads at once
        try:
            for _ in range(20):
                results[index] = session.run({"input": SAMPLES[index]})["logits"]
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(SAMPLES))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for index, expected in enumerate(reference):
        assert results[index].shape == (1, 10) and results[index].dtype == np.float32
        np.testing.assert_allclose(results[index], expected, atol=1e-4)
    session.close()


def test_openvino_compiles_fp32_bundles_in_f32_with_the_latency_hint_and_a_blob_cache(tmp_path: Path) -> None:
    if not availability("openvino:CPU", "onnx").ok:
        pytest.fail("OpenVINO is part of the test install ([host] extra); its CPU device must be available")
    options = LoadOptions(threads=1, precision="fp32", cache_dir=tmp_path, outputs=("logits",))
    session = backend_for("openvino:CPU").load(DIGITS_MODEL, "openvino:CPU", options, CancelToken())
    described = session.describe()
    assert described["INFERENCE_PRECISION_HINT"] in ("<Type: 'float32'>", "f32", "float32")
    assert described["PERFORMANCE_HINT"] in ("LATENCY", "PerformanceMode.LATENCY")
    assert list((tmp_path / "openvino").glob("*.blob")), "CACHE_DIR must hold the compiled blob"


def test_ort_ep_options_are_right_for_providers_this_machine_lacks(tmp_path: Path) -> None:
    from edgefleet.agent.runtime.backends.ort import provider_options

    options = LoadOptions(threads=2, precision="fp16", cache_dir=tmp_path)
    trt = provider_options("TensorrtExecutionProvider", options)
    assert trt["trt_fp16_enable"] == "True" and trt["trt_engine_cache_path"] == str(tmp_path / "tensorrt")
    assert provider_options("CUDAExecutionProvider", options)["cudnn_conv_algo_search"] == "HEURISTIC"
    ov = provider_options("OpenVINOExecutionProvider", LoadOptions(threads=2, precision="fp32", cache_dir=tmp_path))
    assert '"INFERENCE_PRECISION_HINT": "f32"' in ov["load_config"] and ov["num_of_threads"] == "2"
    coreml = provider_options("CoreMLExecutionProvider", options)
    assert coreml["MLComputeUnits"] == "ALL" and coreml["ModelCacheDirectory"].startswith(str(tmp_path))
    assert all(isinstance(v, str) for v in {**trt, **ov, **coreml}.values())


def test_a_missing_package_disables_a_backend_with_the_extra_to_install() -> None:
    found = optional_import("edgefleet_no_such_runtime", package="no-such-runtime", extra="openvino")
    assert found.module is None and "pip install 'edgefleet[openvino]'" in found.reason


def test_coreml_on_linux_says_it_needs_macos() -> None:
    if sys.platform == "darwin":
        pytest.skip("on macOS CoreML is available")
    assert "macOS" in availability("coreml:ALL", "coreml").reason
    assert "cannot load onnx bundles" in availability("coreml:ALL", "onnx").reason


def test_importing_the_runtime_loads_no_optional_runtime() -> None:
    code = (
        "import sys; import edgefleet.agent.runtime, edgefleet.agent.api, edgefleet.agent.runtime.backends as b; "
        "b.backends(); print(sorted(m for m in ('openvino', 'coremltools', 'onnxruntime_ep_openvino') "
        "if m in sys.modules))"
    )
    out = subprocess.check_output([sys.executable, "-c", code], text=True, cwd=REPO)
    assert out.strip() == "[]"
