"""Golden checks per output kind: which rule judges an output, with which tolerances, and its score.

An output's kind is read from its data (the FP32 reference outputs, stacked per sample: (samples, *shape)):
- integer, boolean and string outputs are labels or ids (skl2onnx's `output_label`, class names as strings): one
  value per sample → class-agreement (exact equality), several → position-agreement;
- float outputs with one axis of 2..100,000 entries per sample whose argmax varies over the samples → class scores:
  class-agreement (per-sample argmax) and top-k;
- float outputs with two axes (positions × classes) whose rows are distributions (probabilities or
  log-probabilities, as CTC and token heads emit) → position-agreement (per-position argmax over the last axis);
- anything else (one value per sample, probabilities of one event, heatmaps, regressions, embeddings, recurrent
  state) → continuous: SQNR, cosine and max-abs error against the FP32 reference.

Tolerances come from the built artifact's own spread against the FP32 reference on the evaluation data: an
artifact that matched bit for bit gets tight floors, a quantized one gets floors a margin below what it measured.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgefleet.core.bundle.manifest import OutputCheck
from edgefleet.core.messages import OutputRule, OutputScore

SQNR_CAP_DB = 120.0
MAX_CLASSES = 100_000
TOP_K = 5
EXACT_SQNR_DB = 100.0  # an artifact at least this close to FP32 is treated as exact
_EXACT_MARGIN_DB, _MARGIN_DB = 40.0, 10.0
_MIN_SAMPLES_FOR_VARIETY = 8


def is_label(array: np.ndarray) -> bool:
    """Integer, boolean or string values: compared exactly, never as numbers."""
    return array.dtype.kind in "biuOUS"


def as_labels(array: np.ndarray) -> np.ndarray:
    """String outputs arrive from runtimes as object arrays of str: the same values as a unicode array."""
    return array.astype(str) if array.dtype.kind in "OS" else array


def _core_dims(array: np.ndarray) -> list[int]:
    return [d for d in array.shape[1:] if d != 1]


def _rows_are_distributions(rows: np.ndarray) -> bool:
    rows = rows.astype(np.float64)
    if rows.size == 0 or not np.all(np.isfinite(rows)):
        return False
    if rows.min() >= -1e-6 and np.allclose(rows.sum(axis=1), 1.0, atol=1e-3):
        return True
    if rows.max() <= 1e-6:
        peak = rows.max(axis=1, keepdims=True)
        logsumexp = peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))
        return bool(np.allclose(logsumexp, 0.0, atol=1e-3))
    return False


def classify(reference: np.ndarray) -> OutputRule:
    """The rule for one output, from its FP32 reference outputs stacked per sample."""
    dims = _core_dims(reference)
    if is_label(reference):
        return "class-agreement" if int(np.prod(dims)) <= 1 else "position-agreement"
    if not np.issubdtype(reference.dtype, np.floating):
        return "continuous"
    if len(dims) == 1 and 2 <= dims[0] <= MAX_CLASSES:
        top = reference.reshape(len(reference), -1).argmax(axis=1)
        if len(reference) >= _MIN_SAMPLES_FOR_VARIETY and np.unique(top).size == 1:
            return "continuous"  # the same "class" for every sample: a vector of values, not class scores
        return "class-agreement"
    sequence = len(dims) == 2 and reference.shape[-1] == dims[-1] and 2 <= dims[-1] <= MAX_CLASSES
    if sequence and _rows_are_distributions(reference.reshape(-1, reference.shape[-1])):
        return "position-agreement"
    return "continuous"


def predicted(values: np.ndarray, rule: OutputRule) -> np.ndarray:
    """Per sample (class rule: (samples, labels)) or per position (position rule: (samples, positions))."""
    count = len(values)
    if is_label(values):
        return as_labels(values).reshape(count, -1)
    if rule == "class-agreement":
        return values.reshape(count, -1).argmax(axis=1)[:, None]
    return values.reshape(count, -1, values.shape[-1]).argmax(axis=-1)


def sqnr_db(got: np.ndarray, want: np.ndarray) -> float:
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    noise = float(np.sum((want64 - got64) ** 2))
    signal = float(np.sum(want64**2))
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return 0.0
    return float(min(SQNR_CAP_DB, 10.0 * np.log10(signal / noise)))


def cosine(got: np.ndarray, want: np.ndarray) -> float:
    a, b = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


def _per_sample_max_abs(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).reshape(len(want), -1)
    return diff.max(axis=1) if diff.shape[1] else np.zeros(len(want))


def _top_k_share(got: np.ndarray, want: np.ndarray, k: int) -> float:
    scores = got.reshape(len(got), -1)
    truth = want.reshape(len(want), -1).argmax(axis=1)
    top = np.argpartition(-scores, kth=min(k, scores.shape[1]) - 1, axis=1)[:, :k]
    return float(np.mean(np.any(top == truth[:, None], axis=1)))


def measure(rule: OutputRule, got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """The figures a rule looks at, for outputs `got` against the reference `want` (same shape, stacked)."""
    figures: dict[str, float] = {}
    floating = np.issubdtype(want.dtype, np.floating)
    if floating:
        per_sample = _per_sample_max_abs(got, want)
        figures["max_abs"] = float(per_sample.max()) if per_sample.size else 0.0
        figures["sqnr_db"] = sqnr_db(got, want)
        figures["cosine"] = cosine(got, want)
    if rule != "continuous":
        agree = predicted(got, rule) == predicted(want, rule)
        figures["agreement"] = float(np.mean(agree.all(axis=1) if rule == "class-agreement" else agree))
        classes = int(np.prod(_core_dims(want))) if floating and rule == "class-agreement" else 0
        if classes > 2:
            k = min(TOP_K, classes - 1)
            figures["top_k"] = _top_k_share(got, want, k)
            figures["k"] = float(k)
    return figures


def derive_check(
    name: str, reference: np.ndarray, artifact: np.ndarray, legacy_max_abs: float, rule: OutputRule | None = None
) -> OutputCheck:
    """The rule and tolerances for one output, from the artifact's own spread against the FP32 reference.

    `legacy_max_abs` is the bundle-wide |device - build| tolerance; a continuous output's max-abs tolerance
    against FP32 is the larger of it and twice the artifact's own largest error. `rule`: the rule the task says
    the output calls for (an embedding judged by cosine is continuous whatever its argmax does), else `classify`'s.
    """
    rule = rule if rule is not None and not is_label(reference) else classify(reference)
    spread = measure(rule, artifact, reference)
    count = len(reference)
    if rule == "continuous":
        sqnr = spread.get("sqnr_db", SQNR_CAP_DB)
        margin = _EXACT_MARGIN_DB if sqnr >= EXACT_SQNR_DB else _MARGIN_DB
        distance = 1.0 - spread.get("cosine", 1.0)
        return OutputCheck(
            output=name,
            rule=rule,
            min_sqnr_db=round(min(sqnr, SQNR_CAP_DB) - margin, 3),
            min_cosine=1.0 - max(4.0 * distance, 1e-6),
            max_abs_error=max(legacy_max_abs, 2.0 * spread.get("max_abs", 0.0)),
            measured=spread,
        )
    units = count if rule == "class-agreement" else max(1, predicted(reference, rule).size)
    slack = max(1.0 / units, 0.005)
    top_k = spread.get("top_k")
    return OutputCheck(
        output=name,
        rule=rule,
        min_agreement=max(0.0, spread["agreement"] - slack),
        top_k=int(spread["k"]) if "k" in spread else None,
        min_top_k=max(0.0, top_k - 1.0 / count) if top_k is not None else None,
        measured=spread,
    )


def derive_checks(
    reference: Mapping[str, np.ndarray],
    artifact: Mapping[str, np.ndarray],
    legacy_max_abs: float,
    rules: Mapping[str, OutputRule] | None = None,
) -> list[OutputCheck]:
    """Every output's check; `rules`: outputs whose rule the task decided (see derive_check)."""
    given = rules or {}
    return [derive_check(name, ref, artifact[name], legacy_max_abs, given.get(name)) for name, ref in reference.items()]


def score(check: OutputCheck, got: np.ndarray | None, want: np.ndarray) -> OutputScore:
    """One output's continuous score and verdict under its check. Higher `score` is better."""
    if got is None or got.shape != want.shape:
        shape = None if got is None else list(got.shape)
        return OutputScore(
            output=check.output, rule=check.rule, score=0.0, passed=False,
            detail={"shape_mismatch": 1.0, "got_rank": float(len(shape) if shape else -1)},
        )  # fmt: skip
    if got.dtype.kind in "fc" and not np.all(np.isfinite(got)):
        # NaN or infinity: no figure of it means anything, and a NaN compares below no floor, so it fails here
        bad = int(np.count_nonzero(~np.isfinite(got)))
        return OutputScore(
            output=check.output, rule=check.rule, score=0.0, passed=False,
            detail={"non_finite": 1.0, "non_finite_values": float(bad)},
        )  # fmt: skip
    figures = measure(check.rule, got, want)
    failures: list[bool] = []
    if check.rule == "continuous":
        headline = figures.get("cosine", 1.0)
        if check.max_abs_error is not None and "max_abs" in figures:
            within = _per_sample_max_abs(got, want) <= check.max_abs_error * (1 + 1e-9)
            figures["sample_agreement"] = float(np.mean(within))
            failures.append(figures["max_abs"] > check.max_abs_error * (1 + 1e-9))
        if check.min_sqnr_db is not None:
            failures.append(figures.get("sqnr_db", SQNR_CAP_DB) < check.min_sqnr_db)
        if check.min_cosine is not None:
            failures.append(headline < check.min_cosine)
    else:
        headline = figures["agreement"]
        if check.min_agreement is not None:
            failures.append(headline < check.min_agreement - 1e-12)
        if check.min_top_k is not None and "top_k" in figures:
            failures.append(figures["top_k"] < check.min_top_k - 1e-12)
    finite = {k: float(v) for k, v in figures.items() if np.isfinite(v)}
    return OutputScore(
        output=check.output, rule=check.rule, score=round(float(headline), 6), passed=not any(failures), detail=finite
    )


def agreement_of(result: OutputScore) -> float:
    """The share of golden samples that agree: the agreement for agreement rules, the share of samples inside
    the max-abs tolerance for continuous outputs (never a blind 1.0 for one value per sample)."""
    if result.rule == "continuous":
        return result.detail.get("sample_agreement", result.score if result.passed else 0.0)
    return result.score


def explain(result: OutputScore, check: OutputCheck) -> str:
    """A short reason for a failed score."""
    d = result.detail
    if "shape_mismatch" in d:
        return f"output {result.output!r} is missing or has the wrong shape"
    if "non_finite" in d:
        return f"output {result.output!r} holds {d.get('non_finite_values', 0):.0f} NaN or infinite value(s)"
    if result.rule == "continuous":
        parts = []
        if check.min_sqnr_db is not None and d.get("sqnr_db", SQNR_CAP_DB) < check.min_sqnr_db:
            parts.append(f"SQNR {d['sqnr_db']:.1f} dB < {check.min_sqnr_db:.1f} dB")
        if check.min_cosine is not None and result.score < check.min_cosine:
            parts.append(f"cosine {result.score:.6f} < {check.min_cosine:.6f}")
        if check.max_abs_error is not None and d.get("max_abs", 0.0) > check.max_abs_error:
            parts.append(f"max |error| {d['max_abs']:.3g} > {check.max_abs_error:.3g}")
        return f"output {result.output!r}: " + ", ".join(parts)
    parts = [f"agreement {result.score:.3f} (floor {check.min_agreement or 0:.3f})"]
    if check.min_top_k is not None and "top_k" in d:
        parts.append(f"top-{check.top_k} {d['top_k']:.3f} (floor {check.min_top_k:.3f})")
    return f"output {result.output!r}: " + ", ".join(parts)
