"""Train the edgefleet demo model: a small CNN on scikit-learn's bundled 8x8 digits.

Writes three artifacts into ``--out-dir``:

* ``digits_cnn.onnx`` - opset 17, input ``input`` [1, 1, 8, 8] float32, output ``logits`` [1, 10];
  Conv, BatchNormalization and Relu stay separate nodes so the converter has something to fuse.
* ``calib.npz`` / ``eval.npz`` - ``np.savez_compressed`` archives with key ``input`` of shape
  (N, 1, 1, 8, 8) float32 (``arr["input"][i]`` is one model input, as is) and key ``labels`` of
  shape (N,) int64.

Needs the ``train`` extra: ``pip install -e '.[train]' && python models/digits/train.py``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

CALIB_SIZE = 128
EVAL_SIZE = 360
NUM_CLASSES = 10
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
OPSET = 17
MAX_ABS_DIFF = 1e-4


@dataclass(frozen=True)
class Split:
    """Images as (N, 1, 8, 8) float32 in [0, 1] and labels as (N,) int64."""

    images: np.ndarray
    labels: np.ndarray


def load_splits(seed: int) -> tuple[Split, Split, Split]:
    """Return disjoint, stratified (train, calibration, evaluation) splits."""
    digits = load_digits()
    # Pixels are integers 0..16 in the bundled data.
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target.astype(np.int64)
    rest_x, eval_x, rest_y, eval_y = train_test_split(
        images, labels, test_size=EVAL_SIZE, stratify=labels, random_state=seed
    )
    train_x, calib_x, train_y, calib_y = train_test_split(
        rest_x, rest_y, test_size=CALIB_SIZE, stratify=rest_y, random_state=seed
    )
    return Split(train_x, train_y), Split(calib_x, calib_y), Split(eval_x, eval_y)


def conv_block(index: int, in_ch: int, out_ch: int) -> list[tuple[str, nn.Module]]:
    # bias=False: BatchNormalization supplies the shift right after the convolution.
    return [
        (f"conv{index}", nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False)),
        (f"bn{index}", nn.BatchNorm2d(out_ch)),
        (f"relu{index}", nn.ReLU()),
    ]


def build_model() -> nn.Sequential:
    # Named layers give readable ONNX node and initializer names (e.g. /conv1/Conv, bn1.running_mean).
    return nn.Sequential(
        OrderedDict(
            [
                *conv_block(1, 1, 16),
                *conv_block(2, 16, 32),
                ("pool", nn.MaxPool2d(2)),
                *conv_block(3, 32, 32),
                ("gap", nn.AdaptiveAvgPool2d(1)),
                ("flatten", nn.Flatten()),
                ("fc", nn.Linear(32, NUM_CLASSES)),
            ]
        )
    )


def train(model: nn.Module, data: Split, epochs: int, seed: int) -> None:
    x = torch.from_numpy(data.images)
    y = torch.from_numpy(data.labels)
    batch_size = 64
    # OneCycleLR owns the learning rate: a short warm-up then annealing converges in few epochs.
    optimizer = torch.optim.AdamW(model.parameters(), weight_decay=1e-4)
    steps_per_epoch = (len(x) + batch_size - 1) // batch_size
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=1e-2, epochs=epochs, steps_per_epoch=steps_per_epoch
    )
    loss_fn = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=shuffle)
        total = 0.0
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch + 1:2d}/{epochs}  loss {total / len(x):.4f}")
    model.eval()


def export_onnx(model: nn.Module, path: Path) -> None:
    """Export with the TorchScript exporter, keeping BatchNormalization as its own node."""
    model.eval()
    dummy = torch.zeros(1, 1, 8, 8)
    with warnings.catch_warnings():
        # Both warnings are about choices made on purpose here: the legacy exporter is used, and the
        # constant-folding advice only applies to models exported in training mode, which this is not.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", message=".*constant folding be turned off.*")
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            opset_version=OPSET,
            dynamo=False,
            # EVAL mode would run the exporter's Conv+BN fusion; PRESERVE on an eval-mode model keeps
            # inference semantics (running statistics) while leaving BN in the graph.
            training=torch.onnx.TrainingMode.PRESERVE,
        )
    proto = onnx.load(str(path))
    proto.doc_string = "edgefleet demo: small CNN classifying 8x8 digits (scikit-learn load_digits)."
    onnx.helper.set_model_props(
        proto,
        {"edgefleet.demo": "digits-cnn", "labels": "0..9", "input_scale": "pixels / 16, range [0, 1]"},
    )
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))


def op_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def ort_logits(path: Path, images: np.ndarray) -> np.ndarray:
    # The graph has a static batch of 1, so samples are run one at a time.
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run([OUTPUT_NAME], {INPUT_NAME: img[None]})[0] for img in images])


def save_npz(path: Path, data: Split) -> None:
    # One key per model input; axis 0 indexes samples, each sample already shaped (1, 1, 8, 8).
    np.savez_compressed(path, input=data.images[:, None], labels=data.labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out-dir", type=Path, default=Path(__file__).resolve().parents[2] / "edgefleet" / "demo_assets"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    train_set, calib_set, eval_set = load_splits(args.seed)
    print(f"train {len(train_set.labels)}  calib {len(calib_set.labels)}  eval {len(eval_set.labels)}")

    model = build_model()
    started = time.perf_counter()
    train(model, train_set, args.epochs, args.seed)
    print(f"training took {time.perf_counter() - started:.1f} s")

    onnx_path = args.out_dir / "digits_cnn.onnx"
    export_onnx(model, onnx_path)
    counts = op_counts(onnx_path)
    print("ONNX ops:", counts)
    missing = {"Conv", "BatchNormalization", "Relu"} - counts.keys()
    if missing:
        raise SystemExit(f"exported graph lacks {sorted(missing)}; BatchNorm was fused away?")

    with torch.no_grad():
        torch_out = model(torch.from_numpy(eval_set.images)).numpy()
    onnx_out = ort_logits(onnx_path, eval_set.images)
    diff = float(np.abs(torch_out - onnx_out).max())
    print(f"max abs diff torch vs onnxruntime: {diff:.3e}")
    if diff >= MAX_ABS_DIFF:
        raise SystemExit(f"onnxruntime output differs from torch by {diff:.3e} (limit {MAX_ABS_DIFF})")
    accuracy = float((onnx_out.argmax(axis=1) == eval_set.labels).mean())
    print(f"eval top-1 accuracy (onnxruntime): {accuracy:.4f}")

    save_npz(args.out_dir / "calib.npz", calib_set)
    save_npz(args.out_dir / "eval.npz", eval_set)
    print(f"wrote {onnx_path.name}, calib.npz, eval.npz to {args.out_dir}")


if __name__ == "__main__":
    main()
