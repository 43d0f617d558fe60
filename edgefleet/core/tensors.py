"""Tensor datasets (.npz) and input validation against a model's signature.

Data format: one key per model input, axis 0 indexes samples and `arr[i]` is fed to the model as is
(it keeps its own batch dimension); an optional key `labels` holds each sample's expected class.
Files are always loaded with allow_pickle=False.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.errors import DataError

LABELS_KEY = "labels"


def is_string_dtype(dtype: str) -> bool:
    """A string tensor (ONNX `tensor(string)`): its spec says object; text arrays of any numpy kind fit it."""
    return np.dtype(dtype).kind in "OUS"


def check_tensor(spec: TensorSpec, value: np.ndarray, where: str = "input") -> None:
    """Raise DataError when `value` does not fit `spec` (dtype, rank, fixed dimensions)."""
    if value.dtype != np.dtype(spec.dtype) and not (is_string_dtype(spec.dtype) and value.dtype.kind in "OUS"):
        raise DataError(f"{where} {spec.name!r}: dtype {value.dtype} but the model wants {spec.dtype}")
    if len(value.shape) != len(spec.shape):
        raise DataError(
            f"{where} {spec.name!r}: shape {list(value.shape)} has rank {value.ndim}, the model wants {spec.shape}"
        )
    for axis, (got, want) in enumerate(zip(value.shape, spec.shape, strict=True)):
        if isinstance(want, int) and want >= 0 and got != want:
            raise DataError(
                f"{where} {spec.name!r}: dimension {axis} is {got}, the model wants {want} (shape {spec.shape})"
            )


def check_inputs(specs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray]) -> None:
    wanted = {spec.name for spec in specs}
    missing, extra = sorted(wanted - set(feeds)), sorted(set(feeds) - wanted)
    if missing or extra:
        raise DataError(
            f"inputs do not match the model: missing {missing or 'none'}, unexpected {extra or 'none'}; "
            f"the model takes {sorted(wanted)}"
        )
    for spec in specs:
        check_tensor(spec, feeds[spec.name])


@dataclass(frozen=True)
class Dataset:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def sample(self, index: int) -> dict[str, np.ndarray]:
        # np.asarray: indexing a 1-d array gives a numpy scalar, which runtimes refuse for 0-d inputs.
        return {name: np.asarray(array[index]) for name, array in self.inputs.items()}

    def samples(self) -> Iterator[dict[str, np.ndarray]]:
        for index in range(len(self)):
            yield self.sample(index)

    def head(self, count: int) -> Dataset:
        labels = None if self.labels is None else self.labels[:count]
        return Dataset({k: v[:count] for k, v in self.inputs.items()}, labels)


def load_dataset(path: Path, specs: Sequence[TensorSpec], role: str = "data") -> Dataset:
    """Load an .npz dataset and check it against the model's inputs; one clear DataError if it does not fit."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a single .npy array: no names to match inputs to
            raise DataError(
                f"{role} file {path} is one array (.npy), not an .npz with one array per model input: "
                f"np.savez(FILE, {', '.join(f'{s.name}=...' for s in specs) or 'INPUT=...'})"
            )
        with loaded as archive:
            arrays = {key: archive[key] for key in archive.files}
    except FileNotFoundError as err:
        raise DataError(f"{role} file {path} not found") from err
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise DataError(f"{role} file {path} is not a readable .npz without pickles: {err}") from err
    labels = arrays.pop(LABELS_KEY, None)
    names = {spec.name for spec in specs}
    missing = sorted(names - set(arrays))
    if missing:
        raise DataError(f"{role} file {path} lacks model input(s) {missing}; it has {sorted(arrays) or 'no arrays'}")
    inputs = {spec.name: arrays[spec.name] for spec in specs}
    counts = {name: len(array) if array.ndim else 0 for name, array in inputs.items()}
    if len(set(counts.values())) != 1:
        raise DataError(f"{role} file {path}: inputs hold different sample counts {counts}")
    count = next(iter(counts.values()))
    if count == 0:
        raise DataError(f"{role} file {path} holds no samples")
    for spec in specs:
        try:
            check_tensor(spec, inputs[spec.name][0], where=f"{role} sample 0, input")
        except DataError as err:
            raise DataError(f"{path}: {err}") from err
    if labels is not None:
        labels = np.asarray(labels)
        if labels.shape != (count,) or not np.issubdtype(labels.dtype, np.integer):
            raise DataError(
                f"{role} file {path}: 'labels' must be {count} integers, got {labels.dtype} {list(labels.shape)}"
            )
    return Dataset(inputs, labels)


def run_samples(
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], dataset: Dataset
) -> dict[str, np.ndarray]:
    """Feed every sample through `run` and stack each output along a new axis 0."""
    collected: dict[str, list[np.ndarray]] = {}
    for feeds in dataset.samples():
        for name, value in run(feeds).items():
            collected.setdefault(name, []).append(value)
    return {name: np.stack(values) for name, values in collected.items()}
