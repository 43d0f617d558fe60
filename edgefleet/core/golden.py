"""The golden set: a few inputs with the FP32 reference outputs, re-run on the device before commit.

Stored as an .npz (no pickles): one key per model input, `labels` when known, `reference/<output>`
(the FP32 source model's outputs) and `expected/<output>` (this bundle's own outputs at build time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.core.errors import BundleError
from edgefleet.core.manifest import GoldenSpec, TensorSpec
from edgefleet.core.tensors import LABELS_KEY, Dataset

_REFERENCE, _EXPECTED = "reference/", "expected/"


@dataclass(frozen=True)
class GoldenSet:
    inputs: Dataset
    reference: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]

    def save(self, path: Path) -> None:
        arrays: dict[str, np.ndarray] = dict(self.inputs.inputs)
        if self.inputs.labels is not None:
            arrays[LABELS_KEY] = self.inputs.labels
        arrays.update({_REFERENCE + k: v for k, v in self.reference.items()})
        arrays.update({_EXPECTED + k: v for k, v in self.expected.items()})
        with path.open("wb") as handle:
            np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: Path, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> GoldenSet:
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {key: archive[key] for key in archive.files}
        except (OSError, ValueError) as err:
            raise BundleError(f"golden set {path.name} is unreadable: {err}") from err
        try:
            feeds = {spec.name: arrays[spec.name] for spec in inputs}
            reference = {spec.name: arrays[_REFERENCE + spec.name] for spec in outputs}
            expected = {spec.name: arrays[_EXPECTED + spec.name] for spec in outputs}
        except KeyError as err:
            raise BundleError(f"golden set lacks {err.args[0]!r}") from err
        return cls(Dataset(feeds, arrays.get(LABELS_KEY)), reference, expected)


@dataclass(frozen=True)
class GoldenResult:
    agreement: float
    max_abs_error: float
    passed: bool
    reason: str


def argmax_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Share of samples whose top class matches; outputs are (samples, *model output shape)."""
    if outputs.shape != reference.shape:
        return 0.0
    flat_out = outputs.reshape(len(outputs), -1)
    flat_ref = reference.reshape(len(reference), -1)
    return float(np.mean(flat_out.argmax(axis=1) == flat_ref.argmax(axis=1)))


def compare(outputs: Mapping[str, np.ndarray], golden: GoldenSet, spec: GoldenSpec) -> GoldenResult:
    """Judge a device's outputs on the golden inputs against the bundle's expectations."""
    first = next(iter(golden.reference))
    got = outputs.get(first)
    if got is None or got.shape != golden.expected[first].shape:
        shape = None if got is None else list(got.shape)
        return GoldenResult(
            0.0,
            float("inf"),
            False,
            f"output {first!r} has shape {shape}, expected {list(golden.expected[first].shape)}",
        )
    agreement = argmax_agreement(got, golden.reference[first])
    errors = [
        float(np.max(np.abs(outputs[name].astype(np.float64) - expected.astype(np.float64))))
        for name, expected in golden.expected.items()
        if name in outputs and outputs[name].shape == expected.shape
    ]
    max_abs = max(errors) if len(errors) == len(golden.expected) else float("inf")
    if not np.isfinite(max_abs) or max_abs > spec.max_abs_error:
        return GoldenResult(
            agreement, max_abs, False, f"max |error| {max_abs:.3g} exceeds the tolerance {spec.max_abs_error:.3g}"
        )
    if agreement < spec.min_agreement:
        return GoldenResult(
            agreement, max_abs, False, f"argmax agreement {agreement:.3f} is below {spec.min_agreement:.3f}"
        )
    return GoldenResult(agreement, max_abs, True, f"agreement {agreement:.3f}, max |error| {max_abs:.3g}")
