"""The local API's runs go through the scheduler's compute gate when it has one (InferenceService(compute=...)): each
run, or each batch, is one step of its model's slot, counted in the slot's queue and compute time; a lower-class
request waits while real-time work runs. Real ONNX Runtime sessions over real HTTP."""

from __future__ import annotations

import json
import threading
import time

import numpy as np

from edgefleet.agent.api.service import InferenceService, ServiceConfig
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.schedule import BatchingConfig, ComputeGate

from support.local_api import call, models  # noqa: F401 - the fixture
from support.models.batching import digits_samples


def _oip(x: np.ndarray) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def test_each_run_and_each_batch_is_a_step_of_its_models_slot(models: dict[str, LoadedModel]) -> None:  # noqa: F811
    gate = ComputeGate()
    x = digits_samples(4, seed=9)
    config = ServiceConfig(
        port=0, concurrency=4, batching=BatchingConfig(max_queue_delay_ms=5000, preferred_batch_size=4)
    )
    with InferenceService([models["v1"], models["dyn"]], config, compute=gate) as svc:
        for sample in x[:3]:
            assert call(svc, "POST", "/v2/models/digits-cnn/infer", _oip(sample))[0] == 200
        threads = [threading.Thread(target=call, args=(svc, "POST", "/v2/models/digits-dyn/infer", _oip(s))) for s in x]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    timing = gate.timing()
    assert timing["digits-cnn"].batches == 3 and timing["digits-cnn"].compute_ms.count == 3
    assert timing["digits-dyn"].batches == 1, "four requests, one batch, one step"


def test_a_request_waits_while_real_time_work_runs(models: dict[str, LoadedModel]) -> None:  # noqa: F811
    gate = ComputeGate()
    gate.assign("detector", "real-time")
    gate.assign("digits-cnn", "batch")
    answered: list[float] = []
    with InferenceService([models["v1"]], ServiceConfig(port=0), compute=gate) as svc:
        x = digits_samples(1)[0]

        def ask() -> None:
            assert call(svc, "POST", "/v2/models/digits-cnn/infer", _oip(x))[0] == 200
            answered.append(time.perf_counter())

        with gate.step("detector"):
            asker = threading.Thread(target=ask)
            asker.start()
            deadline = time.monotonic() + 10
            while not gate.snapshot().waiting["batch"]:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            released = time.perf_counter()
        asker.join(10)
    assert answered and answered[0] >= released
    assert gate.timing()["digits-cnn"].yields == 1


def test_a_real_time_request_runs_while_batch_requests_hold_every_inference_place(
    models: dict[str, LoadedModel],  # noqa: F811
) -> None:
    gate = ComputeGate()
    gate.assign("camera", "real-time")
    gate.assign("digits-cnn", "real-time")
    gate.assign("digits-dyn", "batch")
    x = digits_samples(1)[0]
    statuses: list[int] = []
    with InferenceService([models["v1"], models["dyn"]], ServiceConfig(port=0, concurrency=1), compute=gate) as svc:
        with gate.step("camera"):  # real-time work runs: the batch request takes the only place, then waits
            batch = threading.Thread(
                target=lambda: statuses.append(call(svc, "POST", "/v2/models/digits-dyn/infer", _oip(x))[0])
            )
            batch.start()
            deadline = time.monotonic() + 10
            while not gate.snapshot().waiting["batch"]:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            status, _, _ = call(svc, "POST", "/v2/models/digits-cnn/infer", _oip(x))
            assert status == 200, "the real-time request did not wait for the place the batch request holds"
            assert gate.snapshot().waiting["batch"] == 1 and statuses == []
        batch.join(10)
    assert statuses == [200]


def test_a_batched_request_is_counted_for_its_model_as_a_single_run_is(
    models: dict[str, LoadedModel],  # noqa: F811
) -> None:
    """The slot's statistics (telemetry, health, rollout judges) hear of every answer, batched or not."""
    answered: list[str] = []
    config = ServiceConfig(port=0, batching=BatchingConfig(max_queue_delay_ms=1, preferred_batch_size=4))
    with InferenceService([models["v1"], models["dyn"]], config,
                          on_model_answer=lambda name, _ms: answered.append(name)) as svc:  # fmt: skip
        for sample in digits_samples(2, seed=3):
            assert call(svc, "POST", "/v2/models/digits-dyn/infer", _oip(sample))[0] == 200
            assert call(svc, "POST", "/v2/models/digits-cnn/infer", _oip(sample))[0] == 200
    assert sorted(answered) == ["digits-cnn", "digits-cnn", "digits-dyn", "digits-dyn"]
