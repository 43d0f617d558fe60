"""The golden set as the bundle carries it: inputs, labels, the FP32 reference and the build's own outputs, in an
archive numpy loads (edgefleet.core.quality.golden_set)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.errors import BundleError
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.tensors import Dataset

RNG = np.random.default_rng(3)


def _spec(name: str) -> TensorSpec:
    return TensorSpec(name=name, dtype="float32", shape=[1, 4])


def test_a_saved_golden_set_loads_back_as_it_was_deflated_as_numpy_writes_it(tmp_path: Path) -> None:
    golden = GoldenSet(
        Dataset({"x": RNG.normal(size=(5, 1, 4)).astype(np.float32)}, np.arange(5)),
        {"y": RNG.uniform(size=(5, 1, 4)).astype(np.float32)},
        {"y": RNG.uniform(size=(5, 1, 4)).astype(np.float32)},
    )
    path = tmp_path / "golden.npz"
    golden.save(path)
    with zipfile.ZipFile(path) as archive:  # numpy's own layout: one NAME.npy per array, deflated
        assert {i.compress_type for i in archive.infolist()} == {zipfile.ZIP_DEFLATED}
        assert sorted(archive.namelist()) == ["expected/y.npy", "labels.npy", "reference/y.npy", "x.npy"]
    loaded = GoldenSet.load(path, [_spec("x")], [_spec("y")])
    assert np.array_equal(loaded.inputs.inputs["x"], golden.inputs.inputs["x"])
    assert np.array_equal(loaded.inputs.labels, golden.inputs.labels)  # type: ignore[arg-type]
    assert np.array_equal(loaded.reference["y"], golden.reference["y"])
    assert np.array_equal(loaded.expected["y"], golden.expected["y"])


def test_a_golden_set_lacking_an_output_is_refused_by_name(tmp_path: Path) -> None:
    golden = GoldenSet(Dataset({"x": np.zeros((1, 1, 4), np.float32)}, None), {}, {})
    golden.save(tmp_path / "golden.npz")
    with pytest.raises(BundleError, match="lacks 'reference/y'"):
        GoldenSet.load(tmp_path / "golden.npz", [_spec("x")], [_spec("y")])
