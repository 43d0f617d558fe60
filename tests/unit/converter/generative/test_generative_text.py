"""The text a conversion reads: tokenized with the model's tokenizer.json, bounded slices, clear data errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.converter.generative.text import CALIB_TOKENS, EVAL_TOKENS, load_text
from edgefleet.core.errors import DataError

from support.paths import TINYLM

TOKENIZER = TINYLM / "model" / "tokenizer.json"


def test_slices_of_tinylms_text() -> None:
    text = load_text(TOKENIZER, TINYLM / "calib.txt", TINYLM / "heldout.txt", context_length=256)
    judged = text.judged()
    assert sum(len(w) for w in judged) == EVAL_TOKENS and max(len(w) for w in judged) == 256
    assert len(text.prompt(64)) == 64 and (text.prompt(64) == text.eval_ids[:64]).all()
    assert len(text.unjudged()) > 1000 and (text.unjudged()[:10] == text.eval_ids[EVAL_TOKENS : EVAL_TOKENS + 10]).all()
    samples = text.calibration()
    assert 16 <= len(samples) <= 32 and {len(s) for s in samples} == {CALIB_TOKENS}


def test_no_special_token_is_added() -> None:
    from tokenizers import Tokenizer

    sample = (TINYLM / "heldout.txt").read_text()[:500]
    text_ids = Tokenizer.from_file(str(TOKENIZER)).encode(sample, add_special_tokens=False).ids
    assert text_ids and 0 not in text_ids  # no end token added


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"tiny", "give at least 256 tokens"), (b"\xff\xfe\x00\x81", "not readable UTF-8 text")],
)
def test_unusable_text_is_a_data_error(tmp_path: Path, content: bytes, fragment: str) -> None:
    bad = tmp_path / "eval.txt"
    bad.write_bytes(content)
    with pytest.raises(DataError, match=fragment):
        load_text(TOKENIZER, TINYLM / "calib.txt", bad, 256)
    with pytest.raises(DataError, match="not found"):
        load_text(TOKENIZER, tmp_path / "missing.txt", TINYLM / "heldout.txt", 256)
