"""A generation takes the scheduler's compute gate around its prefill and each token (GenerationRequest.step): it
yields between tokens while real-time work runs, and resumes after. Real ONNX Runtime GenAI, the converter's tinylm."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.runtime.generative import GenerationRequest
from edgefleet.agent.schedule import ComputeGate

from support.models.generative import TinylmBundles
from support.runtime import unpack

pytestmark = pytest.mark.slow  # the session's tinylm conversion comes first


@pytest.fixture(scope="module")
def tinylm(
    tinylm_bundles: TinylmBundles, keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedModel]:
    model = LoadedModel(*unpack(tinylm_bundles["generic-x86-64"], keys[1], tmp_path_factory.mktemp("gate") / "b"), 2)
    yield model
    model.close()


def test_every_token_and_the_prefill_is_one_step(tinylm: LoadedModel) -> None:
    assert tinylm.generative is not None
    steps = [0]

    @contextmanager
    def step() -> Iterator[None]:
        steps[0] += 1
        yield

    ids = tuple(tinylm.generative.encode("Once upon a time"))
    result = tinylm.generative.generate(GenerationRequest(ids, 12, ignore_stop=True, step=step), lambda _: None)
    assert len(result.tokens) == 12
    assert steps[0] == 12 + 1, "the prefill, then one step per token"


def test_a_generation_yields_between_tokens_while_real_time_work_runs(tinylm: LoadedModel) -> None:
    assert tinylm.generative is not None
    gate = ComputeGate(lanes=1)
    gate.assign("detector", "real-time")
    gate.assign("assistant", "interactive")
    stamps: list[float] = []
    ids = tuple(tinylm.generative.encode("Once upon a time"))
    request = GenerationRequest(ids, 40, ignore_stop=True, step=lambda: gate.step("assistant"))
    done = threading.Event()

    def generate() -> None:
        tinylm.generative.generate(request, lambda _: stamps.append(time.perf_counter()))  # type: ignore[union-attr]
        done.set()

    worker = threading.Thread(target=generate)
    worker.start()
    deadline = time.monotonic() + 60
    while len(stamps) < 3:
        assert time.monotonic() < deadline and not done.is_set(), "the generation did not start"
        time.sleep(0.005)
    with gate.step("detector"):  # real-time work holds the compute for 0.4 s: the generation waits between tokens
        held_from = time.perf_counter()
        time.sleep(0.4)
        held_to = time.perf_counter()
    worker.join(60)
    assert done.is_set()
    inside = [t for t in stamps if held_from + 0.05 < t < held_to]
    assert len(inside) <= 1, f"{len(inside)} tokens came while the real-time step ran (one in flight may land late)"
    assert any(t > held_to for t in stamps), "the generation resumed after it"
    timing = gate.timing()
    assert timing["assistant"].yields >= 1 and timing["assistant"].batches == 40 + 1
    assert timing["detector"].compute_ms.count == 1
