"""NNCF `compress_weights` on the stateful OpenVINO IR: INT8_ASYM per channel, INT4_SYM with a group size and a
ratio, optionally AWQ + scale estimation on the calibration text. The tokenizer models and config files are
copied from the FP32 export.

A stateful LLM's dataset items are its non-state inputs only (input_ids, attention_mask, position_ids, beam_idx):
NNCF resets the state before each item, so each is a fresh prefill. By default NNCF keeps the embedding and the
LM head (tied or not) at INT8, which is most of INT4's quality on small models.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.converter.generative.builders.openvino_export import IR
from edgefleet.converter.generative.quiet import quiet
from edgefleet.core.bundle.manifest import PassRecord

__all__ = ["AWQ_SAMPLES", "compress"]

AWQ_SAMPLES = 32  # 32 x 128 tokens: 1-3 s on tinylm


def compress(base: Path, out: Path, params: dict[str, Any], calibration: list[np.ndarray]) -> list[PassRecord]:
    import nncf
    import openvino as ov

    mode = str(params["mode"])
    options: dict[str, Any] = {"mode": getattr(nncf.CompressWeightsMode, mode)}
    if "group_size" in params:
        options["group_size"] = int(params["group_size"])
    if "ratio" in params:
        options["ratio"] = float(params["ratio"])
    data_aware = bool(params.get("awq") or params.get("scale_estimation"))
    if data_aware:
        samples = calibration[:AWQ_SAMPLES]
        options |= {
            "awq": bool(params.get("awq")),
            "scale_estimation": bool(params.get("scale_estimation")),
            "dataset": nncf.Dataset([_item(ids) for ids in samples]),
            "subset_size": len(samples),
        }
    with quiet(f"NNCF compress_weights ({mode})"):
        model = ov.Core().read_model(str(base / IR))
        compressed = nncf.compress_weights(model, **options)
        out.mkdir(parents=True)
        ov.save_model(compressed, str(out / IR), compress_to_fp16=False)
    for item in base.iterdir():
        if item.is_file() and not item.name.startswith("openvino_model."):
            shutil.copyfile(item, out / item.name)
    recorded = {k: v for k, v in params.items() if isinstance(v, str | int | float | bool)}
    if data_aware:
        recorded["samples"] = len(calibration[:AWQ_SAMPLES])
    return [PassRecord(name="nncf-compress-weights", params=recorded)]


def _item(ids: np.ndarray) -> dict[str, np.ndarray]:
    count = len(ids)
    return {
        "input_ids": ids[None].astype(np.int64),
        "attention_mask": np.ones((1, count), np.int64),
        "position_ids": np.arange(count, dtype=np.int64)[None],
        "beam_idx": np.zeros(1, np.int32),
    }
