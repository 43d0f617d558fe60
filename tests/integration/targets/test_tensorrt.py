"""TensorRT bundles (jetson-orin-nano, jetson-agx-orin) without a GPU: everything up to the session options the
agent would hand ONNX Runtime's TensorRT EP (engine cache folder and key, FP16/INT8 flags, calibration table),
the engine-build time limit, and the refusal of a TensorRT bundle on a machine without CUDA, before download."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest

from edgefleet.agent.install.installer import Refused, check_runnable
from edgefleet.agent.runtime import backends as agent_backends
from edgefleet.agent.runtime.backends import (
    Availability,
    Backend,
    CancelToken,
    LoadError,
    LoadOptions,
    Session,
    backend_for,
    registered,
)
from edgefleet.agent.runtime.backends import tensorrt_engines as engines
from edgefleet.agent.runtime.backends.ort import OrtSession
from edgefleet.agent.runtime.selection.selector import Policy, model_identity, select
from edgefleet.converter import ConvertRequest, convert
from edgefleet.core.bundle.archive import read_signed_manifest, unpack_bundle
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import get_profile
from edgefleet.core.quality.golden import GoldenSet
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.paths import DIGITS
from support.slots import slot_of

TRT, CUDA = "TensorrtExecutionProvider", "CUDAExecutionProvider"
ORIN = engines.Hardware(tensorrt="10.3.0", gpu_arch="sm_87")


@pytest.fixture(scope="module")
def trt_bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """The digits CNN for jetson-orin-nano: the profile's own choice (FP16) and an INT8-only variant."""
    out = tmp_path_factory.mktemp("trt")
    nano = get_profile("jetson-orin-nano")
    int8 = nano.model_copy(update={"targets": [nano.targets[0].model_copy(update={"precisions": ["int8-static"]})]})
    found = {}
    for label, profile in (("fp16", nano), ("int8", int8)):
        (result,) = convert(
            ConvertRequest(
                model=DIGITS / "digits_cnn.onnx", profiles=[profile], calib=DIGITS / "calib.npz",
                eval=DIGITS / "eval.npz", out=out / label, key=signing_key, name="digits", version="1", report=False,
            )
        )  # fmt: skip
        assert result.bundle, result.error
        found[label] = Path(result.bundle)
    return found


def _unpacked(bundle: Path, keys: tuple[Path, Path], dest: Path) -> tuple[Path, Manifest]:
    return dest, unpack_bundle(bundle, dest, TrustedKeys.load([keys[1]]))


def _options(manifest: Manifest, bundle_dir: Path, cache: Path) -> LoadOptions:
    return LoadOptions(
        threads=1, precision=manifest.recipe.precision, cache_dir=cache, outputs=("logits",),
        model_sha256=model_identity(manifest), bundle_dir=bundle_dir, tensorrt=manifest.tensorrt,
    )  # fmt: skip


def test_fp16_bundle_is_portable_onnx_with_the_ep_options(trt_bundles: dict[str, Path], tmp_path: Path,
                                                           keys: tuple[Path, Path]) -> None:  # fmt: skip
    bundle_dir, manifest = _unpacked(trt_bundles["fp16"], keys, tmp_path / "b")
    assert manifest.format == "onnx-tensorrt" and manifest.recipe.precision == "fp16"
    assert manifest.providers == [TRT, CUDA, "CPUExecutionProvider"]
    assert manifest.tensorrt is not None and manifest.tensorrt.fp16 and not manifest.tensorrt.int8
    assert manifest.tensorrt.calibration_table is None and manifest.latency is None
    model = onnx.load(str(bundle_dir / manifest.model_path))
    assert not any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer), "FP32 ONNX ships"
    assert {p.name for p in manifest.recipe.passes} >= {"tensorrt-ep-options"}
    assert manifest.golden.max_abs_error > 0.01  # the engine's own FP16/TF32 kernels against the host's proxy


def test_int8_bundle_carries_a_calibration_table_onnxruntime_wrote(
    trt_bundles: dict[str, Path], tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    from onnxruntime.quantization.CalTableFlatBuffers import TrtTable

    bundle_dir, manifest = _unpacked(trt_bundles["int8"], keys, tmp_path / "b")
    assert manifest.tensorrt is not None and manifest.tensorrt.int8 and manifest.tensorrt.fp16
    assert manifest.tensorrt.calibration_table == "model/calibration.flatbuffers"
    assert manifest.file("model/calibration.flatbuffers").size > 0
    table = TrtTable.TrtTable.GetRootAsTrtTable((bundle_dir / "model" / "calibration.flatbuffers").read_bytes(), 0)
    ranges = {table.Dict(i).Key().decode(): float(table.Dict(i).Value()) for i in range(table.DictLength())}
    shipped = onnx.load(str(bundle_dir / manifest.model_path))
    tensors = {o for n in shipped.graph.node for o in n.output} | {i.name for i in shipped.graph.input}
    assert set(ranges) == tensors, "a range for every tensor of the graph the device builds its engine from"
    assert all(v >= 0 for v in ranges.values())
    assert ranges["input"] == pytest.approx(1.0, abs=1e-6)  # pixels / 16 lie in [0, 1]
    passes = {p.name: p.params for p in manifest.recipe.passes}
    assert passes["tensorrt-calibration-table"]["symmetric"] is True


def test_the_session_options_the_agent_would_pass(trt_bundles: dict[str, Path], tmp_path: Path,
                                                  keys: tuple[Path, Path]) -> None:  # fmt: skip
    bundle_dir, manifest = _unpacked(trt_bundles["int8"], keys, tmp_path / "b")
    options = _options(manifest, bundle_dir, tmp_path / "cache")
    got = engines.session_options(options, ORIN)
    name, parts = engines.engine_key(options, ORIN)
    folder = tmp_path / "cache" / "tensorrt" / name
    assert name.startswith("sm_87-trt10.3.0-") and parts["model_sha256"] == manifest.file("model/model.onnx").sha256
    assert got == {
        "device_id": "0",
        "trt_fp16_enable": "True",
        "trt_int8_enable": "True",
        "trt_engine_cache_enable": "True",
        "trt_timing_cache_enable": "True",
        "trt_builder_optimization_level": "3",
        "trt_int8_calibration_table_name": "calibration.flatbuffers",
        "trt_int8_use_native_calibration_table": "False",
        "trt_engine_cache_path": str(folder),
        "trt_timing_cache_path": str(tmp_path / "cache" / "tensorrt" / "timing" / "sm_87-trt10.3.0"),
    }
    assert engines.prepare_engine_dir(options, ORIN) == folder
    # The EP reads the table relative to the engine cache path: the agent copies it there.
    assert (folder / "calibration.flatbuffers").read_bytes() == (
        bundle_dir / "model/calibration.flatbuffers"
    ).read_bytes()
    assert '"gpu_arch": "sm_87"' in (folder / "key.json").read_text()


def test_the_engine_key_follows_model_tensorrt_version_gpu_arch_and_precision(
    trt_bundles: dict[str, Path], tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    dir16, fp16 = _unpacked(trt_bundles["fp16"], keys, tmp_path / "a")
    dir8, int8 = _unpacked(trt_bundles["int8"], keys, tmp_path / "b")
    base = _options(fp16, dir16, tmp_path / "cache")
    key = engines.engine_key(base, ORIN)[0]
    assert engines.engine_key(_options(fp16, dir16, tmp_path / "cache"), ORIN)[0] == key, "a later start: same key"
    changed = {
        "TensorRT upgrade": engines.engine_key(base, engines.Hardware("10.7.0", "sm_87"))[0],
        "another GPU": engines.engine_key(base, engines.Hardware("10.3.0", "sm_86"))[0],
        "another model": engines.engine_key(LoadOptions(**{**base.__dict__, "model_sha256": "0" * 64}), ORIN)[0],
        "INT8 instead of FP16": engines.engine_key(_options(int8, dir8, tmp_path / "cache"), ORIN)[0],
    }
    assert all(other != key for other in changed.values()), changed
    assert len(set(changed.values())) == len(changed)


def test_an_engine_is_built_once_then_reused_and_a_changed_key_rebuilds(
    trt_bundles: dict[str, Path], tmp_path: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle_dir, manifest = _unpacked(trt_bundles["fp16"], keys, tmp_path / "b")
    options = _options(manifest, bundle_dir, tmp_path / "cache")
    monkeypatch.setattr(engines, "probe_hardware", lambda: ORIN)
    backend = backend_for(TRT)
    assert backend.compiles_on_load(TRT, options), "first load: no engine yet"
    folder = engines.prepare_engine_dir(options)
    assert folder is not None
    (folder / "TensorrtExecutionProvider_TRTKernel_graph_main_0_0_sm87.engine").write_bytes(b"engine")
    assert not backend.compiles_on_load(TRT, options), "a later start finds the engine"
    monkeypatch.setattr(engines, "probe_hardware", lambda: engines.Hardware("10.7.0", "sm_87"))
    assert backend.compiles_on_load(TRT, options), "after a TensorRT upgrade the engine is rebuilt"
    assert engines.engine_dir(options) != folder


def test_the_ort_backend_hands_the_tensorrt_ep_those_options_with_cuda_as_fallback(
    trt_bundles: dict[str, Path], tmp_path: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgefleet.agent.runtime.backends import ort as ort_backend

    bundle_dir, manifest = _unpacked(trt_bundles["int8"], keys, tmp_path / "b")
    options = _options(manifest, bundle_dir, tmp_path / "cache")
    monkeypatch.setattr(engines, "probe_hardware", lambda: ORIN)
    seen: dict[str, Any] = {}

    def fake_session(path: str, so: Any, providers: list[Any]) -> None:
        seen.update(path=path, providers=providers)
        raise RuntimeError("no CUDA here")

    monkeypatch.setattr(ort_backend.ort, "InferenceSession", fake_session)
    with pytest.raises(LoadError, match="no CUDA here"):
        backend_for(TRT).load(bundle_dir / manifest.model_path, TRT, options, CancelToken())
    (trt, trt_options), (cuda, cuda_options) = seen["providers"]
    assert (trt, cuda) == (TRT, CUDA) and cuda_options["cudnn_conv_algo_search"] == "HEURISTIC"
    assert trt_options == engines.session_options(options, ORIN)
    assert (Path(trt_options["trt_engine_cache_path"]) / "calibration.flatbuffers").is_file()


class _SlowEngineBackend(Backend):
    """ONNX Runtime on the CPU standing in for an EP whose first load builds an engine (1.5 s), cached on disk."""

    key = "test-slow-engine"
    title = "slow engine"
    formats = ("onnx-tensorrt",)
    known_providers = ("slowengine:0",)

    def claims(self, provider: str) -> bool:
        return provider == "slowengine:0"

    def availability(self, provider: str) -> Availability:
        return Availability.yes("test")

    def version(self, provider: str) -> str:
        return "slow engine 1"

    def _marker(self, options: LoadOptions) -> Path:
        assert options.cache_dir is not None
        return options.cache_dir / "slow-engine" / f"{options.model_sha256}.engine"

    def compiles_on_load(self, provider: str, options: LoadOptions) -> bool:
        return not self._marker(options).exists()

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        import onnxruntime as ort

        if self.compiles_on_load(provider, options):
            time.sleep(1.5)
            self._marker(options).parent.mkdir(parents=True, exist_ok=True)
            self._marker(options).write_bytes(b"engine")
        session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        return OrtSession(session, provider, options.outputs)


def test_an_engine_build_gets_its_own_time_limit_and_the_next_start_is_fast(
    trt_bundles: dict[str, Path], tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    bundle_dir, manifest = _unpacked(trt_bundles["fp16"], keys, tmp_path / "b")
    manifest = manifest.model_copy(update={"providers": ["slowengine:0"]})
    golden = GoldenSet.load(bundle_dir / manifest.golden.path, manifest.inputs, manifest.outputs)
    policy = Policy(load_timeout_s=0.5, engine_build_timeout_s=30)
    with registered(_SlowEngineBackend()):
        started = time.perf_counter()
        first = select(bundle_dir / manifest.model_path, manifest, golden, cache_dir=tmp_path / "c", policy=policy)
        build_s = time.perf_counter() - started
        first.session.close()
        started = time.perf_counter()
        again = select(bundle_dir / manifest.model_path, manifest, golden, cache_dir=tmp_path / "c", policy=policy)
        reuse_s = time.perf_counter() - started
    assert first.choice.provider == again.choice.provider == "slowengine:0" and again.choice.cached
    assert build_s > 1.5 > 0.5 > reuse_s, (build_s, reuse_s)


def test_probes_say_unknown_without_tensorrt_or_a_gpu() -> None:
    hardware = engines.probe_hardware()
    assert isinstance(hardware.tensorrt, str) and isinstance(hardware.gpu_arch, str)
    if not Path("/dev/nvidia0").exists() and not Path("/dev/nvhost-ctrl").exists():
        assert hardware.gpu_arch == "unknown"


def test_a_tensorrt_bundle_without_cuda_is_refused_with_the_reason(
    trt_bundles: dict[str, Path], tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    if agent_backends.availability(TRT, "onnx-tensorrt").ok or agent_backends.availability(CUDA, "onnx").ok:
        pytest.skip("this machine has a TensorRT or CUDA EP")
    manifest = parse(trt_bundles["fp16"])
    with pytest.raises(Refused, match=r"TensorRT bundle needs an NVIDIA GPU .*TensorrtExecutionProvider: onnxruntime"):
        check_runnable(manifest)


def parse(bundle: Path) -> Manifest:
    from edgefleet.core.bundle.archive import parse_manifest

    return parse_manifest(read_signed_manifest(bundle).manifest_json)


StartAgent = Callable[..., AgentProcess]


def test_a_jetson_agent_without_cuda_refuses_before_downloading_and_says_why(
    trt_bundles: dict[str, Path], start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher
) -> None:
    if agent_backends.availability(CUDA, "onnx").ok:
        pytest.skip("this machine has the CUDA EP")
    agent = start_agent("dev-orin", profile="jetson-orin-nano")
    bundle_id = deploy_to(host, topics, trt_bundles["fp16"], devices=("dev-orin",))
    event = watcher.event("dev-orin", "refused", bundle_id=bundle_id)
    assert "TensorRT bundle needs an NVIDIA GPU" in event.detail and "CUDAExecutionProvider" in event.detail
    assert not any(e.kind == "download-started" for e in watcher.events if e.device_id == "dev-orin")
    status = watcher.wait_for("the refusal in the status", lambda: _with_error(watcher.status.get("dev-orin")))
    assert "TensorRT bundle needs an NVIDIA GPU" in (slot_of(status).last_error or "") and agent.alive


def _with_error(status: Any) -> Any:
    return status if status is not None and slot_of(status).last_error else None
