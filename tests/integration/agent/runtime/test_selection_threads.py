"""The agent runs the bundle with the thread count it was timed at unless its own measurement says otherwise:
the choice is a pure function of what was measured (a table), and a real load times the bundle's count against
the runtime's default, keeps the faster beyond the tie margin, caches the count with its reason, and reuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefleet.agent.runtime.model import LoadedModel
from edgefleet.agent.runtime.selection.selector import CACHE_FILE
from edgefleet.agent.runtime.selection.threads import candidates, choose_threads
from edgefleet.core.bundle.manifest import Manifest, SearchReport

from support.runtime import unpack


@pytest.fixture(scope="module")
def digits(
    demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Manifest]:
    return unpack(demo_bundles["intel-x86-vnni"], keys[1], tmp_path_factory.mktemp("threads") / "bundle")


@pytest.mark.parametrize(
    ("medians", "failed", "chosen", "says"),
    [
        (
            {2: 1.00, 0: 0.99},
            {},
            2,
            "2 threads, as the bundle was timed: no other count measured faster by more than 5%",
        ),
        ({2: 1.00, 0: 0.50}, {}, 0, "the runtime's default threads: measured 2.00× faster here than the bundle's 2"),
        ({2: 0.50, 0: 1.00}, {}, 2, "2 threads, as the bundle was timed"),
        (
            {2: 1.00},
            {0: "failed: out of memory"},
            2,
            "nothing else to compare; the runtime's default threads: failed: out of memory)",
        ),
        ({}, {}, 2, "2 threads, as the bundle was timed (nothing else to compare)"),
    ],
    ids=["tie-keeps-the-bundles", "faster-default-wins", "bundles-faster", "other-failed", "nothing-timed"],
)
def test_the_thread_count_is_the_bundles_unless_another_measured_faster_beyond_the_tie_margin(
    medians: dict[int, float], failed: dict[int, str], chosen: int, says: str
) -> None:
    choice = choose_threads(2, medians, failed, tie_margin=0.05)
    assert choice.threads == chosen and says in choice.reason, choice.reason


def test_the_counts_tried_start_from_the_bundles_and_a_configured_count_is_used_as_it_is(
    digits: tuple[Path, Manifest],
) -> None:
    _, manifest = digits
    assert manifest.search is not None and manifest.search.threads == [2]  # the profile's `threads: [2]`
    assert candidates(manifest, 0) == [2, 0]
    assert candidates(manifest, 3) == [3]
    several = manifest.model_copy(update={"search": manifest.search.model_copy(update={"threads": [4, 2]})})
    assert candidates(several, 0) == [4, 2, 0]
    older = manifest.model_copy(update={"search": None, "latency": None})
    assert candidates(older, 0) == [0]  # a bundle that records no count: the runtime decides, as before
    assert isinstance(SearchReport(metric="top1", bar=0.9).threads, list)


def test_an_agent_left_to_choose_measures_the_bundles_threads_against_the_default_and_caches_the_choice(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    first = LoadedModel(bundle_dir, manifest, 0, cache_dir=tmp_path)
    assert first.choice.threads in (2, 0) and not first.choice.cached
    reason = first.choice.threads_reason
    assert "2 threads" in reason and "the runtime's default threads" in reason and "medians" in reason, reason
    assert reason in first.choice.summary  # reported with the provider choice (the status' provider_summary)
    (entry,) = json.loads((tmp_path / CACHE_FILE).read_text())["decisions"].values()
    assert entry["threads"] == first.choice.threads and entry["threads_reason"] == reason
    again = LoadedModel(bundle_dir, manifest, 0, cache_dir=tmp_path)
    assert again.choice.cached and again.choice.threads == first.choice.threads
    assert again.choice.threads_reason == reason and again.check_golden().passed
    for model in (first, again):
        model.close()


def test_an_agent_configured_with_a_thread_count_uses_it_and_measures_no_other(
    digits: tuple[Path, Manifest], tmp_path: Path
) -> None:
    bundle_dir, manifest = digits
    model = LoadedModel(bundle_dir, manifest, 1, cache_dir=tmp_path)
    assert model.choice.threads == 1
    assert model.choice.threads_reason == "1 thread, as the agent is configured (the bundle was timed at [2])"
    model.close()
