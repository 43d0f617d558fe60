"""Where things are in the checkout the tests run from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
MODELS = REPO / "models"
DIGITS = MODELS / "digits"
TESTBED = MODELS / "testbed"
TINYLM = MODELS / "tinylm"  # a 0.92M-parameter Llama: model/, calib.txt, heldout.txt
