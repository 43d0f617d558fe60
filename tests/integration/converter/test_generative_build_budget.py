"""A language model's builds under the time budget: each in its own process, stopped at the deadline of the budget's
build share, never started after it, and the same artifact as a build in the converter's own process."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from edgefleet.converter import deadline
from edgefleet.converter.generative.builders import Artifact, Builder
from edgefleet.converter.generative.builders.process import CHILD
from edgefleet.converter.generative.candidates import BuildRecipe
from edgefleet.converter.generative.source import DecoderSource, load_decoder
from edgefleet.converter.generative.text import load_text

from support.models.generative import CALIB, HELDOUT, MODEL_DIR

OV_EXPORT = BuildRecipe(key="ov-fp32", method="ov-export", params={"weights": "f32"}, needs=("hf",))
ORT_INT4 = BuildRecipe(
    key="ort-int4-rtn", method="ort-builder", needs=("hf",),
    params={"execution_provider": "cpu", "precision": "int4", "algo_config": "rtn", "block_size": 32},
)  # fmt: skip
Tinylm = tuple[DecoderSource, list[np.ndarray]]


@pytest.fixture(scope="module")
def tinylm() -> Tinylm:
    source = load_decoder(MODEL_DIR)
    text = load_text(source.path / "tokenizer.json", CALIB, HELDOUT, source.context_length)
    return source, text.calibration()


def _build(
    tinylm: Tinylm, work: Path, recipe: BuildRecipe, *, isolate: bool, within_s: float | None
) -> tuple[Artifact, list[deadline.Cut]]:
    source, calibration = tinylm
    builder = Builder(source, calibration, work, threads=1, isolate=isolate)
    at = None if within_s is None else time.monotonic() + within_s
    with deadline.recording_cuts() as cuts, deadline.until(at, within_s or 0.0):
        return builder.build(recipe), cuts


def test_a_build_still_running_at_the_deadline_is_stopped_and_leaves_nothing(tinylm: Tinylm, tmp_path: Path) -> None:
    """The OpenVINO export takes seconds (its process alone imports torch and OpenVINO): stopped after one."""
    started = time.monotonic()
    artifact, cuts = _build(tinylm, tmp_path, OV_EXPORT, isolate=True, within_s=1.0)
    assert artifact.folder is None and artifact.error is not None
    assert artifact.error.startswith("stopped after 1 s: the time budget's share for builds ran out"), artifact.error
    assert [c.what for c in cuts] == ["ov-fp32"] and cuts[0].how == artifact.error
    assert time.monotonic() - started < 15, "stopped at the deadline, not when it would have finished"
    assert list(tmp_path.iterdir()) == [], "neither the half-built folder nor the build's order is left"
    builds = [p for p in psutil.Process().children(recursive=True) if CHILD in " ".join(_cmdline(p))]
    assert builds == [], "the build's process is gone"  # (the worker's own brokers may be its children too)


def test_a_build_that_would_start_after_the_deadline_is_not_started(tinylm: Tinylm, tmp_path: Path) -> None:
    artifact, cuts = _build(tinylm, tmp_path, ORT_INT4, isolate=True, within_s=-1.0)
    assert artifact.folder is None and artifact.seconds == 0.0
    assert artifact.error == "not built: the time budget's share for builds was spent before it started"
    assert cuts == [deadline.Cut("ort-int4-rtn", artifact.error)]
    assert not (tmp_path / "ort-int4-rtn").exists()


def test_a_build_in_its_own_process_makes_the_same_artifact_and_says_why_one_fails(
    tinylm: Tinylm, tmp_path: Path
) -> None:
    own, no_cuts = _build(tinylm, tmp_path / "own", ORT_INT4, isolate=True, within_s=600.0)
    here, _ = _build(tinylm, tmp_path / "here", ORT_INT4, isolate=False, within_s=None)
    assert own.folder is not None and here.folder is not None and no_cuts == []
    assert _digests(own.folder) == _digests(here.folder)
    assert own.passes == here.passes
    broken = ORT_INT4.model_copy(update={"key": "ort-int3", "params": {**ORT_INT4.params, "precision": "int3"}})
    failed, cuts = _build(tinylm, tmp_path / "own", broken, isolate=True, within_s=600.0)
    assert failed.folder is None and failed.error and "int3" in failed.error, failed.error
    assert cuts == [], "a build's own failure is not the budget's"
    assert not (tmp_path / "own" / "ort-int3").exists()


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # it ended meanwhile
        return []


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}
