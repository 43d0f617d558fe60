"""SQNR judged by slices: the lowest signal-to-quantization-noise ratio (dB) over every float output and, inside
each output, over the groups of channels whose scales differ (edgefleet/core/quality/sqnr_slices.py, shared with the
device's golden check). The worst slice decides."""

from __future__ import annotations

import numpy as np

from edgefleet.converter.metrics.base import Metric, Outputs
from edgefleet.core.quality.output_rules import SQNR_CAP_DB, sqnr_db  # one SQNR, the converter's and the device's
from edgefleet.core.quality.sqnr_slices import MAX_AXIS, SPREAD, Slice, groups, slice_report, worst_sqnr

__all__ = ["MAX_AXIS", "SPREAD", "SQNR", "SQNR_CAP_DB", "Slice", "groups", "slice_report", "sqnr_db", "worst_sqnr"]


def _score(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> float:
    return worst_sqnr(candidate, reference)


SQNR = Metric("sqnr-db", _score, "lowest SQNR (dB) over the float outputs and their channel groups of one scale")
