"""ONNX Runtime's MatMulNBits quantizer as a post-pass on an ONNX Runtime GenAI folder: round to nearest, or GPTQ
(data-aware) with the calibration text, the way the model builder has no option for. The folder's genai_config.json
and tokenizer files are copied; og runs the result unchanged.

GPTQ calibration samples feed the decoder as the builder exported it: input_ids, an all-ones attention mask and a
zero-length past per layer. The quantizer deep-copies and iterates its reader, so it is iterable.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.converter.generative.quiet import quiet
from edgefleet.core.bundle.manifest import PassRecord

__all__ = ["GPTQ_SAMPLES", "quantize_nbits"]

GPTQ_SAMPLES = 16  # 16 x 128 tokens: GPTQ took ~7 s on tinylm; more samples barely move its perplexity there
MODEL, DATA = "model.onnx", "model.onnx.data"


def quantize_nbits(base: Path, out: Path, params: dict[str, Any], calibration: list[np.ndarray]) -> list[PassRecord]:
    import onnx

    bits, block = int(params["bits"]), int(params["block_size"])
    algorithm = str(params.get("algorithm", "rtn"))
    config = json.loads((base / "genai_config.json").read_text("utf-8"))
    filename = str(config["model"]["decoder"].get("filename") or MODEL)
    with quiet(f"ONNX Runtime's MatMulNBits quantizer ({algorithm}, {bits} bits)"):
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            GPTQWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

        model = onnx.load(str(base / filename))
        if algorithm == "gptq":
            reader = _Calibration(config, calibration[:GPTQ_SAMPLES])
            algo: Any = GPTQWeightOnlyQuantConfig(calibration_data_reader=reader, percdamp=0.01, block_size=128,
                                                  actorder=False, mse=False, perchannel=True)  # fmt: skip
        else:
            algo = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, accuracy_level=4, bits=bits)
        quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=algorithm != "gptq",
                                         accuracy_level=4, algo_config=algo)  # fmt: skip
        quantizer.process()
        out.mkdir(parents=True)
        quantizer.model.save_model_to_file(str(out / filename), use_external_data_format=True)
    for item in base.iterdir():
        if item.is_file() and not item.name.startswith(filename):
            shutil.copyfile(item, out / item.name)
    extra = {"samples": len(calibration[:GPTQ_SAMPLES])} if algorithm == "gptq" else {}
    return [PassRecord(name="matmul-nbits", params={"bits": bits, "block_size": block, "algorithm": algorithm,
                                                   "accuracy_level": 4, **extra})]  # fmt: skip


class _Calibration:
    """A CalibrationDataReader over the calibration windows, as fresh prefills (zero-length past)."""

    def __init__(self, config: dict[str, Any], samples: list[np.ndarray]) -> None:
        decoder = config["model"]["decoder"]
        layers, kv_heads, head = decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]
        names = decoder["inputs"]
        self.items = []
        for ids in samples:
            feeds = {names["input_ids"]: ids[None].astype(np.int64),
                     names["attention_mask"]: np.ones((1, len(ids)), np.int64)}  # fmt: skip
            for layer in range(layers):
                for kind in ("past_key_names", "past_value_names"):
                    feeds[names[kind] % layer] = np.zeros((1, kv_heads, 0, head), np.float32)
            self.items.append(feeds)
        self._iter = iter(self.items)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self.items)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.items)
