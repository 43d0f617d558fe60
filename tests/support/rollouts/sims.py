"""Thresholds and simulated devices for the model-quality rollout tests."""

from __future__ import annotations

from typing import Any

from support.rollouts.fleet import make_fleet  # noqa: F401  (a module fixture)
from support.simulate.agents import Behavior, BundleBehavior
from support.simulate.quality import QualityBehavior

THRESHOLDS = {"max_latency_factor": 1.5, "max_golden_drop": 0.01, "max_error_rate": 0.05, "min_field_samples": 50}

V1, V2 = "sim-model-1-generic-x86-64", "sim-model-2-generic-x86-64"


def sims(v1: QualityBehavior, v2: QualityBehavior, **options: Any) -> Behavior:
    options.setdefault("requests_per_s", 100.0)
    return Behavior(bundles={V1: BundleBehavior(quality=v1), V2: BundleBehavior(quality=v2)}, **options)
