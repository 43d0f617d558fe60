"""The agent's local HTTP API under test: loaded models (a fixture), a gated model, raw and JSON exchanges."""

from __future__ import annotations

import http.client
import io
import json
import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgefleet.agent.api.service import InferenceService
from edgefleet.agent.runtime.model import LoadedModel

from support.runtime import ModelWrapper, golden, symbolic_batch, unpack

INFER = "/v1/models/digits-cnn/infer"


class GatedModel(ModelWrapper):
    """A real model whose calls wait for a gate: holds the service busy so the queue can fill deterministically."""

    def __init__(self, inner: LoadedModel) -> None:
        super().__init__(inner)
        self.gate, self.entered = threading.Event(), threading.Semaphore(0)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.entered.release()
        assert self.gate.wait(20)
        return self.inner.run(feeds)


@pytest.fixture(scope="module")
def models(
    demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, LoadedModel]:
    root = tmp_path_factory.mktemp("service")
    loaded = {}
    for label, profile in (("v1", "intel-x86-vnni"), ("v2", "generic-x86-64")):
        bundle_dir, manifest = unpack(demo_bundles[profile], keys[1], root / label)
        loaded[label] = LoadedModel(bundle_dir, manifest, 1)
    loaded["dyn"] = LoadedModel(*symbolic_batch(bundle_dir, manifest, root / "dyn"), 1)
    return loaded


def sample(models: dict[str, LoadedModel]) -> np.ndarray:
    model = models["v1"]
    return golden(model.bundle_dir, model.manifest).inputs.sample(3)["input"]


def call(
    svc: InferenceService, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10)
    try:
        conn.request(method, path, body, headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def json_body(x: np.ndarray, name: str = "input", dtype: str | None = None, shape: Any = None) -> bytes:
    tensor = {"dtype": dtype or str(x.dtype), "shape": list(x.shape) if shape is None else shape, "data": x.tolist()}
    return json.dumps({"inputs": {name: tensor}}).encode()


def npy(x: Any, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, x, allow_pickle=allow_pickle)
    return buffer.getvalue()


def raw_exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send raw bytes; return the whole answer and whether the server closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks), True
