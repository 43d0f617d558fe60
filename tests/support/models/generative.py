"""Signed generative bundles of models/tinylm (a 0.92M-parameter Llama), for the converter's tests and the agent's.

`tinylm_bundles` (session fixture) converts models/tinylm once per session (per run under xdist) for
generic-x86-64 (ONNX Runtime GenAI) and intel-x86-vnni (OpenVINO GenAI and ONNX Runtime GenAI), each profile taken
`as_this_host` so its candidates are timed on whatever CPU runs the tests, with the default bars; about a minute on
2 cores. The bundles are signed with the session's bundle key (`keys` / `trusted` in tests/conftest.py). Which
candidate each profile ships (INT4, INT8, bf16 or FP32; ONNX Runtime or OpenVINO) is the converter's choice by
speed on this machine: `TinylmBundles.manifest(profile)` says what it chose.

`convert_tinylm(out, key, ...)` converts it again with other options (stricter bars, other profiles, a version).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgefleet.converter.request import ProfileResult
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.host_cpu import as_this_host
from support.paths import TINYLM
from support.run_once import once_per_run

PROFILES = ("generic-x86-64", "intel-x86-vnni")
MODEL_DIR = TINYLM / "model"
CALIB = TINYLM / "calib.txt"
HELDOUT = TINYLM / "heldout.txt"
BUDGET_S = 900.0  # tinylm_bundles' time budget: the CLI's default for a language model


@dataclass(frozen=True)
class TinylmBundles:
    bundles: dict[str, Path]  # profile → the signed bundle
    results: dict[str, ProfileResult]  # profile → what the converter answered (candidates, reasons, figures)
    out: Path  # the conversion's output directory (bundles and report)

    def __getitem__(self, profile: str) -> Path:
        return self.bundles[profile]

    def manifest(self, profile: str) -> Manifest:
        """The bundle's manifest, unverified (verify with edgefleet.core.bundle.archive.verify_bundle)."""
        return parse_manifest(read_signed_manifest(self.bundles[profile]).manifest_json)


def convert_tinylm(
    out: Path,
    key: SigningKey,
    profiles: tuple[str, ...] = PROFILES,
    *,
    version: str = "1",
    name: str = "tinylm",
    **options: object,
) -> list[ProfileResult]:
    """Convert models/tinylm for `profiles` (as this host) into `out`; `options` are ConvertRequest fields."""
    from edgefleet.converter import ConvertRequest, convert

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning OpenMP threads slow the timing
    request = ConvertRequest(
        model=MODEL_DIR, profiles=[as_this_host(get_profile(p)) for p in profiles], calib=CALIB, eval=HELDOUT,
        out=out, key=key, name=name, version=version, threads=2, **options,  # type: ignore[arg-type]
    )  # fmt: skip
    return convert(request)


@pytest.fixture(scope="session")
def tinylm_bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> TinylmBundles:
    """models/tinylm converted once per session (per run under xdist: support/parallel_runs.py) for generic-x86-64
    and intel-x86-vnni, default bars and the CLI's default time budget, version 1."""
    return once_per_run(tmp_path_factory, "tinylm-bundles", lambda out: _tinylm_bundles(out, signing_key))


def _tinylm_bundles(out: Path, signing_key: SigningKey) -> TinylmBundles:
    results = convert_tinylm(out, signing_key, time_budget_s=BUDGET_S)
    missing = {r.profile: r.error for r in results if not r.bundle}
    assert not missing, f"tinylm did not convert: {missing}"
    return TinylmBundles({r.profile: Path(str(r.bundle)) for r in results}, {r.profile: r for r in results}, out)
