"""The ORT exclusion search keeps the layers that cause a quantized model's loss in float, not the layers downstream
that only receive it: layers are ranked by their local error (each run on the float model's inputs), and each
ranked layer is the group of nodes that takes its inputs out of INT8. On a conv stack whose one early conv has an
outlier channel, qdq_loss_debug's accumulated error ranks the benign layers after it worst, and no float set it
ranks meets the bar; the local ranking names the outlier's consumer first and meets the bar with one layer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes.heads import PLUMBING
from edgefleet.converter.passes.quantize_local import local_report
from edgefleet.converter.search.mixed.float_set import search_float_set
from edgefleet.core.profiles import get_profile
from edgefleet.core.quality.task_metrics import per_position
from edgefleet.core.tensors import Dataset
from edgefleet.core.trust.signing import SigningKey

from support.models.mixed import outlier_conv_model

BAR = 0.95  # per-position agreement with FP32
CONFIG = prec.StaticConfig(reduce_range=True)  # generic-x86-64's INT8 static


@pytest.fixture(scope="module")
def conv_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, Dataset, Dataset]:
    model, calib, evaluation = outlier_conv_model(tmp_path_factory.mktemp("conv"))
    return onnx.load(model), Dataset(dict(np.load(calib)), None), Dataset(dict(np.load(evaluation)), None)


def _agreement(model: onnx.ModelProto, qdq: onnx.ModelProto, data: Dataset) -> float:
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (model, qdq)]
    want, got = ([s.run(None, data.sample(i))[0] for i in range(len(data))] for s in run)
    return per_position({"logits": np.stack(want)}, {"logits": np.stack(got)}, None)


def _search(model: onnx.ModelProto, calib: Dataset, data: Dataset, ranked: list[tuple[str, ...]]):  # type: ignore[no-untyped-def]
    def try_count(count: int) -> tuple[float, bool]:
        names = tuple(dict.fromkeys(n for layer in ranked[:count] for n in layer))
        qdq = prec.quantize_int8_static(model, dataclasses.replace(CONFIG, exclude_nodes=names), calib)
        score = _agreement(model, qdq, data)
        return score, score >= BAR

    return search_float_set(len(ranked), try_count)


def test_the_local_ranking_names_the_early_layer_that_breaks_where_the_accumulated_one_names_its_victims(
    conv_stack: tuple[onnx.ModelProto, Dataset, Dataset],
) -> None:
    model, calib, _ = conv_stack
    qdq = prec.quantize_int8_static(model, CONFIG, calib)
    local = local_report(model, qdq, calib)
    assert local[0].node == "conv1" and local[0].sqnr_db < 20  # reads the outlier: its own quantization breaks it
    assert all(w.sqnr_db > 30 for w in local[1:])  # every benign layer is fine on float inputs
    assert local[0].group == ("conv1", "relu0", "conv0")  # its input, with the outlier conv that produces it
    accumulated = [w for w in prec.layer_report(model, qdq, calib, samples=8).worst(99) if w.op_type not in PLUMBING]
    victims = {"relu1", "conv2", "relu2", "conv3", "relu3", "conv4", "relu4", "conv5"}
    assert accumulated[0].node in victims  # downstream of the break: the error it carries came from upstream
    assert {w.node for w in accumulated[:4]} <= victims


def test_the_exclusion_search_meets_the_bar_with_the_cause_in_float_where_the_accumulated_ranking_never_does(
    conv_stack: tuple[onnx.ModelProto, Dataset, Dataset],
) -> None:
    model, calib, evaluation = conv_stack
    qdq = prec.quantize_int8_static(model, CONFIG, calib)
    assert _agreement(model, qdq, evaluation) < BAR  # plain INT8 misses the bar
    by_cause = _search(model, calib, evaluation, [w.group for w in local_report(model, qdq, calib)])
    assert by_cause.best is not None and by_cause.best.count == 1 and len(by_cause.trials) == 1
    report = prec.layer_report(model, qdq, calib, samples=8)
    by_victims = _search(model, calib, evaluation, [(w.node,) for w in report.worst(99) if w.op_type not in PLUMBING])
    assert by_victims.best is None  # every layer it ranks in float, and still under the bar
    assert max(t.result for t in by_victims.trials) < BAR


def test_a_conversion_keeps_the_cause_in_float_with_one_build(tmp_path: Path, signing_key: SigningKey) -> None:
    model, calib, evaluation = outlier_conv_model(tmp_path / "model")
    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[get_profile("generic-x86-64")], calib=calib, eval=evaluation, out=tmp_path / "out",
            key=signing_key, name="convs", version="1", report=False, metric="per-position-agreement",
            min_score=BAR, runtimes=("onnxruntime",), prune=False,
        )
    )  # fmt: skip
    assert result.bundle, result.error
    (summary,) = [n for n in result.notes if n.startswith("ORT exclusion search over")]
    assert ", 1 builds (1: meets on the selection split)" in summary
    (ranking,) = result.worst_layers.values()
    assert len(ranking[0]["float_group"]) == 3  # type: ignore[arg-type]  # the consumer, the Relu, the outlier conv
    (one,) = [c for c in result.candidates if str(c["name"]).endswith("-float1")]
    assert one["rejected"] is None or str(one["rejected"]).startswith("slower")  # met the bar held out
    assert float(one["accuracy"]) >= BAR  # type: ignore[arg-type]
