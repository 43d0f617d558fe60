"""Helpers shared by the runtime, selection and service tests (this module holds no tests).

Bundles come from the session's `demo_bundles` (the real converter) unpacked with the real verifier;
the test backends below wrap a real ONNX Runtime session and add only the fault a real runtime cannot
be made to produce on demand (a load that hangs, a load that fails, outputs that drift, a slow call).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgefleet.agent.runtime.backends import Availability, Backend, CancelToken, LoadError, LoadOptions, Session
from edgefleet.agent.runtime.backends.ort import OrtSession
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.core.bundle.archive import MANIFEST_NAME, unpack_bundle
from edgefleet.core.bundle.manifest import Manifest, TensorSpec
from edgefleet.core.quality.golden import GoldenSet
from edgefleet.core.trust.signing import TrustedKeys

from support.paths import DIGITS

DIGITS_MODEL = DIGITS / "digits_cnn.onnx"


class ModelWrapper:
    """A real model (agent.runtime.LoadedModel) seen through the service's ServedModel interface; tests subclass
    it to observe or hold calls, and `run` delegates."""

    def __init__(self, inner: LoadedModel) -> None:
        self.inner = inner
        self.manifest = inner.manifest

    @property
    def bundle_id(self) -> str:
        return self.inner.bundle_id

    @property
    def provider(self) -> str:
        return self.inner.provider

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.inner.run(feeds)


def unpack(bundle: Path, public_key: Path, dest: Path) -> tuple[Path, Manifest]:
    """A verified bundle directory, like the agent's store holds (manifest.json beside the files)."""
    manifest = unpack_bundle(bundle, dest, TrustedKeys.load([public_key]))
    (dest / MANIFEST_NAME).write_text(manifest.model_dump_json())
    return dest, manifest


def with_providers(manifest: Manifest, *providers: str) -> Manifest:
    return manifest.model_copy(update={"providers": list(providers)})


def symbolic_batch(bundle_dir: Path, manifest: Manifest, dest: Path) -> tuple[Path, Manifest]:
    """The digits model with a symbolic batch dimension "N" (the CNN itself works for any batch)."""
    import onnx

    model = onnx.load(str(DIGITS_MODEL))  # the source model: the converter folds Flatten into a fixed Reshape
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    dest.mkdir(parents=True)
    (dest / "model").mkdir()
    onnx.save(model, str(dest / manifest.model_path))
    (dest / manifest.golden.path).write_bytes((bundle_dir / manifest.golden.path).read_bytes())
    dynamic = manifest.model_copy(
        update={
            "bundle_id": manifest.bundle_id + "-dyn",
            "model_name": "digits-dyn",
            "inputs": [TensorSpec(name="input", dtype="float32", shape=["N", 1, 8, 8])],
            "outputs": [TensorSpec(name="logits", dtype="float32", shape=["N", 10])],
        }
    )
    return dest, dynamic


def golden(bundle_dir: Path, manifest: Manifest) -> GoldenSet:
    return GoldenSet.load(bundle_dir / manifest.golden.path, manifest.inputs, manifest.outputs)


class _Wrapped(Session):
    """A real ORT session with an injected fault on `run`."""

    def __init__(self, inner: Session, provider: str, backend: FaultBackend) -> None:
        self._inner, self.provider, self.output_names, self._backend = inner, provider, inner.output_names, backend

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        backend = self._backend
        if backend.gate is not None:
            backend.waiting += 1
            backend.gate.wait(10)
        if backend.run_delay_s:
            end = time.perf_counter() + backend.run_delay_s
            while time.perf_counter() < end:  # busy: a slower runtime, not a sleeping one
                pass
        outputs = self._inner.run(feeds)
        if backend.drift:
            outputs = {k: v + np.float32(backend.drift) for k, v in outputs.items()}
        return outputs


class FaultBackend(Backend):
    """Provider names "fault:<anything>": a real ORT CPU session plus the faults asked for."""

    title = "fault injection (tests)"
    formats = ("onnx",)
    known_providers = ("fault:A",)

    def __init__(
        self,
        key: str = "fault",
        *,
        hang_s: float = 0.0,
        fail: str = "",
        drift: float = 0.0,
        run_delay_s: float = 0.0,
        available: bool = True,
        runtime_version: str = "1.0",
    ) -> None:
        self.key = key  # type: ignore[misc]
        self.hang_s, self.fail, self.drift, self.run_delay_s = hang_s, fail, drift, run_delay_s
        self.available, self.runtime_version = available, runtime_version
        self.loads = 0
        self.gate: threading.Event | None = None
        self.waiting = 0
        self.cancelled = threading.Event()

    def claims(self, provider: str) -> bool:
        return provider.startswith(self.key + ":")

    def availability(self, provider: str) -> Availability:
        return Availability.yes("test") if self.available else Availability.no("switched off by the test")

    def version(self, provider: str) -> str:
        return f"fault {self.runtime_version}"

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        self.loads += 1
        cancel.on_cancel(self.cancelled.set)
        if self.hang_s:
            self.cancelled.wait(self.hang_s)  # a load stuck in a native call, until cancelled or done
        if self.fail:
            raise LoadError(self.fail)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        return _Wrapped(OrtSession(session, "CPUExecutionProvider", options.outputs), provider, self)
