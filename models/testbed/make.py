"""Make the converter's test models and data (run once; the outputs are committed, nothing is downloaded).

- dynamic_cnn.onnx: a small CNN trained on scikit-learn's digits whose height and width are symbolic
  ("height", "width"): Conv/BN/ReLU blocks and a global average pool, so any H and W work.
- sklearn_digits.onnx: StandardScaler + RandomForest via skl2onnx (ai.onnx.ml ops: Scaler, TreeEnsemble),
  zipmap disabled so outputs are tensors (label int64, probabilities float32).
- silero_{calib,eval}.npz: 512-sample chunks of synthetic 16 kHz audio (voiced harmonics with a moving
  formant, noise, silence) for silero-vad's `silero_vad.onnx` (PyPI package silero-vad), with the recurrent
  state each chunk really sees when the model runs over the stream, and sr = 16000.

Needs torch, scikit-learn, skl2onnx and silero-vad:  python models/testbed/make.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images / 16.0).astype(np.float32), data.target.astype(np.int64)


def make_dynamic_cnn() -> None:
    import torch
    from torch import nn

    images, labels = digits()
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip
    x, y = torch.from_numpy(images[:, None]), torch.from_numpy(labels)
    train = slice(0, 1400)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(60):
        for start in range(0, 1400, 64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x[train][start : start + 64]), y[train][start : start + 64])
            loss.backward()
            opt.step()
    net.eval()
    torch.onnx.export(
        net, (x[:1],), str(HERE / "dynamic_cnn.onnx"), input_names=["image"], output_names=["logits"],
        dynamic_axes={"image": {2: "height", 3: "width"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    np.savez_compressed(HERE / "dynamic_cnn_calib.npz", image=images[:128, None, None])
    np.savez_compressed(HERE / "dynamic_cnn_eval.npz", image=images[1400:1760, None, None], labels=labels[1400:1760])


def make_sklearn() -> None:
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    images, labels = digits()
    flat = images.reshape(len(images), 64)
    model = make_pipeline(StandardScaler(), RandomForestClassifier(n_estimators=20, max_depth=8, random_state=0))
    model.fit(flat[:1400], labels[:1400])
    onx = to_onnx(model, flat[:1], options={"zipmap": False}, target_opset={"": 17, "ai.onnx.ml": 3})
    (HERE / "sklearn_digits.onnx").write_bytes(onx.SerializeToString())
    np.savez_compressed(HERE / "sklearn_calib.npz", X=flat[:128, None])
    np.savez_compressed(HERE / "sklearn_eval.npz", X=flat[1400:1760, None], labels=labels[1400:1760])


def synthetic_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rate, out = 16000, []
    while sum(len(s) for s in out) < seconds * rate:
        length = int(rng.uniform(0.3, 1.2) * rate)
        t = np.arange(length) / rate
        kind = rng.integers(3)
        if kind == 0:  # voiced: harmonics of a gliding pitch, shaped by a moving formant, syllable envelope
            pitch = rng.uniform(90, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(1, 3) * t))
            phase = 2 * np.pi * np.cumsum(pitch) / rate
            formant = rng.uniform(400, 900) * (1 + 0.5 * np.sin(2 * np.pi * rng.uniform(2, 5) * t))
            signal = sum(np.sin(k * phase) * np.exp(-(((k * pitch - formant) / 400) ** 2)) for k in range(1, 20))
            signal = signal * np.clip(np.sin(np.pi * t * rng.uniform(3, 6)) ** 2, 0, 1) * rng.uniform(0.1, 0.5)
        elif kind == 1:
            signal = rng.normal(0, rng.uniform(0.005, 0.05), length)
        else:
            signal = rng.normal(0, 1e-4, length)
        out.append(signal + rng.normal(0, 1e-3, length))
    return np.concatenate(out).astype(np.float32)


def make_silero_data() -> None:
    import importlib.util

    import onnxruntime as ort

    spec = importlib.util.find_spec("silero_vad")  # not imported: its __init__ needs torch
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps silero-vad"
    model = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for name, seconds, seed in (("silero_calib", 4.1, 1), ("silero_eval", 11.6, 2)):
        audio = synthetic_audio(seconds, seed)
        chunks = audio[: len(audio) // 512 * 512].reshape(-1, 1, 512)
        state = np.zeros((2, 1, 128), np.float32)
        states = []
        for chunk in chunks:
            states.append(state)
            _, state = session.run(None, {"input": chunk, "state": state, "sr": np.array(16000, np.int64)})
        count = {"silero_calib": 128, "silero_eval": 360}[name]
        np.savez_compressed(
            HERE / f"{name}.npz",
            input=chunks[:count],
            state=np.stack(states)[:count],
            sr=np.full(count, 16000, np.int64),
        )


if __name__ == "__main__":
    make_dynamic_cnn()
    make_sklearn()
    make_silero_data()
