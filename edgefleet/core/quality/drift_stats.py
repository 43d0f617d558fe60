"""Drift statistics shared by the converter (reference) and the agent (live window): binned features, PSI, KS.

What is binned, per request or per reference sample:
- an input: its element values, per channel when the tensor has a channel axis (NCHW with 2-16 channels, or
  NHWC with 2-4), over quantile bins of the reference data (open at both ends, so nothing falls outside);
- a class-scores output: the predicted class (categorical) and the top-class confidence (softmax of the
  scores unless they already are probabilities) over quantile bins;
- a per-position output: the predicted class at each position;
- any other output: its values over quantile bins.
Large tensors are read with a stride (at most MAX_VALUES values per request and feature), so the cost per
request is bounded whatever the model.

PSI = Σ (live − ref) · ln(live / ref) over the bins (proportions floored at EPSILON); the conventional bands are
< 0.1 none, 0.1-0.25 moderate, > 0.25 drift. KS is the largest gap between the two cumulative distributions
over the same (ordered) bins, so it is reported for binned values and confidence, not for classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.core.messages import DriftBand, OutputRule

DRIFT_SCHEMA_VERSION = 1
BINS = 10
MAX_VALUES = 4096
EPSILON = 1e-4
DEFAULT_BANDS = (0.1, 0.25)

Feature = Literal["values", "classes", "confidence"]


class FeatureReference(BaseModel):
    """The reference histogram of one feature."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(description="input or output name; a channel is name[c], confidence is name:confidence")
    kind: Literal["input", "output"]
    tensor: str = Field(description="the input or output it is read from")
    feature: Feature
    channel_axis: int | None = Field(default=None, description="axis of the request tensor holding channels")
    channel: int | None = None
    edges: list[float] = Field(default_factory=list, description="inner bin edges (values, confidence)")
    classes: int = Field(default=0, ge=0, description="number of classes (classes feature)")
    proportions: list[float] = Field(description="share of the reference data in each bin")
    samples: int = Field(ge=1, description="reference samples behind the histogram")

    @property
    def bins(self) -> int:
        return len(self.proportions)


class DriftReference(BaseModel):
    """Shipped in the bundle as drift_reference.json and pinned by the manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = DRIFT_SCHEMA_VERSION
    features: list[FeatureReference]


# --- reading features out of tensors (the same code for the reference and for live traffic)
def channel_axis(shape: tuple[int, ...]) -> int | None:
    """The channel axis of one request tensor (batch first), or None when it has none worth splitting."""
    if len(shape) == 4 and 2 <= shape[1] <= 16:
        return 1
    if len(shape) == 4 and shape[1] > 16 and 2 <= shape[3] <= 4:
        return 3
    return None


def _strided(values: np.ndarray) -> np.ndarray:
    flat = values.reshape(-1)
    if flat.size > MAX_VALUES:
        flat = flat[:: -(-flat.size // MAX_VALUES)]
    return flat


def _softmax_top(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    if rows.min(initial=0.0) >= 0.0 and np.allclose(rows.sum(axis=1), 1.0, atol=1e-3):
        return np.asarray(rows.max(axis=1))
    shifted = rows - rows.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(1.0 / exp.sum(axis=1))  # the top entry's share: exp(0) / Σ exp


def extract(ref: FeatureReference, tensor: np.ndarray) -> np.ndarray:
    """The values of one feature in one tensor (a request's, or the reference data stacked with its own
    batch axis folded in)."""
    if ref.feature == "values":
        if ref.channel_axis is not None and ref.channel is not None:
            return _strided(np.take(tensor, ref.channel, axis=ref.channel_axis)).astype(np.float64)
        return _strided(tensor).astype(np.float64)
    if np.issubdtype(tensor.dtype, np.integer) or tensor.ndim == 0:
        labels = _strided(tensor).astype(np.int64)
        return labels if ref.feature == "classes" else np.zeros(0)
    rows = tensor.reshape(-1, tensor.shape[-1])
    if rows.shape[0] > MAX_VALUES:
        rows = rows[:: -(-rows.shape[0] // MAX_VALUES)]
    if ref.feature == "classes":
        return rows.argmax(axis=1)
    return _softmax_top(rows)


def counts(ref: FeatureReference, values: np.ndarray) -> np.ndarray:
    """Bin counts of extracted values under the reference's bins."""
    if ref.feature == "classes":
        # class indices outside the reference's range (labels it never saw) go to one extra bin
        index = np.where((values >= 0) & (values < ref.classes), values, ref.classes)
        return np.bincount(index.astype(np.int64), minlength=ref.bins)[: ref.bins]
    index = np.searchsorted(np.asarray(ref.edges), values, side="left")
    return np.bincount(index, minlength=ref.bins)


def counts_batch(ref: FeatureReference, stacked: np.ndarray) -> np.ndarray:
    """Bin counts per request, (requests, bins), for requests of one shape stacked on a new axis 0: the same
    figures as `counts(ref, extract(ref, tensor))` per request, in a handful of numpy calls for the batch."""
    n = len(stacked)
    if ref.feature == "values":
        if ref.channel_axis is not None and ref.channel is not None:
            stacked = np.take(stacked, ref.channel, axis=ref.channel_axis + 1)
        values = stacked.reshape(n, -1)
        if values.shape[1] > MAX_VALUES:
            values = values[:, :: -(-values.shape[1] // MAX_VALUES)]
        index = np.searchsorted(np.asarray(ref.edges), values.astype(np.float64), side="left")
    elif np.issubdtype(stacked.dtype, np.integer) or stacked.ndim == 1:
        if ref.feature != "classes":
            return np.zeros((n, ref.bins), dtype=np.int64)
        labels = stacked.reshape(n, -1).astype(np.int64)
        index = np.where((labels >= 0) & (labels < ref.classes), labels, ref.classes)
    else:
        rows = stacked.reshape(n, -1, stacked.shape[-1])
        if rows.shape[1] > MAX_VALUES:
            rows = rows[:, :: -(-rows.shape[1] // MAX_VALUES)]
        if ref.feature == "classes":
            index = rows.argmax(axis=-1)
        else:
            top = _softmax_top(rows.reshape(-1, rows.shape[-1])).reshape(n, -1)
            index = np.searchsorted(np.asarray(ref.edges), top, side="left")
    flat = (index + np.arange(n)[:, None] * ref.bins).reshape(-1)
    return np.bincount(flat, minlength=n * ref.bins).reshape(n, ref.bins)


def psi(reference: np.ndarray, live_counts: np.ndarray) -> float:
    total = float(live_counts.sum())
    if total <= 0:
        return 0.0
    expected = np.maximum(reference, EPSILON)
    actual = np.maximum(live_counts / total, EPSILON)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def ks(reference: np.ndarray, live_counts: np.ndarray) -> float:
    total = float(live_counts.sum())
    if total <= 0:
        return 0.0
    return float(np.max(np.abs(np.cumsum(reference) - np.cumsum(live_counts / total))))


def band(value: float, bands: tuple[float, float] = DEFAULT_BANDS) -> DriftBand:
    moderate, drift = bands
    if value > drift:
        return "drift"
    if value >= moderate:
        return "moderate"
    return "none"


# --- building the reference (host side, from calibration and evaluation data)
def _quantile_reference(
    name: str, kind: Literal["input", "output"], tensor: str, feature: Feature, values: np.ndarray, samples: int,
    **extra: object,
) -> FeatureReference:  # fmt: skip
    edges = np.unique(np.quantile(values, np.linspace(0, 1, BINS + 1)[1:-1])) if values.size else np.zeros(0)
    draft = FeatureReference(
        name=name, kind=kind, tensor=tensor, feature=feature, edges=[float(e) for e in edges],
        proportions=[0.0] * (len(edges) + 1), samples=samples, **extra,
    )  # fmt: skip
    binned = counts(draft, values)
    return draft.model_copy(update={"proportions": [float(p) for p in binned / max(1, binned.sum())]})


def _stack_requests(stacked: np.ndarray) -> np.ndarray:
    """(samples, *request shape) → one tensor with the samples folded into the request's batch axis."""
    if stacked.ndim >= 2:
        return stacked.reshape(-1, *stacked.shape[2:])
    return stacked


def build_reference(
    inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], rules: Mapping[str, OutputRule]
) -> DriftReference:
    """Reference statistics from data stacked per sample ((samples, *request shape), as golden sets are)."""
    features: list[FeatureReference] = []
    for name, stacked in inputs.items():
        if not np.issubdtype(stacked.dtype, np.number) or stacked.size == 0:
            continue
        tensor = _stack_requests(stacked)
        axis = channel_axis(stacked.shape[1:]) if stacked.ndim >= 2 else None
        if axis is None:
            features.append(_quantile_reference(name, "input", name, "values", tensor.reshape(-1), len(stacked)))
            continue
        for c in range(tensor.shape[axis]):
            values = np.take(tensor, c, axis=axis).reshape(-1)
            features.append(
                _quantile_reference(
                    f"{name}[{c}]", "input", name, "values", values, len(stacked), channel_axis=axis, channel=c
                )
            )
    for name, stacked in outputs.items():
        if stacked.dtype.kind in "OUS":  # class names as strings: no numeric distribution to watch
            continue
        rule = rules.get(name, "continuous")
        tensor = _stack_requests(stacked)
        integer = np.issubdtype(stacked.dtype, np.integer)
        if rule == "continuous" or (integer and int(stacked.max(initial=0)) >= 1000):
            if np.issubdtype(stacked.dtype, np.number) and stacked.size:
                features.append(_quantile_reference(name, "output", name, "values", tensor.reshape(-1), len(stacked)))
            continue
        classes = int(stacked.max(initial=0)) + 1 if integer else int(stacked.shape[-1])
        draft = FeatureReference(
            name=name, kind="output", tensor=name, feature="classes", classes=classes,
            proportions=[0.0] * (classes + 1), samples=len(stacked),
        )  # fmt: skip
        binned = counts(draft, extract(draft, tensor))
        features.append(draft.model_copy(update={"proportions": [float(p) for p in binned / max(1, binned.sum())]}))
        if not integer and rule == "class-agreement":
            probe = FeatureReference(
                name=f"{name}:confidence", kind="output", tensor=name, feature="confidence", proportions=[1.0],
                samples=len(stacked),
            )  # fmt: skip
            confidence = extract(probe, tensor)
            features.append(
                _quantile_reference(f"{name}:confidence", "output", name, "confidence", confidence, len(stacked))
            )
    return DriftReference(features=features)
