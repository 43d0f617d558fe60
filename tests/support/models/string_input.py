"""A real model with a string input, for the string-input tests over HTTP and MQTT: a skl2onnx pipeline
(OneHotEncoder + LogisticRegression) on colour names, one of them non-ASCII (UTF-8 on the wire)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

COLORS = np.array(["red", "green", "blue", "yellow", "grün"])


def colors_model(root: Path, seed: int) -> Path:
    """Train and convert the pipeline into root/colors.onnx, with calib.npz and eval.npz (unicode arrays, no
    pickles) beside it; returns the model's path."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    rng = np.random.default_rng(seed)
    colors = COLORS[rng.integers(0, len(COLORS), 300)].reshape(-1, 1)
    warm = np.isin(colors[:, 0], ["red", "yellow", "grün"]).astype(np.int64)
    estimator = make_pipeline(OneHotEncoder(handle_unknown="ignore"), LogisticRegression()).fit(colors, warm)
    onx = convert_sklearn(estimator, initial_types=[("color", StringTensorType([None, 1]))],
                          options={id(estimator): {"zipmap": False}})  # fmt: skip
    model = root / "colors.onnx"
    model.write_bytes(onx.SerializeToString())
    np.savez(root / "calib.npz", color=colors[:, None, :])
    np.savez(root / "eval.npz", color=colors[:, None, :])
    return model


def source_outputs(source: ort.InferenceSession, colors: list[str]) -> dict[str, np.ndarray]:
    """What the skl2onnx file itself answers for these colours (the reference the agent is held to)."""
    feeds = {"color": np.array(colors, dtype=object).reshape(-1, 1)}
    names = [o.name for o in source.get_outputs()]
    return dict(zip(names, source.run(names, feeds), strict=True))
