"""The compute gate on real ONNX Runtime sessions: a real-time model at a fixed rate while two generation-like loops
(a model run token step after token step, as two streams would) compute beside it. With the gate no token step starts
while the real-time model runs (it overlaps at most the steps already running), and its latency stays near its alone
figure; without the gate the token steps run through it and its latency degrades. Each round measures alone, naive
(everything free-running) and gated, interleaved; latencies are compared by the rounds' medians, by order only (a
loaded 2-core machine)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.agent.schedule import ComputeGate

PERIOD_S = 0.025  # the real-time model's request rate: 40 a second
REQUESTS = 40
ROUNDS = 5
STREAMS = 2

Step = Callable[[], AbstractContextManager[object]]


def _mlp(path: Path, width: int, layers: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                                       f"w{i}") for i in range(layers)]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(layers)]
    nodes.append(helper.make_node("Relu", [f"h{layers}"], ["y"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, width])], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _session(path: Path) -> Callable[[], object]:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1  # each model as if it had the device
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the agent loads models
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = np.ones((8, 1024), np.float32)
    return lambda: session.run(None, {"x": x})


@dataclass
class Round:
    p95_ms: float
    tokens: int
    started_inside: int  # token steps that started while the real-time model ran
    spans: list[tuple[float, float]] = field(default_factory=list)


def _round(detector: Callable[[], object], token: Callable[[], object] | None, gate: ComputeGate | None) -> Round:
    """The real-time model at PERIOD_S (its latency from its scheduled time), with the token loops beside it when
    `token` is given, through `gate` when given."""
    stop, starts, lock = threading.Event(), list[float](), threading.Lock()
    step_rt: Step = (lambda: gate.step("detector")) if gate else nullcontext
    step_token: Step = (lambda: gate.step("assistant")) if gate else nullcontext

    def generate() -> None:
        assert token is not None
        while not stop.is_set():
            with step_token():
                with lock:
                    starts.append(time.perf_counter())
                token()

    loops = [threading.Thread(target=generate) for _ in range(STREAMS if token is not None else 0)]
    for loop in loops:
        loop.start()
    time.sleep(0.05)
    latencies, spans = [], []
    start = time.perf_counter()
    for index in range(REQUESTS):
        due = start + index * PERIOD_S
        time.sleep(max(0.0, due - time.perf_counter()))
        with step_rt():
            began = time.perf_counter()
            detector()
            ended = time.perf_counter()
        spans.append((began, ended))
        latencies.append((ended - due) * 1000)  # from when it was due: a late start counts
    stop.set()
    for loop in loops:
        loop.join(30)
    inside = sum(1 for s in starts for b, e in spans if b < s < e)
    return Round(float(np.percentile(latencies, 95)), len(starts), inside, spans)


@pytest.mark.slow
def test_real_time_p95_stays_near_alone_with_the_gate_and_degrades_without_it(tmp_path: Path) -> None:
    detector = _session(_mlp(tmp_path / "detector.onnx", 1024, 4, seed=1))  # a few ms a run
    token = _session(_mlp(tmp_path / "token.onnx", 1024, 1, seed=2))  # a token step: a quarter of it
    for _ in range(5):
        detector()
        token()
    gate = ComputeGate(lanes=1)
    gate.assign("detector", "real-time")
    gate.assign("assistant", "interactive")
    alone, naive, gated = [], [], []
    for _ in range(ROUNDS):
        alone.append(_round(detector, None, None))
        naive.append(_round(detector, token, None))
        gated.append(_round(detector, token, gate))
    a, n, g = (float(np.median([r.p95_ms for r in rounds])) for rounds in (alone, naive, gated))
    print(f"real-time p95: alone {a:.2f} ms, naive {n:.2f} ms ({n / a:.2f}x), gated {g:.2f} ms ({g / a:.2f}x); "
          f"token steps started inside a real-time run: naive {sum(r.started_inside for r in naive)}, "
          f"gated {sum(r.started_inside for r in gated)}")  # fmt: skip
    assert all(r.started_inside == 0 for r in gated), "no token step starts while the real-time model runs"
    assert sum(r.started_inside for r in naive) > 0, "without the gate they do"
    assert min(r.tokens for r in gated) > REQUESTS, "the generation still ran between the real-time runs"
    assert g < n, f"the gate keeps real-time p95 below the naive mix ({g:.2f} vs {n:.2f} ms)"
    timing = gate.timing()
    assert timing["assistant"].yields > 0 and timing["detector"].yields == 0
    assert timing["detector"].compute_ms.count == ROUNDS * REQUESTS
