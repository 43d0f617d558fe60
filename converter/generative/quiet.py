"""Running a third-party builder without its prints, progress bars and warnings on the user's terminal: its stdout
and stderr (Python's and the C++ side's file descriptors) go to a file, whose tail goes into the error if it fails;
its Python warnings (torch.jit's deprecations under openvino.convert_model, transformers') are dropped."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

__all__ = ["BuildFailed", "quiet"]

TAIL_CHARS = 240


class BuildFailed(RuntimeError):
    """A builder failed; the message carries the last lines it printed."""


@contextlib.contextmanager
def quiet(what: str) -> Iterator[None]:
    """Silence `what`'s output; on an exception, raise BuildFailed with its cause and the output's tail."""
    with tempfile.TemporaryFile(mode="w+b") as log:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            with (
                contextlib.redirect_stdout(sys.__stdout__ or io.StringIO()),
                contextlib.redirect_stderr(sys.__stderr__ or io.StringIO()),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("ignore")
                yield
        except Exception as err:
            log.seek(0)
            tail = log.read().decode("utf-8", "replace")[-TAIL_CHARS:].strip()
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise BuildFailed(f"{what} failed: {first}" + (f" (its output ended: {tail!r})" if tail else "")) from err
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
