"""Task metrics and the default gate: a mixed output is judged by its worst slice, detection heads by their
detections, and a user's metric drives a conversion end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.metrics import detection, names, resolve
from edgefleet.converter.search.gate import Budget, gate, plan_metric, score
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.errors import ConversionError, UserInputError
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.paths import DIGITS


def yolo_head(samples: int = 6, classes: int = 3, anchors: int = 200, seed: int = 0) -> np.ndarray:
    """A YOLOv8-style output [samples, 1, 4+classes, anchors]: boxes in pixels (0–320), scores in [0, 1]."""
    rng = np.random.default_rng(seed)
    out = np.zeros((samples, 1, 4 + classes, anchors), np.float32)
    out[:, 0, 0:2] = rng.uniform(40, 280, (samples, 2, anchors))
    out[:, 0, 2:4] = rng.uniform(10, 60, (samples, 2, anchors))
    out[:, 0, 4:] = rng.uniform(0, 0.05, (samples, classes, anchors))
    hits = rng.integers(0, anchors, (samples, 8))
    for s in range(samples):
        out[s, 0, 4 + rng.integers(0, classes, 8), hits[s]] = rng.uniform(0.5, 0.95, 8)
    return out


def test_a_mixed_output_is_judged_by_its_worst_slice() -> None:
    want = {"out": yolo_head()}
    broken = {"out": want["out"].copy()}
    broken["out"][:, 0, 4:] = np.clip(broken["out"][:, 0, 4:] + 0.3, 0, 1)  # scores destroyed, boxes intact
    whole = 10 * np.log10(np.sum(want["out"].astype(np.float64) ** 2) / np.sum((want["out"] - broken["out"]) ** 2))
    assert whole > 30  # an SQNR over the whole tensor would pass it
    plan = plan_metric({"out": want["out"][:, :, :, :]}, None, "sqnr-db")
    result = score(broken, want, None, plan)
    assert result.value < 20 and "axis 2" in result.worst_slice
    reason = gate(result, 120.0, Budget(0.01, 30.0))
    assert reason is not None and "out[axis 2" in reason


def test_a_yolo_head_is_recognized_and_judged_by_its_detections() -> None:
    want = {"out": yolo_head()}
    plan = plan_metric(want, None)
    assert plan.name == "detection-f1" and plan.kind == "detection" and "yolo-attributes-first" in plan.note
    assert score(want, want, None, plan).value == 1.0
    assert plan_metric(want, None, "detection-f1").kind == "detection"  # asked for: the head retry applies too
    shifted = {"out": want["out"].copy()}
    shifted["out"][:, 0, 0] += 40.0  # every box moves 40 px: IoU under 0.5
    assert score(shifted, want, None, plan).value < 0.2
    rescored = {"out": want["out"].copy()}
    rescored["out"][:, 0, 4:] *= 0.5  # same boxes, scores halved: many fall under the confidence or the delta
    assert score(rescored, want, None, plan).value < 0.5
    # Anchors-first with objectness (YOLOv5 / YOLOX) and SSD boxes + scores are recognized too.
    v5 = np.concatenate([want["out"][:, :, :4], want["out"][:, :, 4:5], want["out"][:, :, 4:]], axis=2)
    assert detection.recognize({"o": np.swapaxes(v5, 2, 3)}).kind == "yolo-anchors-first"  # type: ignore[union-attr]
    boxes = np.random.default_rng(1).uniform(0, 1, (4, 1, 100, 4)).astype(np.float32)
    scores = np.random.default_rng(2).uniform(0, 1, (4, 1, 100, 5)).astype(np.float32)
    assert detection.recognize({"boxes": boxes, "scores": scores}).kind == "ssd"  # type: ignore[union-attr]


def test_a_head_without_detections_falls_back_to_the_rule_for_its_shape_and_says_so() -> None:
    quiet = yolo_head()
    quiet[:, 0, 4:] = 0.01
    plan = plan_metric({"out": quiet}, None)
    assert plan.name == "relative-error" and "no detection" in plan.note


def test_builtin_metrics() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(20, 1, 10)).astype(np.float32)
    ref = {"y": logits}
    labels = logits.reshape(20, -1).argmax(axis=1)
    assert resolve("top1")(ref, ref, labels) == 1.0
    swapped = {"y": -logits}
    assert resolve("top5")(ref, swapped, None) < resolve("top5")(ref, ref, None) == 1.0
    seq = {"y": rng.normal(size=(4, 1, 30, 50)).astype(np.float32)}
    noisy = {"y": seq["y"] + rng.normal(0, 0.5, seq["y"].shape).astype(np.float32)}
    assert 0.3 < resolve("per-position-agreement")(seq, noisy, None) < 1.0
    heat = {"m": rng.uniform(0, 1, (3, 1, 1, 16, 16)).astype(np.float32)}
    assert resolve("mask-iou@0.3")(heat, heat, None) == 1.0
    assert resolve("mask-iou@0.3")(heat, {"m": heat["m"] * 0.2}, None) < 0.3
    assert resolve("cosine")(ref, ref, None) == pytest.approx(1.0)
    assert resolve("prob-mae")(ref, {"y": logits + 0.1}, None) == pytest.approx(0.9, abs=1e-5)
    assert "detection-f1" in names() and "path.py:function" in names()
    with pytest.raises(UserInputError, match="unknown metric"):
        resolve("nope")
    with pytest.raises(UserInputError, match="no known detection layout"):
        resolve("detection-f1", ref)


def test_min_score_is_an_absolute_bar() -> None:
    plan = plan_metric({"y": np.zeros((4, 1, 10), np.float32)}, None, "cosine")
    assert Budget(0.01, 30.0, min_score=0.9).floor(plan.name, 1.0) == 0.9
    low = score({"y": np.ones((4, 1, 10), np.float32)}, {"y": np.ones((4, 1, 10), np.float32)}, None, plan)
    assert gate(low, 1.0, Budget(0.01, 30.0, min_score=0.9)) is None


METRIC_FILE = '''
import numpy as np

CALLS = []

def agreement_at_least_one(reference, candidate, labels):
    """Share of samples whose candidate argmax equals the label."""
    got = next(iter(candidate.values())).reshape(len(labels), -1).argmax(axis=1)
    return float(np.mean(got == labels))

def broken(reference, candidate, labels):
    raise ValueError("boom")
'''


def test_a_user_metric_drives_a_conversion_end_to_end(tmp_path: Path, signing_key: SigningKey) -> None:
    metric = tmp_path / "my_metric.py"
    metric.write_text(METRIC_FILE)
    (result,) = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("generic-x86-64")],
            calib=DIGITS / "calib.npz", eval=DIGITS / "eval.npz", out=tmp_path / "out", key=signing_key,
            name="digits", version="1", metric=f"{metric}:agreement_at_least_one", min_score=0.9, report=False,
        )
    )  # fmt: skip
    assert result.bundle is not None, result.error
    assert result.metric == "my_metric.py:agreement_at_least_one"
    manifest = parse_manifest(read_signed_manifest(Path(result.bundle)).manifest_json)
    assert manifest.accuracy.metric == "my_metric.py:agreement_at_least_one" and manifest.accuracy.value >= 0.9
    assert manifest.search is not None and manifest.search.min_score == 0.9 and manifest.search.bar == 0.9
    assert set(manifest.search.scores) >= {c["name"] for c in result.candidates if c["accuracy"] is not None}
    assert manifest.search.threads == [2]  # timed at the thread counts the profile says its devices use
    with pytest.raises(ConversionError, match="boom"):
        convert(
            ConvertRequest(
                model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("generic-x86-64")],
                calib=DIGITS / "calib.npz", eval=DIGITS / "eval.npz", out=tmp_path / "out2", key=signing_key,
                name="digits", version="1", metric=f"{metric}:broken", report=False,
            )
        )  # fmt: skip
    for bad, message in [(f"{metric}:missing", "has no function"), ("nowhere.py:f", "not found")]:
        with pytest.raises(UserInputError, match=message):
            resolve(bad)


@pytest.mark.slow
def test_the_command_line_takes_a_task_metric_a_bar_and_a_time_budget(tmp_path: Path) -> None:
    from support.cli import assert_one_line_error, edgefleet

    assert edgefleet("keys", "generate", home=tmp_path).returncode == 0
    common = ["--profile", "generic-x86-64", "--calib", str(DIGITS / "calib.npz"), "--eval", str(DIGITS / "eval.npz")]
    result = edgefleet(
        "convert", str(DIGITS / "digits_cnn.onnx"), *common, "--out", str(tmp_path / "out"), "--metric", "top2",
        "--min-score", "0.95", "--time-budget", "120", "--json", home=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (profile,) = json.loads(result.stdout)["profiles"]
    assert profile["metric"] == "top2" and profile["accuracy"] >= 0.95
    shown = json.loads(edgefleet("bundle", "show", profile["bundle"], "--json").stdout)["manifest"]
    assert shown["search"]["metric"] == "top2" and shown["search"]["min_score"] == 0.95
    bad = edgefleet(
        "convert", str(DIGITS / "digits_cnn.onnx"), *common, "--out", str(tmp_path / "o2"), "--metric", "f1-ish",
        home=tmp_path,
    )  # fmt: skip
    assert_one_line_error(bad, "unknown metric 'f1-ish'", "mask-iou@THRESHOLD")
