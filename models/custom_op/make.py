"""Train and export the custom-op worked example: the digits CNN with `edgefleet.ops::Swish` activations.

The activation is a torch custom op (`torch.library.custom_op("edgefleet::swish")`) exported by the TorchScript
exporter into its own ONNX domain with `torch.onnx.register_custom_op_symbolic`, the way ONNX users add an
operator the standard set lacks. Writes ``swish_cnn.onnx`` (opset 17 + edgefleet.ops 1, input ``input``
[1, 1, 8, 8] float32, output ``logits`` [1, 10]) beside this file; the calibration and evaluation data are the
demo model's (models/digits/calib.npz and eval.npz: the same splits).

Checks before writing: onnxruntime with the op registered through onnxruntime-extensions (swish_op.py) matches
torch, and so does the model with the op replaced by its standard-op decomposition.

Needs the ``train`` extra and onnxruntime-extensions: ``python models/custom_op/make.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
BETA = 1.5
OPSET = 17
MAX_ABS_DIFF = 1e-4


def _load(path: Path, name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


swish_op = _load(HERE / "swish_op.py", "swish_op")
digits_train = _load(HERE.parent / "digits" / "train.py", "digits_train")


@torch.library.custom_op("edgefleet::swish", mutates_args=())
def swish(x: torch.Tensor, beta: float) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


@swish.register_fake
def _swish_fake(x: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.empty_like(x)


def _swish_backward(ctx, grad):  # type: ignore[no-untyped-def]
    (x,), beta = ctx.saved_tensors, ctx.beta
    gate = torch.sigmoid(beta * x)
    return grad * (gate + beta * x * gate * (1 - gate)), None


def _swish_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(inputs[0])
    ctx.beta = inputs[1]


swish.register_autograd(_swish_backward, setup_context=_swish_setup)


@torch.onnx.symbolic_helper.parse_args("v", "f")
def _swish_symbolic(g, x, beta):  # type: ignore[no-untyped-def]
    return g.op(f"{swish_op.DOMAIN}::Swish", x, beta_f=beta).setType(x.type())


torch.onnx.register_custom_op_symbolic("edgefleet::swish", _swish_symbolic, 9)


class Swish(nn.Module):
    def __init__(self, beta: float) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.edgefleet.swish(x, self.beta)


def build_model() -> nn.Sequential:
    return nn.Sequential(
        OrderedDict(
            [
                ("conv1", nn.Conv2d(1, 16, 3, padding=1)),
                ("act1", Swish(BETA)),
                ("conv2", nn.Conv2d(16, 32, 3, padding=1)),
                ("act2", Swish(BETA)),
                ("pool", nn.MaxPool2d(2)),
                ("gap", nn.AdaptiveAvgPool2d(1)),
                ("flatten", nn.Flatten()),
                ("fc", nn.Linear(32, 10)),
            ]
        )
    )


def export(model: nn.Module, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        torch.onnx.export(
            model, (torch.zeros(1, 1, 8, 8),), str(path), input_names=["input"], output_names=["logits"],
            opset_version=OPSET, dynamo=False, custom_opsets={swish_op.DOMAIN: swish_op.VERSION},
        )  # fmt: skip
    proto = onnx.load(str(path))
    proto.doc_string = "edgefleet custom-op example: digits CNN with edgefleet.ops::Swish (beta 1.5) activations."
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))


def _run(model: onnx.ModelProto, images: np.ndarray, libraries: list[str]) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    for library in libraries:
        options.register_custom_ops_library(library)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(["logits"], {"input": image[None]})[0] for image in images])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "swish_cnn.onnx")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    train_set, _calib, eval_set = digits_train.load_splits(args.seed)
    model = build_model()
    digits_train.train(model, train_set, args.epochs, args.seed)
    export(model, args.out)
    proto = onnx.load(str(args.out))
    print("ops:", sorted({f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node}))

    with torch.no_grad():
        expected = model(torch.from_numpy(eval_set.images)).numpy()
    os.environ["EDGEFLEET_CUSTOM_OPS"] = str(HERE / "swish_op.py")
    sys.path.insert(0, str(HERE.parent.parent))  # the repository, when edgefleet is not installed
    from edgefleet.converter.passes import custom_ops

    source, libraries = custom_ops.host_session_source(proto)
    with_op = _run(onnx.load_from_string(source), eval_set.images, libraries)
    decomposed = custom_ops.decompose(proto, custom_ops.DecomposeConfig(("edgefleet.ops::Swish",)))
    standard = _run(decomposed, eval_set.images, [])
    for what, got in (("onnxruntime-extensions", with_op), ("standard-op decomposition", standard)):
        diff = float(np.abs(got - expected).max())
        print(f"max abs diff torch vs {what}: {diff:.3e}")
        if diff >= MAX_ABS_DIFF:
            raise SystemExit(f"{what} differs from torch by {diff:.3e}")
    print(f"eval top-1 accuracy: {float((with_op.argmax(axis=1) == eval_set.labels).mean()):.4f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
