"""Run third-party code that litters the working directory from a throwaway one instead.

onnxruntime's symbolic shape inference saves `sym_shape_infer_temp.onnx` plus uuid-named external-data
files into the current directory whenever inference is incomplete (which it is for many real graphs):
a user's `edgefleet convert` must not leave those in their project.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def scratch_cwd() -> Iterator[None]:
    """The converter is single-threaded while it prepares models, so a process-wide chdir is safe here."""
    with tempfile.TemporaryDirectory(prefix="edgefleet-scratch-") as scratch:
        previous = os.getcwd()
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(previous)
