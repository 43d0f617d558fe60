"""Drift statistics: reference histograms from the bundle's data, a sliding window of live requests, PSI bands.

The digits CNN is run for real (onnxruntime); streams are drawn from its evaluation data (in distribution) or
shifted (brightness, contrast, noise, inverted digits, another class mix)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest

from edgefleet.agent.quality.drift import DriftConfig, DriftMonitor
from edgefleet.core.quality.drift_stats import DriftReference, band, build_reference, psi

from support.drift import shifted
from support.paths import DIGITS

WINDOW = 256


@pytest.fixture(scope="module")
def digits() -> tuple[Callable[[np.ndarray], np.ndarray], DriftReference, np.ndarray, np.ndarray]:
    session = ort.InferenceSession(str(DIGITS / "digits_cnn.onnx"), providers=["CPUExecutionProvider"])

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(session.run(None, {"input": x})[0])

    with np.load(DIGITS / "calib.npz") as calib, np.load(DIGITS / "eval.npz") as evaluation:
        images, labels = evaluation["input"], evaluation["labels"]
        inputs = np.concatenate([calib["input"], images])
    outputs = np.stack([run(x) for x in images])
    reference = build_reference({"input": inputs}, {"logits": outputs}, {"logits": "class-agreement"})
    return run, reference, images, labels


def _window(digits, images: np.ndarray) -> dict[str, float]:  # type: ignore[no-untyped-def]
    run, reference, _, _ = digits
    monitor = DriftMonitor(reference, DriftConfig(window=WINDOW, min_samples=WINDOW, queue=WINDOW))
    try:
        for x in images:
            monitor.observe({"input": x}, {"logits": run(x)})
        return {score.name: score.psi for score in monitor.scores()}
    finally:
        monitor.close()


def test_the_reference_holds_input_values_output_classes_and_confidence(digits) -> None:  # type: ignore[no-untyped-def]
    _, reference, _, _ = digits
    names = {(f.name, f.feature) for f in reference.features}
    assert names == {("input", "values"), ("logits", "classes"), ("logits:confidence", "confidence")}
    for feature in reference.features:
        assert sum(feature.proportions) == pytest.approx(1.0)


def test_in_distribution_windows_stay_below_the_drift_band(digits) -> None:  # type: ignore[no-untyped-def]
    _, _, images, _ = digits
    rng = np.random.default_rng(1)
    worst = [max(_window(digits, images[rng.choice(len(images), WINDOW)]).values()) for _ in range(10)]
    false_alarms = sum(band(w) == "drift" for w in worst)
    assert false_alarms == 0, f"false alarms {false_alarms}/10, worst PSI per window {sorted(worst)}"


@pytest.mark.parametrize(
    ("shift", "drifting"),
    [
        ("brightness", "input"),
        ("contrast", "input"),
        ("noise", "input"),
        ("inverted", "input"),
        ("class-mix", "logits"),
    ],
)
def test_a_shifted_stream_crosses_the_drift_band_within_one_window(digits, shift: str, drifting: str) -> None:  # type: ignore[no-untyped-def]
    _, _, images, labels = digits
    rng = np.random.default_rng(2)
    stream = shifted(shift, images, labels, rng, WINDOW)
    scores = _window(digits, stream)
    assert scores[drifting] > 0.25, scores


def test_psi_is_zero_for_identical_distributions_and_bands_are_configurable() -> None:
    reference = np.array([0.25, 0.25, 0.5])
    assert psi(reference, np.array([25, 25, 50])) == pytest.approx(0.0)
    assert band(0.05) == "none" and band(0.2) == "moderate" and band(0.3) == "drift"
    assert band(0.05, (0.01, 0.04)) == "drift"


def test_the_window_memory_is_fixed_and_old_requests_leave_it(digits) -> None:  # type: ignore[no-untyped-def]
    run, reference, images, _ = digits
    monitor = DriftMonitor(reference, DriftConfig(window=64, min_samples=64, queue=64))
    try:
        before = monitor.memory_bytes()
        for x in images[:64]:
            monitor.observe({"input": 1.0 - x}, {"logits": run(1.0 - x)})  # a shifted burst ...
        assert max(s.psi for s in monitor.scores()) > 0.25
        for x in images[64:128]:
            monitor.observe({"input": x}, {"logits": run(x)})  # ... then a full window of normal traffic
        assert max(s.psi for s in monitor.scores()) < 0.25
        assert monitor.memory_bytes() == before
    finally:
        monitor.close()


def test_batched_binning_counts_each_request_as_binning_it_alone_would(digits) -> None:  # type: ignore[no-untyped-def]
    from edgefleet.core.quality.drift_stats import counts, counts_batch, extract

    run, reference, images, _ = digits
    batch = {"input": images[:40], "logits": np.stack([run(x) for x in images[:40]])}
    for feature in reference.features:
        stacked = batch[feature.tensor]
        alone = np.stack([counts(feature, extract(feature, t)) for t in stacked])
        assert np.array_equal(counts_batch(feature, stacked), alone), feature.name


def test_image_inputs_with_channels_get_one_histogram_per_channel_and_a_shifted_channel_stands_out() -> None:
    rng = np.random.default_rng(5)
    images = rng.random((200, 1, 3, 6, 6)).astype(np.float32)  # samples of (1, 3, 6, 6): NCHW, three channels
    reference = build_reference({"image": images}, {}, {})
    assert [(f.name, f.channel_axis, f.channel) for f in reference.features] == [
        ("image[0]", 1, 0), ("image[1]", 1, 1), ("image[2]", 1, 2)
    ]  # fmt: skip
    monitor = DriftMonitor(reference, DriftConfig(window=64, min_samples=64, queue=64))
    try:
        for x in rng.random((64, 1, 3, 6, 6)).astype(np.float32):
            x[:, 2] = np.clip(x[:, 2] + 0.3, 0, 1)  # only the third channel brightens
            monitor.observe({"image": x}, {})
        scores = {s.name: s for s in monitor.scores()}
    finally:
        monitor.close()
    assert scores["image[2]"].band == "drift" and scores["image[2]"].ks is not None
    assert scores["image[0]"].band == "none" and scores["image[1]"].band == "none"
