"""Inputs shifted from a dataset, for the drift tests."""

from __future__ import annotations

import numpy as np


def shifted(shift: str, images: np.ndarray, labels: np.ndarray, rng: np.random.Generator, count: int) -> np.ndarray:
    """A stream of `count` digits drawn from `images`, shifted as named."""
    if shift == "class-mix":
        return images[rng.choice(np.flatnonzero(labels < 3), count)]
    x = images[rng.choice(len(images), count)]
    if shift == "brightness":
        return np.clip(x + 0.25, 0, 1).astype(np.float32)
    if shift == "contrast":
        return (x * 0.6).astype(np.float32)
    if shift == "noise":
        return np.clip(x + rng.normal(0, 0.1, x.shape), 0, 1).astype(np.float32)
    if shift == "inverted":
        return (1.0 - x).astype(np.float32)
    raise ValueError(shift)
