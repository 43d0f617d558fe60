"""A user's metric: `path.py:function`, called as function(reference_outputs, candidate_outputs, labels) and
returning a float, higher is better. Outputs are dicts of output name → numpy array stacked over samples."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

from edgefleet.converter.metrics.base import Metric, Outputs
from edgefleet.core.errors import ConversionError, UserInputError


def load(spec: str) -> Metric:
    path_text, _, function = spec.rpartition(":")
    path = Path(path_text)
    if not path_text.endswith(".py") or not function.isidentifier():
        raise UserInputError(f"--metric {spec!r}: write path/to/file.py:function")
    if not path.is_file():
        raise UserInputError(f"--metric {spec!r}: {path} not found")
    module_spec = importlib.util.spec_from_file_location(f"edgefleet_user_metric_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise UserInputError(f"--metric {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # the user's module may raise anything on import
        raise UserInputError(f"--metric {spec!r}: importing {path.name} failed: {err}") from err
    fn = getattr(module, function, None)
    if not callable(fn):
        raise UserInputError(f"--metric {spec!r}: {path.name} has no function {function!r}")

    def call(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
        try:
            value = float(fn(dict(reference), dict(candidate), labels))
        except Exception as err:  # a user's function failing is that candidate's failure, named
            raise ConversionError(f"the metric {path.name}:{function} failed: {err}") from err
        if math.isnan(value):
            raise ConversionError(f"the metric {path.name}:{function} returned NaN")
        return value

    return Metric(f"{path.name}:{function}", call, f"user metric {function} from {path.name}", uses_labels=True)
