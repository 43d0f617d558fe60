"""A verified bundle loaded on the provider chosen by measurement, checked against its golden set, run.

The runtimes live in `agent/backends/` (one file each); the choice of provider in `agent/runtime/selection/selector.py`.
A generative bundle is loaded as a `GenerativeModel` (agent/runtime/generative/) that this model holds: the same
install path (load, golden check, commit or roll back, health) then serves it, and `generative` is how the API
reaches its generation.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.agent.runtime import custom_ops
from edgefleet.agent.runtime.backends import Session
from edgefleet.agent.runtime.generative import GenerativeModel
from edgefleet.agent.runtime.selection import warm_start as selection_prestart
from edgefleet.agent.runtime.selection.selector import NoProviderError, Policy, ProviderChoice, Selected, select
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import BundleError, DataError
from edgefleet.core.quality.golden import GoldenResult, GoldenSet, compare
from edgefleet.core.tensors import check_inputs, run_samples

log = logging.getLogger(__name__)


class LoadedModel:
    """One bundle loaded into a runtime session. `run` is safe to call from several threads at once.

    `cache_dir` (the agent's STATE_DIR/cache) holds the provider decision cache and the runtimes'
    compiled blobs (OpenVINO blobs, TensorRT engines); without it every load measures again and nothing is
    cached. A bundle with custom operators is loaded with this device's implementations (agent/runtime/custom_ops.py).
    `load_ms` is the time from the call to a model ready to serve, the provider choice included.
    """

    def __init__(
        self,
        bundle_dir: Path,
        manifest: Manifest,
        threads: int = 0,
        *,
        cache_dir: Path | None = None,
        policy: Policy | None = None,
    ) -> None:
        start = time.perf_counter()
        self.bundle_dir, self.manifest = bundle_dir, manifest
        self.generative: GenerativeModel | None = None
        self._golden: GoldenSet | None = None
        if manifest.generation is not None:
            self.generative = _load_generative(bundle_dir, manifest, threads, policy)
            self._session: Session = self.generative.session
            self.choice: ProviderChoice = self.generative.choice
            self.selection_golden: GoldenResult = self.generative.selection_golden
        else:
            self._golden = GoldenSet.load(bundle_dir / manifest.golden.path, manifest.inputs, manifest.outputs)
            selected = _select(bundle_dir, manifest, self._golden, threads, cache_dir, policy)
            self._session = selected.session
            self.choice = selected.choice
            self.selection_golden = selected.golden  # the chosen provider's golden run during selection
        self.last_golden: GoldenResult | None = None
        self._checks = _compile_checks(manifest)
        self._finite = _finite_inputs(manifest)  # floating inputs that must hold finite numbers only
        self.load_ms = (time.perf_counter() - start) * 1000

    @property
    def bundle_id(self) -> str:
        return self.manifest.bundle_id

    @property
    def golden(self) -> GoldenSet:
        """The golden set of a tensor model (a generative model has golden prompts: `generative.golden`)."""
        if self._golden is None:
            raise BundleError(f"bundle {self.bundle_id} is generative: it has golden prompts, not a golden set")
        return self._golden

    @property
    def provider(self) -> str:
        return self.choice.provider

    @property
    def session(self) -> Session:
        return self._session

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validated inference: wrong names, dtypes or shapes raise DataError before the runtime sees them."""
        self.check(feeds)
        return self._session.run(feeds)

    def run_checked(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inference on input `check` accepted (or several such inputs joined along the batch: agent/schedule/)."""
        return self._session.run(feeds)

    def check(self, feeds: dict[str, np.ndarray]) -> None:
        """Raise DataError when `run` would refuse `feeds` (names, dtypes, shapes, non-finite values)."""
        if self.generative is not None:
            raise DataError(
                f"{self.manifest.model_name} is a generative model: use its generate endpoints "
                f"(POST /v2/models/{self.manifest.model_name}/generate, /v1/completions, /v1/chat/completions)"
            )
        if not self._fits(feeds):
            for name, value in feeds.items():
                if not isinstance(value, np.ndarray):
                    raise DataError(f"input {name!r} is a {type(value).__name__}, not a numpy array")
            check_inputs(self.manifest.inputs, feeds)  # raises DataError with the precise reason
        for name in self._finite:
            value = feeds[name]
            # A finite sum means no NaN or Infinity (either makes the sum non-finite): one reduction, no copy. Only
            # a non-finite sum (or one that overflowed) pays for the element-wise check.
            if not math.isfinite(value.sum()) and not np.isfinite(value).all():
                raise DataError(
                    f"input {name!r} holds NaN or Infinity, and the model does not declare that it takes them"
                )

    def _fits(self, feeds: dict[str, np.ndarray]) -> bool:
        """The same rules as check_inputs, precompiled: it runs on every request, so it must be cheap."""
        if len(feeds) != len(self._checks):
            return False
        for name, dtype, rank, fixed in self._checks:
            value = feeds.get(name)
            if type(value) is not np.ndarray or value.dtype != dtype or value.ndim != rank:
                return False
            shape = value.shape
            for axis, size in fixed:
                if shape[axis] != size:
                    return False
        return True

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._session.run(feeds)

    def check_golden(self, warmup: int = 3) -> GoldenResult:
        """Warm up, then re-run the golden inputs and judge them against the bundle's expectations (a generative
        model: its golden prompts, agent/runtime/generative/golden.py)."""
        if self.generative is not None:
            self.last_golden = self.generative.check_golden()
            return self.last_golden
        try:
            for _ in range(warmup):
                self._run(self.golden.inputs.sample(0))
            outputs = run_samples(self._run, self.golden.inputs)
        except Exception as err:  # a runtime failure on golden inputs is a failed check, not a crash
            result = GoldenResult(0.0, float("inf"), False, f"inference failed on the golden set: {err}")
        else:
            result = compare(outputs, self.golden, self.manifest.golden, self.manifest.search)
        self.last_golden = result
        return result

    def drain(self, timeout_s: float) -> int:
        """Before closing a replaced model: let its generations in flight finish for up to `timeout_s`, then cut the
        rest (returns how many were cut; a tensor model has none)."""
        return self.generative.drain(timeout_s) if self.generative is not None else 0

    def close(self) -> None:
        """Release the runtime session (only once no request can still reach this model)."""
        if self.generative is not None:
            self.generative.close()
            return
        self._session.close()


def _select(
    bundle_dir: Path, manifest: Manifest, golden: GoldenSet, threads: int, cache_dir: Path | None, policy: Policy | None
) -> Selected:
    try:
        work = (cache_dir or bundle_dir.parent / ".edgefleet-cache") / "custom-ops"
        prepared = custom_ops.prepare(bundle_dir / manifest.model_path, manifest, work)
        return select(
            prepared.model_path,
            manifest,
            golden,
            threads=threads,
            cache_dir=cache_dir,
            policy=policy,
            bundle_dir=bundle_dir,
            custom_op_libraries=prepared.libraries,
        )
    except BundleError:  # NoProviderError included: the message says why each provider was not usable
        raise
    except Exception as err:  # a bug or an unexpected runtime failure refuses the bundle, not the agent
        raise BundleError(f"cannot load the model: {type(err).__name__}: {err}") from err


def _load_generative(bundle_dir: Path, manifest: Manifest, threads: int, policy: Policy | None) -> GenerativeModel:
    try:
        return GenerativeModel(bundle_dir, manifest, threads, policy=policy)
    except BundleError:
        raise
    except Exception as err:  # a bug or an unexpected runtime failure refuses the bundle, not the agent
        raise BundleError(f"cannot load the generative model: {type(err).__name__}: {err}") from err


def _compile_checks(manifest: Manifest) -> list[tuple[str, np.dtype[Any], int, tuple[tuple[int, int], ...]]]:
    return [
        (
            spec.name,
            np.dtype(spec.dtype),
            len(spec.shape),
            tuple((axis, dim) for axis, dim in enumerate(spec.shape) if isinstance(dim, int) and dim >= 0),
        )
        for spec in manifest.inputs
    ]


def _finite_inputs(manifest: Manifest) -> tuple[str, ...]:
    """Floating inputs the model does not declare `non_finite`: NaN and Infinity in them are refused."""
    return tuple(
        spec.name
        for spec in manifest.inputs
        if not spec.non_finite and np.issubdtype(np.dtype(spec.dtype), np.floating)
    )


__all__ = ["LoadedModel", "NoProviderError", "Policy", "ProviderChoice"]


@dataclass(frozen=True)
class RuntimeOptions:
    """How this device loads bundles: inference threads, where caches live, the provider policy."""

    threads: int = 0
    cache_dir: Path | None = None
    policy: Policy | None = None

    def load(self, bundle_dir: Path, manifest: Manifest) -> LoadedModel:
        return LoadedModel(bundle_dir, manifest, self.threads, cache_dir=self.cache_dir, policy=self.policy)

    def prestart(self, manifest: Manifest) -> bool:
        """Start the measuring worker `load` will need for this bundle (if any) now, e.g. before its download."""
        if manifest.generative:  # measured in the agent's process (agent/runtime/generative/selection.py)
            return False
        return selection_prestart.prestart(manifest, self.threads, self.policy, self.cache_dir)
