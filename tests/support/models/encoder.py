"""A small BERT-style sentence encoder, exported here with torch: token and position embeddings, LayerNorm, two
encoder layers (multi-head self-attention with an additive padding mask, residual + LayerNorm, a GELU
feed-forward), mean pooling over the tokens that are not padding, and a unit-norm sentence embedding: the
structure of the all-MiniLM encoders PyPI packages ship, small enough for a test."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

VOCAB, HIDDEN, HEADS, LAYERS, FFN, TOKENS = 1000, 64, 4, 2, 128, 16


def export(path: Path, seed: int = 0) -> Path:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
            self.out, self.norm1, self.norm2 = nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
            self.up, self.down = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

        def heads(self, x: torch.Tensor) -> torch.Tensor:
            batch, length, _ = x.shape
            return x.view(batch, length, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS) + bias
            context = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(x.shape)
            x = self.norm1(x + self.out(context))
            return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(TOKENS, HIDDEN)
            self.norm = nn.LayerNorm(HIDDEN)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
            x = self.norm(self.tokens(input_ids) + self.positions(positions))
            mask = attention_mask.unsqueeze(1).unsqueeze(2).to(x.dtype)
            bias = (1.0 - mask) * -10000.0
            for layer in self.layers:
                x = layer(x, bias)
            weights = attention_mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)
            return nn.functional.normalize(pooled, dim=-1)

    model = Encoder().eval()
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    mask = torch.ones(1, TOKENS, dtype=torch.int64)
    with warnings.catch_warnings():  # the TorchScript exporter: the one whose graphs the exporters on PyPI wrote
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"], opset_version=17, dynamo=False,
            dynamic_axes={name: {0: "batch"} for name in ("input_ids", "attention_mask", "sentence_embedding")},
        )  # fmt: skip
    return path


def sentences(count: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Token ids of `count` "sentences" of 6 to 16 tokens, padded to 16: axis 0 = sample, each [1, 16]."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((count, 1, TOKENS), np.int64)
    mask = np.zeros((count, 1, TOKENS), np.int64)
    for i in range(count):
        length = int(rng.integers(6, TOKENS + 1))
        ids[i, 0, :length] = rng.integers(1, VOCAB, length)
        mask[i, 0, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}
