"""The golden set as data: a few inputs with the FP32 reference outputs and the candidate's own outputs on them
(`golden.npz` in the bundle). Checking a model against it is edgefleet.core.quality.golden."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.errors import BundleError
from edgefleet.core.tensors import LABELS_KEY, Dataset

_REFERENCE, _EXPECTED = "reference/", "expected/"
# Deflate's fastest level: a golden set of float maps (u2netp's 7 outputs, reference and expected, 17 samples: 118 MB)
# deflates in 1.7 s to 64 MB, where numpy's savez_compressed (level 6) takes 7.6 s for 61 MB. Any level loads alike.
_DEFLATE_LEVEL = 1


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
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=_DEFLATE_LEVEL) as archive:
            for name, values in arrays.items():  # the layout np.savez writes: NAME.npy per array
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(values), allow_pickle=False)

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


__all__ = ["GoldenSet"]
