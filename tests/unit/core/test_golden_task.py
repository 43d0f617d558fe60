"""The device's golden check judges with the bundle's task rule (the metric and bar the converter chose the recipe
by, recorded in the manifest's `search`) where a device can compute it, says which rule judged, and keeps the
per-output checks alone for manifests without the field or with a user's metric whose code is not shipped."""

from __future__ import annotations

import numpy as np

from edgefleet.core.bundle.manifest import GoldenSpec, SearchReport
from edgefleet.core.quality.golden import GoldenSet, compare
from edgefleet.core.quality.output_rules import derive_checks
from edgefleet.core.tensors import Dataset

RNG = np.random.default_rng(11)


def _spec(golden: GoldenSet, max_abs: float) -> GoldenSpec:
    checks = derive_checks(golden.reference, golden.expected, max_abs)
    return GoldenSpec(count=len(golden.inputs), max_abs_error=max_abs, min_agreement=0.0, outputs=checks)


def _detector(samples: int = 16, classes: int = 3, anchors: int = 64) -> np.ndarray:
    """YOLOv8-style head [samples, 4 + classes, anchors]: boxes in pixels (0-320), class scores in [0, 1]."""
    boxes = np.concatenate(
        [RNG.uniform(40, 280, (samples, 2, anchors)), RNG.uniform(10, 50, (samples, 2, anchors))], axis=1
    )
    scores = RNG.uniform(0.0, 0.05, (samples, classes, anchors))
    for sample in range(samples):
        for anchor in RNG.choice(anchors, 4, replace=False):
            scores[sample, RNG.integers(classes), anchor] = RNG.uniform(0.6, 0.95)
    return np.concatenate([boxes, scores], axis=1).astype(np.float32)


def test_a_detector_whose_class_scores_break_on_the_device_fails_by_detections_where_the_tensor_checks_pass() -> None:
    reference = _detector()
    expected = reference.copy()
    expected[:, :4] += RNG.normal(0, 0.5, expected[:, :4].shape).astype(np.float32)  # an INT8 build: boxes move a bit
    golden = GoldenSet(Dataset({"x": np.zeros((16, 1, 3), np.float32)}, None), {"y": reference}, {"y": expected})
    spec = _spec(golden, max_abs=0.05 * 320)
    device = expected.copy()
    device[:, 4:] = device[:, 4:][:, ::-1]  # the device's kernels swap classes 0 and 2: their detections are wrong
    search = SearchReport(metric="detection-f1", bar=0.9, max_drop=0.1)
    blind = compare({"y": device}, golden, spec)  # today's checks: the whole tensor is dominated by the boxes
    assert blind.passed and blind.rule == "per-output checks"
    judged = compare({"y": device}, golden, spec, search)
    assert not judged.passed and judged.rule == "task rule detection-f1"
    assert judged.reason.startswith("task rule detection-f1 0.") and "is below its floor 0.9" in judged.reason
    healthy = compare({"y": expected}, golden, spec, search)
    assert healthy.passed and healthy.reason.startswith("judged by task rule detection-f1 1 meets its floor 0.9")


def _heatmap(samples: int = 8) -> np.ndarray:
    return RNG.uniform(0, 1, (samples, 1, 16, 16)).astype(np.float32)


def test_a_heatmap_is_judged_by_mask_iou_at_its_threshold_with_the_recorded_min_score() -> None:
    reference = _heatmap()
    golden = GoldenSet(Dataset({"x": np.zeros((8, 1, 2), np.float32)}, None), {"m": reference}, {"m": reference})
    spec = _spec(golden, max_abs=1.0)
    search = SearchReport(metric="mask-iou@0.3", bar=0.9, min_score=0.9)
    slightly = np.clip(reference + 0.01, 0, 1)  # a device whose heatmap moves a little: the mask barely changes
    kept = compare({"m": slightly}, golden, spec, search)
    assert kept.rule == "task rule mask-iou@0.3" and "meets its floor 0.9 (--min-score 0.9)" in kept.reason
    assert not kept.passed  # the per-output checks (an exact build: tight floors) still hold it to the build
    grown = np.clip(reference + 0.2, 0, 1)  # the mask at 0.3 grows by a third
    verdict = compare({"m": grown}, golden, spec, search)
    assert not verdict.passed and verdict.reason.startswith("task rule mask-iou@0.3 0.7"), verdict.reason


def test_top1_with_the_golden_labels_allows_the_recorded_drop_below_fp32s_own_accuracy() -> None:
    logits = RNG.normal(size=(50, 1, 5)).astype(np.float32)
    labels = logits.reshape(50, 5).argmax(axis=1)
    labels[:5] = (labels[:5] + 1) % 5  # FP32 is right on 45 of 50: 0.90
    golden = GoldenSet(Dataset({"x": np.zeros((50, 1, 2), np.float32)}, labels), {"l": logits}, {"l": logits})
    spec = GoldenSpec(count=50, max_abs_error=100.0, min_agreement=0.0)  # an old manifest: checks derived on device
    search = SearchReport(metric="top1", bar=0.88, max_drop=0.02)
    one_wrong = logits.copy()
    one_wrong[10] = -one_wrong[10]  # one more sample wrong: 0.88, inside the drop of 0.02
    verdict = compare({"l": one_wrong}, golden, spec, search)
    assert verdict.passed, verdict.reason
    assert verdict.reason.startswith("judged by task rule top1 0.88 meets its floor 0.88 (FP32's 0.9 on the golden")
    three_wrong = logits.copy()
    three_wrong[10:13] = -three_wrong[10:13]
    verdict = compare({"l": three_wrong}, golden, spec, search)
    assert not verdict.passed and "task rule top1 0.84 is below its floor 0.88" in verdict.reason, verdict.reason


def test_the_floor_is_the_builds_own_score_when_the_golden_samples_already_fall_below_the_bar() -> None:
    reference = RNG.normal(size=(64, 1, 4)).astype(np.float32)
    expected = reference.copy()
    expected[:2] = expected[:2][:, :, ::-1]  # the build disagrees on 2 of these 64 samples: 0.969 < the bar 0.99
    golden = GoldenSet(Dataset({"x": np.zeros((64, 1, 2), np.float32)}, None), {"p": reference}, {"p": expected})
    spec = GoldenSpec(count=64, max_abs_error=1e9, min_agreement=0.0)
    search = SearchReport(metric="argmax-agreement", bar=0.99, max_drop=0.01)
    same = compare({"p": expected}, golden, spec, search)
    assert same.passed and "the build itself scored 0.9688 on these golden samples" in same.reason, same.reason
    worse = expected.copy()
    worse[2:6] = worse[2:6][:, :, ::-1]
    assert not compare({"p": worse}, golden, spec, search).passed


def test_older_manifests_and_user_metrics_keep_the_per_output_checks_and_say_so() -> None:
    reference = RNG.normal(size=(16, 1, 6)).astype(np.float32)
    golden = GoldenSet(Dataset({"x": np.zeros((16, 1, 2), np.float32)}, None), {"p": reference}, {"p": reference})
    spec = _spec(golden, max_abs=1e-3)
    old = compare({"p": reference}, golden, spec)
    assert old.passed and old.rule == "per-output checks" and not old.reason.startswith("judged by")
    user = compare({"p": reference}, golden, spec, SearchReport(metric="my_metric.py:score", bar=0.5))
    assert user.passed and user.rule == "per-output checks"
    assert "the task metric my_metric.py:score cannot be computed on the device" in user.reason
    drifted = compare({"p": reference + 1.0}, golden, spec, SearchReport(metric="my_metric.py:score", bar=0.5))
    assert not drifted.passed  # the per-output checks still judge
