"""Datasets and input validation: one clear error for data that does not fit the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgefleet.core.bundle.manifest import TensorSpec
from edgefleet.core.errors import DataError
from edgefleet.core.tensors import check_inputs, load_dataset

SPEC = [TensorSpec(name="input", dtype="float32", shape=[1, 1, 8, 8])]
DYNAMIC = [TensorSpec(name="image", dtype="float32", shape=["batch", 3, "h", "w"])]


def _npz(tmp_path: Path, **arrays: np.ndarray) -> Path:
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_a_well_formed_dataset_loads_with_labels(tmp_path: Path) -> None:
    data = load_dataset(_npz(tmp_path, input=np.zeros((5, 1, 1, 8, 8), np.float32), labels=np.arange(5)), SPEC)
    assert len(data) == 5 and data.sample(2)["input"].shape == (1, 1, 8, 8)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((2, 1, 1, 8, 8), np.float32)}, r"lacks model input\(s\) \['input'\]; it has \['x'\]"),
        ({"input": np.zeros((2, 1, 1, 8, 8), np.float64)}, "dtype float64 but the model wants float32"),
        ({"input": np.zeros((2, 1, 8, 8), np.float32)}, "rank 3"),
        ({"input": np.zeros((2, 1, 1, 8, 9), np.float32)}, "dimension 3 is 9, the model wants 8"),
        ({"input": np.zeros((0, 1, 1, 8, 8), np.float32)}, "holds no samples"),
        (
            {"input": np.zeros((2, 1, 1, 8, 8), np.float32), "labels": np.zeros(3, np.int64)},
            "'labels' must be 2 integers",
        ),
    ],
)
def test_data_that_does_not_fit_is_refused(tmp_path: Path, arrays: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        load_dataset(_npz(tmp_path, **arrays), SPEC)


def test_pickled_arrays_are_never_loaded(tmp_path: Path) -> None:
    path = _npz(tmp_path, input=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(DataError, match="without pickles"):
        load_dataset(path, SPEC)


def test_a_file_that_is_not_npz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    path.write_text("hello")
    with pytest.raises(DataError, match=r"not a readable \.npz"):
        load_dataset(path, SPEC)


def test_symbolic_dimensions_accept_any_size() -> None:
    check_inputs(DYNAMIC, {"image": np.zeros((2, 3, 17, 31), np.float32)})
    with pytest.raises(DataError, match="dimension 1 is 4"):
        check_inputs(DYNAMIC, {"image": np.zeros((2, 4, 17, 31), np.float32)})


def test_wrong_input_names_list_what_the_model_takes() -> None:
    with pytest.raises(DataError, match=r"missing \['input'\], unexpected \['img'\]"):
        check_inputs(SPEC, {"img": np.zeros((1, 1, 8, 8), np.float32)})
