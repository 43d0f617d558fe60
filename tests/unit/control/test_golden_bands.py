"""Golden score bands: every output a device could commit (within the manifest's tolerance of the build's own)
scores inside its band, and scores outside it are ones no such output gives."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.control.rollout.judge.golden_bands import golden_bands
from edgefleet.core.bundle.manifest import GoldenSpec
from edgefleet.core.quality.golden import checks_for, compare
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.quality.output_rules import agreement_of
from edgefleet.core.tensors import Dataset

M = 0.05  # the manifest's max |device - build|


def golden(reference: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> GoldenSet:
    count = len(next(iter(reference.values())))
    return GoldenSet(Dataset({"x": np.zeros((count, 1), np.float32)}, None), reference, expected)


def sets() -> dict[str, GoldenSet]:
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(16, 10)).astype(np.float32)
    logits[:4, :2] = [[1.0, 1.02]] * 4  # near ties: outputs within tolerance may pick either class
    quantized = (logits + rng.uniform(-0.02, 0.02, size=logits.shape)).astype(np.float32)
    ctc = rng.normal(size=(6, 12, 5)).astype(np.float32)
    ctc = np.log(np.exp(ctc) / np.exp(ctc).sum(axis=-1, keepdims=True)).astype(np.float32)
    embedding = rng.normal(size=(8, 3, 16)).astype(np.float32)  # no class axis: a continuous output
    return {
        "classifier": golden({"logits": logits}, {"logits": quantized}),
        "exact-classifier": golden({"logits": logits}, {"logits": logits.copy()}),
        "ctc": golden({"log_probs": ctc},
                      {"log_probs": (ctc + rng.uniform(-0.01, 0.01, ctc.shape)).astype(np.float32)}),
        "embedding": golden({"vector": embedding},
                            {"vector": (embedding + rng.uniform(-0.03, 0.03, embedding.shape)).astype(np.float32)}),
    }  # fmt: skip


def within_tolerance(expected: np.ndarray, rng: np.random.Generator, kind: str) -> np.ndarray:
    """An output a device could commit: |y - e| ≤ M everywhere (random, or at the corners of the box)."""
    corner = kind == "corner"
    step = rng.choice([-M, M], size=expected.shape) if corner else rng.uniform(-M, M, size=expected.shape)
    return (expected.astype(np.float64) + step * 0.999).astype(np.float32)


@pytest.mark.parametrize("name", ["classifier", "exact-classifier", "ctc", "embedding"])
def test_every_output_within_tolerance_scores_inside_its_band(name: str) -> None:
    g = sets()[name]
    spec = GoldenSpec(count=len(next(iter(g.reference.values()))), max_abs_error=M, min_agreement=0.0)
    bands = golden_bands(g, spec)
    rng = np.random.default_rng(11)
    for trial in range(300):
        outputs = {k: within_tolerance(v, rng, "corner" if trial % 2 else "uniform") for k, v in g.expected.items()}
        for s in compare(outputs, g, spec).scores:
            band = bands[s.output]
            assert band.score is not None and band.score.holds(s.score), (s, band.score)
            assert band.agreement.holds(agreement_of(s)), (s, band.agreement)
            for key, b in (("max_abs", band.max_abs), ("sqnr_db", band.sqnr_db)):
                if b is not None:
                    assert b.holds(s.detail[key]), (key, s.detail[key], b)


def test_a_quantized_classifier_with_near_ties_has_a_band_and_an_exact_one_a_point() -> None:
    all_sets = sets()
    spec = GoldenSpec(count=16, max_abs_error=M, min_agreement=0.0)
    wide = golden_bands(all_sets["classifier"], spec)["logits"].agreement
    assert wide.lo < 1.0 and wide.hi == 1.0, wide  # the near ties may go either way
    tight = golden_bands(all_sets["exact-classifier"], GoldenSpec(count=16, max_abs_error=0.0, min_agreement=0.0))
    assert tight["logits"].agreement.lo == tight["logits"].agreement.hi == 1.0


def test_an_embedding_cannot_claim_to_be_closer_to_fp32_than_its_build_allows() -> None:
    g = sets()["embedding"]
    spec = GoldenSpec(count=8, max_abs_error=0.001, min_agreement=0.0)
    (check,) = checks_for(g, spec)
    bands = golden_bands(g, spec)["vector"]
    assert bands.sqnr_db is not None and bands.max_abs is not None
    assert not bands.sqnr_db.holds(120.0), "a bit-exact claim is outside what the build's outputs allow"
    assert not bands.max_abs.holds(0.0)
    assert check.rule == "continuous"
