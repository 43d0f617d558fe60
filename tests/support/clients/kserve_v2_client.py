"""KServe's own REST client (pip package `kserve`), unchanged, against an agent's Open Inference Protocol API.

Runs in its own interpreter (kserve pins psutil<6 and protobuf<7, which the project's environment cannot take).
    python kserve_v2_client.py BASE_URL MODEL INPUTS.npz  ->  one JSON document on stdout
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput


async def main(base: str, model: str, inputs_path: str) -> dict:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=60))
    report: dict = {
        "live": await client.is_server_live(base),
        "ready": await client.is_server_ready(base),
        "model_ready": await client.is_model_ready(base, model),
        "unknown_model_ready": await client.is_model_ready(base, "no-such-model"),
    }
    with np.load(inputs_path) as data:
        arrays = {name: data[name] for name in data.files}

    def request(binary: bool, outputs: list[RequestedOutput] | None = None) -> InferRequest:
        tensors = []
        for name, array in arrays.items():
            tensor = InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=binary)
            tensors.append(tensor)
        return InferRequest(model, tensors, request_id=f"kserve-{binary}", request_outputs=outputs)

    binary_outputs = [RequestedOutput(name, {"binary_data": True}) for name in ("scores", "squared")]
    for label, binary, outputs in (("json", False, None), ("binary", True, binary_outputs)):
        response = await client.infer(base, request(binary, outputs), model_name=model)
        report[label] = {
            "id": response.id,
            "outputs": {
                o.name: {"shape": list(o.shape), "datatype": o.datatype, "data": o.as_numpy().tolist()}
                for o in response.outputs
            },
        }
    for label, name, shape in (("unknown_model", "no-such-model", None), ("wrong_shape", model, [1, 5])):
        bad = request(False)
        if shape is not None:
            array = np.zeros(shape, np.float32)
            bad.inputs[0] = InferInput(bad.inputs[0].name, shape, "FP32")
            bad.inputs[0].set_data_from_numpy(array, binary_data=False)
        try:
            await client.infer(base, bad, model_name=name)
            report[label] = {"status": 200}
        except httpx.HTTPStatusError as err:
            report[label] = {"status": err.response.status_code, "message": str(err)}
    await client.close()
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
