"""The shadow runner: sampling, the CPU budget, and agreement by the served bundle's per-output rules.

Its runner here is the digits CNN in onnxruntime (served) and a negated copy of its logits (shadow)."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
import pytest

from edgefleet.agent.quality.shadow import ShadowConfig, ShadowRunner
from edgefleet.core.quality.output_rules import derive_check

from support.paths import DIGITS


@pytest.fixture(scope="module")
def served() -> ort.InferenceSession:
    return ort.InferenceSession(str(DIGITS / "digits_cnn.onnx"), providers=["CPUExecutionProvider"])


def _images(count: int) -> np.ndarray:
    with np.load(DIGITS / "eval.npz") as data:
        return np.asarray(data["input"][:count])


def _wait(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_disagreeing_shadow_reports_its_agreement_by_the_served_rule(served: ort.InferenceSession) -> None:
    images = _images(40)
    answers = [{"logits": served.run(None, {"input": x})[0]} for x in images]
    check = derive_check(
        "logits", np.stack([a["logits"] for a in answers]), np.stack([a["logits"] for a in answers]), 1e-3
    )

    def negated(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"logits": -served.run(None, feeds)[0]}

    runner = ShadowRunner("shadow-b", negated, {"logits": check}, ShadowConfig(share=1.0, cpu_budget=4.0, queue=64))
    try:
        for x, answer in zip(images, answers, strict=True):
            assert runner.offer({"input": x}, answer) is None  # the caller gets nothing back from the shadow
        _wait(lambda: runner.mirrored + runner.dropped >= 40)
        report = runner.report()
    finally:
        runner.close()
    assert report.bundle_id == "shadow-b" and report.requests + report.dropped == 40
    (scored,) = report.per_output
    assert scored.rule == "class-agreement" and not scored.passed and report.agreement is not None
    assert report.agreement < 0.2 and report.latency is not None and report.latency.count == report.requests


def test_a_share_of_requests_is_mirrored_and_a_spent_budget_drops_the_rest(served: ort.InferenceSession) -> None:
    images = _images(100)
    answer = {"logits": served.run(None, {"input": images[0]})[0]}

    def slow(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        end = time.thread_time() + 0.02  # 20 ms of CPU per mirrored request
        while time.thread_time() < end:
            pass
        return answer

    runner = ShadowRunner("s", slow, {}, ShadowConfig(share=0.1, cpu_budget=0.01, queue=64))
    try:
        for x in images:
            runner.offer({"input": x}, answer)
        _wait(lambda: runner.mirrored + runner.dropped >= 10)
        assert runner.mirrored + runner.dropped == 10  # 10 % of 100
        for x in images:  # the cost per request is known now: 1 % of a core cannot pay 20 ms per request
            runner.offer({"input": x}, answer)
        _wait(lambda: runner.mirrored + runner.dropped >= 20)
    finally:
        runner.close()
    assert runner.mirrored + runner.dropped == 20 and runner.dropped >= 9


def test_continuous_outputs_are_compared_by_sqnr_and_cosine() -> None:
    rng = np.random.default_rng(0)
    values = rng.random((64, 1, 1)).astype(np.float32)
    check = derive_check("y", values, values, 1e-3)
    assert check.rule == "continuous"
    runner = ShadowRunner(
        "s", lambda feeds: {"y": feeds["x"] + 0.01}, {"y": check}, ShadowConfig(share=1.0, cpu_budget=4.0, queue=64)
    )
    try:
        for v in values:
            runner.offer({"x": v}, {"y": v})
        _wait(lambda: runner.mirrored == 64)
        (scored,) = runner.report().per_output
    finally:
        runner.close()
    assert scored.rule == "continuous" and not scored.passed and scored.detail["sqnr_db"] < 80


def test_a_shadow_that_answers_nan_fails_its_report_instead_of_breaking_it() -> None:
    """NaN makes every continuous figure NaN, which a report refuses to carry: the output fails with a score of 0."""
    values = np.random.default_rng(1).random((8, 1, 1)).astype(np.float32)
    check = derive_check("y", values, values, 1e-3)
    runner = ShadowRunner(
        "s", lambda feeds: {"y": feeds["x"] * np.nan}, {"y": check}, ShadowConfig(share=1.0, cpu_budget=4.0, queue=64)
    )
    try:
        for v in values:
            runner.offer({"x": v}, {"y": v})
        _wait(lambda: runner.mirrored == 8)
        (scored,) = runner.report().per_output
    finally:
        runner.close()
    assert not scored.passed and scored.score == 0.0 and scored.detail["non_finite"] == 1.0
