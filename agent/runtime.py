"""Loading a verified bundle into ONNX Runtime, checking it against its golden set, running it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgefleet.core.errors import BundleError
from edgefleet.core.golden import GoldenResult, GoldenSet, compare
from edgefleet.core.manifest import Manifest
from edgefleet.core.tensors import check_inputs, run_samples

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProviderChoice:
    provider: str
    reasons: dict[str, str]  # provider -> why it was not used


def choose_provider(allowed: list[str], available: list[str]) -> ProviderChoice:
    """The first provider the bundle allows that this machine has (measurement-based choice comes later)."""
    reasons = {p: "not available on this device" for p in allowed if p not in available}
    usable = [p for p in allowed if p in available]
    if not usable:
        raise BundleError(f"none of the bundle's providers {allowed} is available here (have {available})")
    for later in usable[1:]:
        reasons[later] = f"lower in the bundle's preference order than {usable[0]}"
    return ProviderChoice(usable[0], reasons)


class LoadedModel:
    """One bundle loaded into a runtime session. `run` is safe to call from several threads."""

    def __init__(self, bundle_dir: Path, manifest: Manifest, threads: int = 0) -> None:
        if manifest.format != "onnx":
            raise BundleError(f"bundle format {manifest.format!r} is not supported by this agent yet")
        self.bundle_dir, self.manifest = bundle_dir, manifest
        self.choice = choose_provider(manifest.providers, ort.get_available_providers())
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        start = time.perf_counter()
        try:
            self._session = ort.InferenceSession(
                str(bundle_dir / manifest.model_path), options, providers=[self.choice.provider]
            )
        except Exception as err:  # onnxruntime raises its own untyped exceptions
            raise BundleError(f"onnxruntime cannot load the model: {err}") from err
        self.load_ms = (time.perf_counter() - start) * 1000
        self._outputs = [o.name for o in self._session.get_outputs()]
        self._lock = threading.Lock()
        self.golden = GoldenSet.load(bundle_dir / manifest.golden.path, manifest.inputs, manifest.outputs)
        self.last_golden: GoldenResult | None = None

    @property
    def bundle_id(self) -> str:
        return self.manifest.bundle_id

    @property
    def provider(self) -> str:
        return self.choice.provider

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validated inference: wrong names, dtypes or shapes raise DataError before the runtime sees them."""
        check_inputs(self.manifest.inputs, feeds)
        return self._run(feeds)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self._session.run(self._outputs, feeds), strict=True))

    def check_golden(self, warmup: int = 3) -> GoldenResult:
        """Warm up, then re-run the golden inputs and judge them against the bundle's expectations."""
        try:
            for _ in range(warmup):
                self._run(self.golden.inputs.sample(0))
            outputs = run_samples(self._run, self.golden.inputs)
        except Exception as err:  # a runtime failure on golden inputs is a failed check, not a crash
            result = GoldenResult(0.0, float("inf"), False, f"inference failed on the golden set: {err}")
        else:
            result = compare(outputs, self.golden, self.manifest.golden)
        self.last_golden = result
        return result
