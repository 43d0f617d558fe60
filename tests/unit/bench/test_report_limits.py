"""bench/report.py never reports a share of a limit above 100 %: a stored row above it (measured before peaks were
raised to what a bundle achieved) reads as 100 % of what it achieved, and says so."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from support.paths import REPO


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_report"] = module
    spec.loader.exec_module(module)
    return module


report = _report()


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ({"limit_pct": 32.4}, "32 %"),
        ({"limit_pct": 150.0}, "100 % (it beat the measured peak, raised to what it achieved)"),  # the row
        (
            {"limit_pct": 100.0, "raised": ["onnxruntime fp32 GOP/s raised from 67 to 101"]},
            "100 % (it beat the measured peak, raised to what it achieved)",
        ),
    ],
)
def test_the_headline_share_of_the_limit_is_at_most_100_percent(line: dict[str, Any], text: str) -> None:
    assert report.limit_share(line) == text


def test_stored_shares_above_100_are_shown_at_100_with_why_and_the_rest_untouched() -> None:
    doc = [
        {"model": "digits", "roofline": {"limit_pct": 150.0, "compute_pct": 150.0, "bandwidth_pct": 3.0}},
        {"model": "u2netp", "roofline": {"limit_pct": 85.0, "compute_pct": 85.0, "bandwidth_pct": 20.0}},
    ]
    fixed = report.bounded(doc)
    assert fixed[0]["roofline"]["limit_pct"] == 100.0 and fixed[0]["roofline"]["compute_pct"] == 100.0
    assert fixed[0]["roofline"]["bandwidth_pct"] == 3.0 and "above 100 %" in fixed[0]["roofline"]["raised"][0]
    assert fixed[1] == doc[1]


def _shares(value: Any) -> list[float]:
    if isinstance(value, list):
        return [v for item in value for v in _shares(item)]
    if isinstance(value, dict):
        own = [v for k, v in value.items() if k in report.SHARES and isinstance(v, int | float)]
        return own + [v for item in value.values() for v in _shares(item)]
    return []


def test_no_share_of_a_limit_the_results_page_is_made_from_is_above_100_percent() -> None:
    found = [share for name in ("convert", "convert_corpus_families", "generate")
             if (loaded := report.load(name)) is not None for share in _shares(loaded[0])]  # fmt: skip
    assert found and max(found) <= 100.0
