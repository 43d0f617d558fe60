"""Rollouts onto real agents: a less accurate bundle, and client traffic to every device."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.core.bundle.archive import describe_files, pack_bundle, unpack_bundle
from edgefleet.core.errors import BrokerError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.quality.golden import GoldenSet
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.paths import DIGITS


def less_accurate_bundle(source: Path, out_dir: Path, key: SigningKey, trusted: TrustedKeys, version: str) -> Path:
    """A re-signed build of the same model whose classes 0-4 come out rotated: half the answers are wrong. Its
    golden set holds its own outputs as `expected` and a loosened `min_agreement`, as a build with a misconfigured
    accuracy check would: the device installs it, and measures the damage. The rotation is a Gather appended to
    the graph, so it works whatever recipe built the source bundle (FP32, or INT8 whose weights sit behind
    DequantizeLinear: the converter picks by speed on the machine that runs the tests)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    unpacked = out_dir / f"bad-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    model_path = unpacked / manifest.model_path
    model = onnx.load(str(model_path))
    (graph_output,) = model.graph.output
    classes = int(graph_output.type.tensor_type.shape.dim[-1].dim_value)
    rotated = [*np.roll(np.arange(5), 1), *range(5, classes)]
    for node in model.graph.node:  # the producer now feeds the rotation
        node.output[:] = [f"{o}_unrotated" if o == graph_output.name else o for o in node.output]
    model.graph.initializer.append(numpy_helper.from_array(np.array(rotated, dtype=np.int64), "rotated_classes"))
    model.graph.node.append(
        helper.make_node("Gather", [f"{graph_output.name}_unrotated", "rotated_classes"], [graph_output.name], axis=1)
    )
    onnx.save(model, str(model_path))
    golden_path = unpacked / manifest.golden.path
    golden = GoldenSet.load(golden_path, manifest.inputs, manifest.outputs)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    output = manifest.outputs[0].name
    samples = golden.inputs.inputs[manifest.inputs[0].name]
    expected = np.stack([session.run([output], {manifest.inputs[0].name: s})[0] for s in samples])
    GoldenSet(golden.inputs, golden.reference, {output: expected}).save(golden_path)
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    updated = manifest.model_copy(
        update={
            "model_version": version,
            "bundle_id": f"{manifest.bundle_id}-bad{version}",
            "files": describe_files(sources),
            "golden": manifest.golden.model_copy(
                update={
                    "min_agreement": 0.0,
                    "outputs": [
                        c.model_copy(update={"min_agreement": 0.0, "min_top_k": 0.0}) for c in manifest.golden.outputs
                    ],
                }
            ),
        }
    )
    path = out_dir / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


class Traffic:
    """Inference requests to every device, all the time, so p95 latency and error rates mean something."""

    def __init__(self, host: Connection, topics: Topics, devices: list[str]) -> None:
        with np.load(DIGITS / "eval.npz") as data:
            self.samples = [{"input": data["input"][i]} for i in range(8)]
        self.remotes = [RemoteModel(host, topics, d) for d in devices]
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for remote in self.remotes:
            remote.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for remote in self.remotes:
                try:
                    remote.infer_many(self.samples, window=4, timeout=5.0)
                    self.sent += len(self.samples)
                except BrokerError:
                    pass  # a device busy installing may answer late; the next round goes on
            self._stop.wait(0.1)
