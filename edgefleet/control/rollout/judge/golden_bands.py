"""What a device's golden scores can be, given the golden outputs the bundle carries.

A device commits a bundle only when its outputs on the golden inputs lie within the manifest's `max_abs_error`
(m) of the build's own outputs (`expected/<output>` in golden.npz), element by element
(edgefleet.core.quality.golden.compare). The host holds the same golden set, so it can bound every score such
outputs y, with |y - e| ≤ m, can have against the FP32 reference r:

- class and position agreement: a sample (or position) can agree only if the reference class is among the
  classes that could be the argmax (e_j + m ≥ max(e) - m), and surely agrees when it is the only one; the share
  lies between the sure and the possible share;
- continuous outputs: |y - r| lies within [max(0, |e - r| - m), |e - r| + m] element by element, which bounds the
  max-abs error, the share of samples inside the check's max-abs tolerance, the SQNR (from the least and the most
  noise) and the cosine from below.

A score outside its band is one no output the device could have committed can give: the report is not what the
device computed. Label outputs (strings, ids) are not bounded (their check is exact equality against the
reference, which the build's own labels do not constrain).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.core.bundle.manifest import GoldenSpec, OutputCheck, OutputRule
from edgefleet.core.quality.generation import GoldenPrompts
from edgefleet.core.quality.golden import checks_for
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.quality.output_rules import SQNR_CAP_DB, is_label

SLACK = 1e-4  # reported scores are rounded (6 decimals) and computed in float32 on some runtimes


class Band(BaseModel):
    """The scores outputs within tolerance of the build's can have, inclusive."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    lo: float
    hi: float

    def holds(self, value: float) -> bool:
        return self.lo - SLACK - SLACK * abs(self.lo) <= value <= self.hi + SLACK + SLACK * abs(self.hi)

    def __str__(self) -> str:
        return f"{self.lo:.4g}" if math.isclose(self.lo, self.hi) else f"{self.lo:.4g}–{self.hi:.4g}"


class OutputBands(BaseModel):
    """One output's bands: its headline score (agreement, or cosine for continuous outputs), the share of golden
    samples that agree (`agreement_of`), and for float outputs the max-abs error and SQNR against FP32."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rule: OutputRule
    score: Band | None = Field(description="None: a label output, whose scores are not bounded")
    agreement: Band
    max_abs: Band | None = None
    sqnr_db: Band | None = None


def output_bands(check: OutputCheck, reference: np.ndarray, expected: np.ndarray, m: float) -> OutputBands:
    """The bands of one output: FP32 `reference` and the build's `expected` outputs, stacked per sample."""
    if is_label(reference) or is_label(expected) or reference.shape != expected.shape or len(reference) == 0:
        return OutputBands(rule=check.rule, score=None, agreement=Band(lo=0.0, hi=1.0))
    if check.rule == "continuous":
        return _continuous(check, reference.astype(np.float64), expected.astype(np.float64), m)
    return _agreement(check.rule, reference.astype(np.float64), expected.astype(np.float64), m)


def golden_bands(golden: GoldenSet, spec: GoldenSpec) -> dict[str, OutputBands]:
    """Every output's bands, under the checks the device applies (the manifest's, or derived as the device does)."""
    m = float(spec.max_abs_error)
    return {
        c.output: output_bands(c, golden.reference[c.output], golden.expected[c.output], m)
        for c in checks_for(golden, spec)
    }


def generative_bands(golden: GoldenPrompts) -> dict[str, OutputBands]:
    """A generative bundle's golden outputs (agent/runtime/generative/golden.py): next-token and continuation
    agreement and the perplexity score (FP32's perplexity / the device's, at most 1). Whatever runtime or thread
    count a device uses, a committed bundle met the floors its golden prompts carry and cannot beat FP32 itself, so
    each score lies between its floor and 1; perplexity may beat FP32's slightly (quantization noise), never by more
    than the floor allows below."""
    agree = Band(lo=golden.min_next_token_agreement, hi=1.0)
    cont = Band(lo=golden.min_continuation_agreement, hi=1.0)
    ppl = Band(lo=1.0 / golden.max_perplexity_ratio, hi=1.0)
    return {
        "next-token": OutputBands(rule="position-agreement", score=agree, agreement=agree),
        "perplexity": OutputBands(rule="continuous", score=ppl, agreement=Band(lo=0.0, hi=1.0)),
        "continuation": OutputBands(rule="position-agreement", score=cont, agreement=cont),
    }


def _agreement(rule: OutputRule, reference: np.ndarray, expected: np.ndarray, m: float) -> OutputBands:
    count = len(reference)
    if rule == "class-agreement":
        ref, exp = reference.reshape(count, -1), expected.reshape(count, -1)
    else:  # position-agreement: per position over the last axis
        ref, exp = reference.reshape(-1, reference.shape[-1]), expected.reshape(-1, expected.shape[-1])
    truth = ref.argmax(axis=1)
    top = exp.max(axis=1, keepdims=True)
    feasible = exp + m >= top - m  # classes that outputs within m of the build's could make the argmax
    possible = feasible[np.arange(len(truth)), truth]
    sure = possible & (feasible.sum(axis=1) == 1)
    band = Band(lo=float(np.mean(sure)), hi=float(np.mean(possible)))
    return OutputBands(rule=rule, score=band, agreement=band)


def _continuous(check: OutputCheck, reference: np.ndarray, expected: np.ndarray, m: float) -> OutputBands:
    count = len(reference)
    gap = np.abs(expected - reference)
    least, most = np.maximum(gap - m, 0.0), gap + m
    per_least = least.reshape(count, -1).max(axis=1) if gap.size else np.zeros(count)
    per_most = most.reshape(count, -1).max(axis=1) if gap.size else np.zeros(count)
    max_abs = Band(lo=float(per_least.max(initial=0.0)), hi=float(per_most.max(initial=0.0)))
    signal = float(np.sum(reference**2))
    noise_least, noise_most = float(np.sum(least**2)), float(np.sum(most**2))
    sqnr = Band(lo=_sqnr(signal, noise_most), hi=_sqnr(signal, noise_least))
    tolerance = check.max_abs_error
    if tolerance is not None:
        limit = tolerance * (1 + 1e-9)
        agreement = Band(lo=float(np.mean(per_most <= limit)), hi=float(np.mean(per_least <= limit)))
    else:  # the device falls back to 1 when its check passed, 0 otherwise
        agreement = Band(lo=0.0, hi=1.0)
    norm = math.sqrt(signal)
    distance = math.sqrt(noise_most)
    # |y - r| ≥ |r| sin(angle): the most distant y still has its cosine at least this
    cos_lo = math.sqrt(max(0.0, 1.0 - (distance / norm) ** 2)) if norm > 0 and distance < norm else -1.0
    return OutputBands(
        rule="continuous", score=Band(lo=cos_lo, hi=1.0), agreement=agreement, max_abs=max_abs, sqnr_db=sqnr
    )


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return 0.0
    return float(min(SQNR_CAP_DB, 10.0 * math.log10(signal / noise)))


__all__ = ["SLACK", "Band", "OutputBands", "generative_bands", "golden_bands", "output_bands"]
