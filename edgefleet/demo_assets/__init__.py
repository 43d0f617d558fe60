"""The demo model and its data, shipped as package data so `edgefleet demo` runs from an installed wheel.

`digits_cnn.onnx`, `calib.npz` and `eval.npz` are made by `models/digits/train.py` (which writes here;
`models/digits/` links to these files so the paths in the docs and benches keep working).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from edgefleet.core.errors import EdgefleetError

MODEL, CALIB, EVAL = "digits_cnn.onnx", "calib.npz", "eval.npz"


def asset(name: str) -> Path:
    """The path of one demo asset on disk, or an error naming what is missing from the install."""
    if name not in (MODEL, CALIB, EVAL):
        raise EdgefleetError(f"unknown demo asset {name!r}; valid: {MODEL}, {CALIB}, {EVAL}")
    path = Path(str(resources.files(__name__).joinpath(name)))
    if not path.is_file():
        raise EdgefleetError(
            f"the demo asset {name} is missing from this install ({path}); reinstall edgefleet, or run "
            "models/digits/train.py to make it again"
        )
    return path
