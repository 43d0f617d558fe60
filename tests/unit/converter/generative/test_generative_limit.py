"""Bytes of weights read per output token, from the artifact's own graph: an embedding table only a Gather reads
counts one row; a weight a MatMul reads counts whole. And the limit: bandwidth / those bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.converter.generative.limit import ReadBandwidth, limit_of, weights_read_per_token

VOCAB, HIDDEN = 64, 16


def test_onnx_untied_embedding_counts_one_row(tmp_path: Path) -> None:
    embed = numpy_helper.from_array(np.ones((VOCAB, HIDDEN), np.float32), "embed")
    head = numpy_helper.from_array(np.ones((HIDDEN, VOCAB), np.float32), "head")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embed", "input_ids"], ["h"]),
         helper.make_node("MatMul", ["h", "head"], ["logits"])],
        "decoder", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", VOCAB])], [embed, head],
    )  # fmt: skip
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
    assert weights_read_per_token(tmp_path, "onnxruntime-genai", VOCAB) == HIDDEN * VOCAB * 4 + HIDDEN * 4


def test_openvino_tied_embedding_counts_whole(tmp_path: Path) -> None:
    import openvino as ov
    import openvino.opset13 as ops

    ids = ops.parameter([1, 4], ov.Type.i64, name="input_ids")
    table = ops.constant(np.ones((VOCAB, HIDDEN), np.float32))
    own = ops.constant(np.ones((VOCAB, HIDDEN), np.float32))  # an untied one, beside it
    hidden = ops.add(ops.gather(table, ids, 0), ops.gather(own, ids, 0))
    logits = ops.matmul(hidden, table, transpose_a=False, transpose_b=True)
    ov.save_model(ov.Model([logits], [ids]), str(tmp_path / "openvino_model.xml"), compress_to_fp16=False)
    counted = weights_read_per_token(tmp_path, "openvino-genai", VOCAB)
    assert VOCAB * HIDDEN * 4 + HIDDEN * 4 <= counted < VOCAB * HIDDEN * 4 + HIDDEN * 4 + 64


def test_the_limit_is_bandwidth_over_bytes() -> None:
    bandwidth = ReadBandwidth(gb_s=30.0, threads=2, method="test", measured_at="now", load_average=0.0)
    limit = limit_of(3_000_000, bandwidth, tpot_ms=0.5)
    assert limit.limit_tokens_per_s == pytest.approx(10_000) and limit.achieved_tokens_per_s == pytest.approx(2_000)
    assert limit.share == pytest.approx(0.2)
