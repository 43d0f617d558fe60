"""Running candidates on this machine: runners for ONNX Runtime and OpenVINO, and their outputs on a dataset.

Each runner does what a serving loop does per request (copy inputs in, run, copy outputs out), so runtimes are
compared on equal terms (converter.timing times them).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort

from edgefleet.converter import deadline
from edgefleet.core.errors import ConversionError
from edgefleet.core.tensors import Dataset, run_samples

if TYPE_CHECKING:
    from edgefleet.converter.passes.openvino import OpenVINOArtifact

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def _session_options(threads: int, as_written: bool = False) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if as_written:  # no fusions: Q/DQ nodes stay, so int8 arithmetic is the graph's, not this CPU's kernels'
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def ort_runner(
    model: Path | onnx.ModelProto, threads: int = 1, provider: str = "CPUExecutionProvider", *, as_written: bool = False
) -> Runner:
    """`as_written` runs the graph without fusions: the reference arithmetic of a quantized graph, for a host
    that stands in for other hardware (see Spec.as_written)."""
    source: str | bytes = str(model) if isinstance(model, Path) else model.SerializeToString()
    try:
        session = ort.InferenceSession(source, _session_options(threads, as_written), providers=[provider])
    except Exception as err:  # onnxruntime raises its own untyped exceptions
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        if "is not a registered function/op" not in first:
            raise ConversionError(f"onnxruntime cannot load the model: {first}") from err
        session = _custom_op_session(model, threads, provider, as_written)
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # A sample of a 0-d input is a numpy scalar, which onnxruntime refuses: hand it an array.
        arrays = {k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in feeds.items()}
        return dict(zip(names, session.run(names, arrays), strict=True))

    return run


def _custom_op_session(
    model: Path | onnx.ModelProto, threads: int, provider: str, as_written: bool = False
) -> ort.InferenceSession:
    """A session for a model holding custom ops, with their implementations from the custom-op packages. A file
    with external data is run from its path (a renamed copy beside its data, removed once the session holds it)."""
    from edgefleet.converter.passes.custom_ops import host_session_path, host_session_source
    from edgefleet.core.custom_ops.renamed_copy import external_locations

    with tempfile.TemporaryDirectory(prefix="edgefleet-custom-ops-") as work:
        if isinstance(model, Path) and external_locations(onnx.load(str(model), load_external_data=False)):
            source: str | bytes
            source, libraries = host_session_path(model, Path(work))
        else:
            source, libraries = host_session_source(onnx.load(str(model)) if isinstance(model, Path) else model)
        options = _session_options(threads, as_written)
        for library in libraries:
            options.register_custom_ops_library(library)
        try:
            return ort.InferenceSession(source, options, providers=[provider])
        except Exception as err:  # onnxruntime raises its own untyped exceptions
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise ConversionError(f"onnxruntime cannot load the model with its custom ops: {first}") from err


@cache
def openvino_devices() -> tuple[str, ...]:
    try:
        import openvino as ov
    except ImportError:
        return ()
    return tuple(ov.Core().available_devices)


def openvino_config(hint: str | None, threads: int, device: str = "CPU") -> dict[str, object]:
    """What the agent must pass to compile_model: the recorded precision hint, latency mode, threads."""
    config: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
    if device == "CPU":
        config.update({"NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads})
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    return config


def openvino_runner(
    artifact: OpenVINOArtifact, output_names: list[str], threads: int = 1, device: str = "CPU"
) -> Runner:
    """Compile on `device` with the artifact's precision hint (CPU proxies may override it to f32)."""
    import openvino as ov

    hint = artifact.inference_precision_hint if device != "CPU" or artifact.inference_precision_hint != "f16" else "f32"
    try:
        compiled = ov.Core().compile_model(artifact.model, device, openvino_config(hint, threads, device))
    except Exception as err:  # OpenVINO raises RuntimeError with a long report
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise ConversionError(f"OpenVINO cannot compile the model for {device}: {first}") from err
    request = compiled.create_infer_request()
    if len(compiled.outputs) != len(output_names):
        raise ConversionError(f"OpenVINO model has {len(compiled.outputs)} outputs, ONNX had {len(output_names)}")
    static = all(not port.get_partial_shape().is_dynamic for port in compiled.inputs)
    inputs = {port.get_any_name(): index for index, port in enumerate(compiled.inputs)}
    outputs = [request.get_output_tensor(i) for i in range(len(output_names))] if static else []
    in_tensors = {name: request.get_input_tensor(i) for name, i in inputs.items()} if static else {}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if static:
            for name, value in feeds.items():
                in_tensors[name].data[...] = value
            request.infer()
            return {name: outputs[i].data.copy() for i, name in enumerate(output_names)}
        request.infer(feeds, share_inputs=True)
        return {name: request.get_output_tensor(i).data.copy() for i, name in enumerate(output_names)}

    return run


def predict(runner: Runner, dataset: Dataset) -> dict[str, np.ndarray]:
    """Every sample's outputs, stacked; under a deadline (converter.deadline) it is checked before each sample."""

    def checked(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        deadline.check()
        return runner(feeds)

    try:
        return run_samples(checked, dataset)
    except ConversionError:
        raise
    except Exception as err:  # a runtime failing on real data is a candidate failure, not a crash
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise ConversionError(f"inference failed on the evaluation set: {first}") from err
