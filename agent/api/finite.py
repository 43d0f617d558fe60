"""JSON has no NaN or Infinity: an output holding them is refused in a JSON answer, naming the output and the binary
format that carries it as it is (Python's json would write the invalid tokens `NaN` and `Infinity`)."""

from __future__ import annotations

import numpy as np

from edgefleet.agent.api.errors import RequestError


def check_json_output(name: str, array: np.ndarray, binary: str) -> None:
    """RequestError 406 when the floating output `name` holds a non-finite value; `binary` says how to ask for it
    in a format that can carry it."""
    if array.dtype.kind in "fc" and not np.isfinite(array).all():
        raise RequestError(
            406, "bad-request", f"output {name!r} holds NaN or Infinity, which JSON cannot carry; {binary}"
        )


__all__ = ["check_json_output"]
