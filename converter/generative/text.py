"""The text a conversion reads: calibration and evaluation text files, tokenized with the model's own
tokenizer.json (the `tokenizers` library, which ONNX Runtime GenAI and OpenVINO's tokenizers agree with), and the
slices each step uses. Bounded, so a conversion stays quick on a long file.

- judging: the first `eval_tokens` tokens of the evaluation text, as non-overlapping windows of at most the
  model's context (`windows`), each scored from a fresh cache;
- timing: a prompt of `prompt_tokens` from the evaluation text;
- golden: prompts and a golden text cut from the evaluation text after the judged slice when it is long enough;
- calibration (data-aware INT4): up to `calib_samples` windows of `calib_tokens` of the calibration text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.core.errors import DataError
from edgefleet.core.quality.generation import windows

__all__ = ["TextData", "load_text"]

EVAL_TOKENS = 4096  # held-out tokens judged: ~0.5 s per candidate for tinylm, enough for a 0.1 % perplexity figure
EVAL_WINDOW = 512  # windows never longer than this (nor than the context)
CALIB_TOKENS = 128  # per calibration sample (NNCF warns past 256 for AWQ)
CALIB_SAMPLES = 32
MIN_EVAL_TOKENS = 256
MAX_TEXT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class TextData:
    eval_ids: np.ndarray  # the whole evaluation text's tokens (int64)
    calib_ids: np.ndarray
    context_length: int
    eval_tokens: int = EVAL_TOKENS

    @property
    def window(self) -> int:
        return min(self.context_length, EVAL_WINDOW)

    def judged(self) -> list[np.ndarray]:
        """The judged slice as windows: every candidate and the FP32 reference are scored on these."""
        return windows(self.eval_ids[: self.eval_tokens], self.window)

    def prompt(self, tokens: int) -> np.ndarray:
        if tokens > len(self.eval_ids):
            raise DataError(f"the evaluation text has {len(self.eval_ids)} tokens, fewer than a {tokens}-token prompt")
        return self.eval_ids[:tokens]

    def unjudged(self) -> np.ndarray:
        """Evaluation tokens after the judged slice (golden prompts come from here), or all of them when the text
        is no longer than the slice."""
        rest = self.eval_ids[self.eval_tokens :]
        return rest if len(rest) >= MIN_EVAL_TOKENS else self.eval_ids

    def calibration(self, tokens: int = CALIB_TOKENS, samples: int = CALIB_SAMPLES) -> list[np.ndarray]:
        ids = self.calib_ids
        step = min(tokens, len(ids))
        return [ids[i : i + step] for i in range(0, len(ids) - step + 1, step)][:samples]


def load_text(tokenizer_json: Path, calib: Path, evaluation: Path, context_length: int) -> TextData:
    """Tokenize the calibration and evaluation text files (UTF-8); DataError when one is unusable."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    eval_ids = _encode(tokenizer, evaluation, "evaluation")
    calib_ids = _encode(tokenizer, calib, "calibration")
    if len(eval_ids) < MIN_EVAL_TOKENS:
        raise DataError(
            f"evaluation text {evaluation} has {len(eval_ids)} tokens: give at least {MIN_EVAL_TOKENS} tokens of "
            "held-out text (a few KB), so perplexity and next-token agreement mean something"
        )
    if len(calib_ids) < CALIB_TOKENS:
        raise DataError(f"calibration text {calib} has {len(calib_ids)} tokens: give at least {CALIB_TOKENS}")
    return TextData(eval_ids=eval_ids, calib_ids=calib_ids, context_length=context_length)


def _encode(tokenizer: object, path: Path, role: str) -> np.ndarray:
    try:
        if path.stat().st_size > MAX_TEXT_BYTES:
            raise DataError(f"{role} text {path} is over {MAX_TEXT_BYTES >> 20} MiB: give a smaller sample")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise DataError(f"{role} text {path} not found: give a UTF-8 text file") from err
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(
            f"{role} text {path} is not readable UTF-8 text ({err}): a language model's --calib and --eval are "
            "plain text files"
        ) from err
    # Only as many characters as the slices need: ~8 bytes a token is generous for any BPE.
    text = text[: 8 * (EVAL_TOKENS * 4 if role == "evaluation" else CALIB_TOKENS * CALIB_SAMPLES)]
    encoding = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    return np.asarray(encoding.ids, dtype=np.int64)
