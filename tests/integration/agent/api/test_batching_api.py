"""Dynamic batching in the local API (ServiceConfig.batching, the agent's --batch-* flags): concurrent requests to a
model with a batch dimension are answered from one run, each with its own answer; a model whose batch is fixed at 1
is served unbatched and says why. Real ONNX Runtime sessions over real HTTP."""

from __future__ import annotations

import json
import threading

import numpy as np

from edgefleet.agent.api.service import InferenceService, ServiceConfig
from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.schedule import BatchingConfig

from support.local_api import call, models  # noqa: F401 - the fixture
from support.models.batching import digits_samples

WAIT_FOR_FOUR = BatchingConfig(max_queue_delay_ms=5000, preferred_batch_size=4)


def _oip(x: np.ndarray) -> bytes:
    tensor = {"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def test_concurrent_requests_share_one_run_and_each_gets_its_own_answer(models: dict[str, LoadedModel]) -> None:  # noqa: F811
    dyn = models["dyn"]
    x = digits_samples(4, seed=5)
    expected = [dyn.run({"input": sample})["logits"] for sample in x]
    answers: list[tuple[int, bytes] | None] = [None] * 4
    config = ServiceConfig(port=0, concurrency=4, batching=WAIT_FOR_FOUR)
    with InferenceService([models["v1"], dyn], config) as svc:

        def ask(index: int) -> None:
            status, _, body = call(svc, "POST", "/v2/models/digits-dyn/infer", _oip(x[index]))
            answers[index] = (status, body)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        _, _, body = call(svc, "GET", "/v1/models/digits-dyn")
        described = json.loads(body)["batching"]
        status_fixed, _, body_fixed = call(svc, "GET", "/v1/models/digits-cnn")
        fixed = json.loads(body_fixed)["batching"]
        bad, _, _ = call(svc, "POST", "/v2/models/digits-dyn/infer", _oip(np.zeros((1, 1, 8, 9), np.float32)))
        alone, _, answer_fixed = call(svc, "POST", "/v2/models/digits-cnn/infer", _oip(x[0]))
    for answer, want in zip(answers, expected, strict=True):
        assert answer is not None and answer[0] == 200
        data = json.loads(answer[1])["outputs"][0]["data"]
        np.testing.assert_array_equal(np.asarray(data, np.float32), want.ravel())
    assert described["enabled"] is True and (described["batches"], described["requests"]) == (1, 4)
    assert described["preferred_batch_size"] == 4 and "'N'" in described["reason"]
    assert status_fixed == 200 and fixed["enabled"] is False
    assert fixed["reason"] == "not batched: batch dimension fixed at 1: input 'input' is [1, 1, 8, 8]"
    assert bad == 400, "bad input is refused on its own, before it joins a batch"
    assert alone == 200 and len(json.loads(answer_fixed)["outputs"][0]["data"]) == 10


def test_without_batching_configured_nothing_is_batched(models: dict[str, LoadedModel]) -> None:  # noqa: F811
    with InferenceService([models["dyn"]], ServiceConfig(port=0)) as svc:
        status, _, body = call(svc, "GET", "/v1/models/digits-dyn")
    assert status == 200
    assert json.loads(body)["batching"] == {"enabled": False, "reason": "off (no batching configured)"}
