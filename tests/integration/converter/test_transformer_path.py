"""The transformer path: an encoder's blocks are recognized, ONNX Runtime's transformer fusions are a gated pass, and
the encoder gets the transformer recipes (INT8 per channel with softmax / norms / additions in float, NNCF's
transformer scheme, weight-only INT8 / INT4), judged by cosine on its sentence embedding by default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.converter.passes import transformer
from edgefleet.converter.runners import ort_runner
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.tensors import Dataset
from edgefleet.core.trust.signing import SigningKey

from support.host_cpu import as_this_host
from support.models import encoder as encoder_model
from support.paths import DIGITS


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("encoder")
    path = encoder_model.export(root / "encoder.onnx")
    np.savez(root / "calib.npz", **encoder_model.sentences(32, seed=1))
    np.savez(root / "eval.npz", **encoder_model.sentences(32, seed=2))
    return path


def test_an_encoders_blocks_are_recognized_and_a_cnn_has_none(encoder_file: Path) -> None:
    found = transformer.encoder(onnx.load(str(encoder_file)))
    assert (
        found is not None and found.attention == encoder_model.LAYERS and found.layer_norms >= 2 * encoder_model.LAYERS
    )
    assert found.gelus >= encoder_model.LAYERS and found.embeddings == 2
    assert transformer.encoder(onnx.load(str(DIGITS / "digits_cnn.onnx"))) is None


def test_onnx_runtimes_fusions_fuse_attention_and_keep_the_outputs(encoder_file: Path) -> None:
    model = onnx.load(str(encoder_file))
    fused, counts = transformer.fuse(model)
    assert counts.get("Attention") == encoder_model.LAYERS and counts.get("SkipLayerNormalization")
    feeds = {k: v[0] for k, v in encoder_model.sentences(1, seed=3).items()}
    want = ort_runner(model)(feeds)["sentence_embedding"]
    got = ort_runner(fused)(feeds)["sentence_embedding"]
    assert float(np.max(np.abs(got - want))) < 1e-4
    with pytest.raises(Exception, match="nothing to fuse"):
        transformer.fuse(onnx.load(str(DIGITS / "digits_cnn.onnx")))


def _transformers_bert(path: Path, heads: int = 4, hidden: int = 64, layers: int = 2) -> Path:
    """A randomly initialized BertModel as transformers 5 exports it (eager attention, TorchScript exporter): its
    reshape shapes are computed, so ONNX Runtime's optimizer cannot read the head count from them."""
    import warnings

    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=500, hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                        intermediate_size=4 * hidden, max_position_embeddings=64)  # fmt: skip
    config._attn_implementation = "eager"
    bert = BertModel(config).eval()

    class Sentence(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.mean(1)

    ids = torch.ones(1, 16, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Sentence().eval(), (ids, torch.ones_like(ids)), str(path), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["embedding"])  # fmt: skip
    return path


def test_the_fusion_reads_heads_and_hidden_size_from_the_graph_when_the_exporter_computes_its_shapes(
    tmp_path: Path,
) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    model = onnx.load(str(_transformers_bert(tmp_path / "bert.onnx", heads=4, hidden=64, layers=2)))
    assert transformer.attention_geometry(model) == (4, 64)
    own = optimize_model(str(tmp_path / "bert.onnx"), model_type="bert", opt_level=0)  # its own detection
    assert not own.get_fused_operator_statistics().get("Attention")
    fused, counts = transformer.fuse(model)
    assert counts.get("Attention") == 2
    feeds = {"input_ids": np.arange(16, dtype=np.int64)[None] + 3, "attention_mask": np.ones((1, 16), np.int64)}
    feeds["attention_mask"][0, 12:] = 0
    want, got = ort_runner(model)(feeds)["embedding"], ort_runner(fused)(feeds)["embedding"]
    assert float(np.max(np.abs(got - want))) < 1e-4
    assert transformer.attention_geometry(onnx.load(str(DIGITS / "digits_cnn.onnx"))) is None


def test_weight_only_passes_store_the_matrix_products_in_fewer_bits(encoder_file: Path) -> None:
    model = onnx.load(str(encoder_file))
    int4 = prec.quantize_weights(model, prec.WeightOnlyConfig(bits=4))
    assert sum(n.op_type == "MatMulNBits" for n in int4.graph.node) >= 4 * encoder_model.LAYERS
    assert int4.ByteSize() < model.ByteSize()
    artifact = ovp.compress_weights(ovp.export_openvino(model, ovp.OpenVINOConfig("f32")), ovp.CompressConfig())
    assert any(op.get_element_type().get_type_name() == "u8" for op in artifact.model.get_ops()
               if op.get_type_name() == "Constant")  # fmt: skip
    calib = Dataset({k: v for k, v in encoder_model.sentences(8).items()}, None)
    quantized = ovp.quantize_nncf(ovp.export_openvino(model, ovp.OpenVINOConfig("f32")),
                                  ovp.NNCFConfig(model_type="transformer", subset_size=8), calib)  # fmt: skip
    assert any(op.get_type_name() == "FakeQuantize" for op in quantized.model.get_ops())


@pytest.mark.slow
def test_an_encoder_gets_the_transformer_recipes_and_is_judged_by_cosine(
    encoder_file: Path, tmp_path: Path, signing_key: SigningKey
) -> None:
    root = encoder_file.parent
    (result,) = convert(
        ConvertRequest(
            model=encoder_file, profiles=[as_this_host(get_profile("intel-x86-vnni"))], calib=root / "calib.npz",
            eval=root / "eval.npz", out=tmp_path, key=signing_key, name="encoder", version="1", threads=2,
            report=False, prune=False,  # every recipe built and scored, to see each
        )
    )  # fmt: skip
    assert result.bundle, result.error
    assert result.metric == "cosine"
    names = {str(c["name"]) for c in result.candidates}
    assert {
        "ort-int8-dynamic-pc",
        "ort-int8-static-transformer",
        "ov-int8-nncf-transformer",
        "ort-int8-weights",
        "ort-int4-weights",
        "ov-int8-weights",
        "ort-fused-fp32",
        "ort-fused-int8-dynamic-pc",
    } <= names, names
    assert any("a transformer encoder" in n for n in result.notes)
    assert any("transformer fusions: EmbedLayerNormalization" in n and "Attention x2" in n for n in result.notes)
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.search is not None and "chosen by default" in manifest.search.description
    assert "named 'sentence_embedding'" in manifest.search.description
    assert manifest.accuracy.value >= manifest.search.bar
    fused = next(c for c in result.candidates if c["name"] == "ort-fused-fp32")
    assert fused["accuracy"] is not None and fused["accuracy"] > 0.9999  # the fusion is exact up to float order
