"""The FP32 torch reference for a Hugging Face decoder model directory, and a check of the directory.

``load_model_dir(path)`` is the converter's own check (``edgefleet.converter.generative.load_decoder``): whether a
directory is a decoder-only language model the converter can take (``config.json`` with a supported ``model_type``,
safetensors weights, a tokenizer, an end-of-sequence id) and what it is, or a ``UserInputError`` that names what is
missing. Reading it costs no torch.

``perplexity(model_dir, text)`` and ``next_tokens(model_dir, text)`` run the model with transformers on the CPU, in
FP32, over non-overlapping windows of ``context`` tokens: the reference a converted model is measured against.
Nothing is downloaded (``local_files_only=True``).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any


def load_model_dir(path: str | Path) -> Any:
    """What the converter finds in the directory (a ``DecoderSource``), or a ``UserInputError`` naming what is
    missing."""
    from edgefleet.converter.generative import load_decoder

    return load_decoder(Path(path))


# --- the FP32 torch reference -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _load(model_dir: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_model_dir(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def encode(model_dir: str | Path, text: str) -> list[int]:
    """The token ids of ``text`` (no special tokens added): the positions ``next_tokens`` and ``perplexity`` use."""
    _, tokenizer = _load(str(Path(model_dir).resolve()))
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _windows(ids: list[int], context: int) -> list[list[int]]:
    if context < 2:
        raise ValueError(f"context must be at least 2, not {context}")
    return [ids[i : i + context] for i in range(0, len(ids), context)]


def _window_logits(model_dir: str | Path, text: str, context: int) -> tuple[list[list[int]], list[Any]]:
    import torch

    model, _ = _load(str(Path(model_dir).resolve()))
    windows = _windows(encode(model_dir, text), context)
    logits = []
    with torch.inference_mode():
        for w in windows:
            logits.append(model(input_ids=torch.tensor([w])).logits[0].float())
    return windows, logits


def perplexity(model_dir: str | Path, text: str, context: int = 128) -> float:
    """Token-level perplexity of ``text`` over non-overlapping windows of ``context`` tokens.

    Each window starts fresh (no carried-over state), so its first token is not predicted: the mean is over
    ``len(window) - 1`` predictions per window.
    """
    import torch

    windows, logits = _window_logits(model_dir, text, context)
    nll = 0.0
    count = 0
    for w, lg in zip(windows, logits, strict=True):
        if len(w) < 2:
            continue
        target = torch.tensor(w[1:])
        nll += float(torch.nn.functional.cross_entropy(lg[:-1], target, reduction="sum"))
        count += len(w) - 1
    if count == 0:
        raise ValueError("text too short: needs at least two tokens")
    return math.exp(nll / count)


def next_tokens(model_dir: str | Path, text: str, context: int = 128) -> list[int]:
    """The argmax next-token id at every position of ``encode(model_dir, text)``, windowed like ``perplexity``.

    ``result[i]`` is the model's greedy prediction for token ``i + 1`` given the tokens from the start of ``i``'s
    window up to ``i``; the list is as long as the token ids.
    """
    _, logits = _window_logits(model_dir, text, context)
    out: list[int] = []
    for lg in logits:
        out.extend(int(t) for t in lg.argmax(dim=-1).tolist())
    return out


def main() -> None:
    import argparse
    import os

    from edgefleet.core.errors import EdgefleetError

    # Before torch loads OpenMP: on a busy machine spinning OpenMP threads make torch several times slower.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    parser = argparse.ArgumentParser(description="Check a model directory; optionally measure its perplexity.")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--text", type=Path, help="a UTF-8 text file, e.g. models/tinylm/heldout.txt")
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    try:
        info = load_model_dir(args.model_dir)
    except EdgefleetError as exc:
        raise SystemExit(f"not usable: {exc}") from None
    for field, value in vars(info).items():
        print(f"{field}: {value}")
    if args.text:
        text = args.text.read_text(encoding="utf-8")
        n = len(encode(args.model_dir, text))
        ppl = perplexity(args.model_dir, text, args.context)
        print(f"perplexity: {ppl:.4f} ({n} tokens, windows of {args.context})")


if __name__ == "__main__":
    main()
