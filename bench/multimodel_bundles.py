"""The bundles bench/multimodel.py deploys, converted once into WORK/bundles and reused by later runs.

    python bench/multimodel_bundles.py WORK    # convert what WORK/bundles lacks (minutes on 2 loaded cores)

- detector: nudenet-320n (YOLOv8n at 320×320, the corpus's wheel) for generic-x86-64, ONNX Runtime, its task
  metric (detection-F1 ≥ 0.90), a 60 s search budget;
- burst: magika (a file-type model from the corpus), the same way;
- lm: models/tinylm (tests/support/models/generative.py `convert_tinylm`), generic-x86-64;
- extra: the digits CNN (as bench/idle.py converts it), the fourth slot of the admission check.
The keys are WORK/keys (the control plane's keyring), made once.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # test helpers: the corpus, tinylm's conversion
DIGITS = REPO / "models" / "digits"
PROFILE = "generic-x86-64"
ROLES = ("detector", "lm", "burst", "extra")


def keys(work: Path) -> Path:
    from edgefleet.control.credentials import keyring

    if not (work / "keys").exists():
        keyring.init(work / "keys")
    return work / "keys"


def _corpus(name: str, work: Path) -> Path | None:
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile
    from edgefleet.core.trust.signing import SigningKey

    from support.models import corpus

    model = corpus.by_name(name)
    calib, evaluation = corpus.dataset(model, work / "data", count=8)
    (result,) = convert(
        ConvertRequest(
            model=model.path(), profiles=[get_profile(PROFILE)], calib=calib, eval=evaluation, out=work / f"out-{name}",
            key=SigningKey.load(keys(work) / "bundle.key"), name=model.name, version="1", report=False,
            metric=model.metric, min_score=model.min_score, threads=2, runtimes=("onnxruntime",), time_budget_s=60,
        )
    )  # fmt: skip
    if not result.bundle:
        print(f"multimodel: {name} did not convert: {result.error}", file=sys.stderr)
    return Path(result.bundle) if result.bundle else None


def _tinylm(work: Path) -> Path | None:
    from edgefleet.core.trust.signing import SigningKey

    from support.models.generative import convert_tinylm

    (result,) = convert_tinylm(work / "out-tinylm", SigningKey.load(keys(work) / "bundle.key"), (PROFILE,))
    if not result.bundle:
        print(f"multimodel: tinylm did not convert: {result.error}", file=sys.stderr)
    return Path(result.bundle) if result.bundle else None


def _digits(work: Path) -> Path | None:
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile
    from edgefleet.core.trust.signing import SigningKey

    (result,) = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[get_profile(PROFILE)], calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz", out=work / "out-digits", key=SigningKey.load(keys(work) / "bundle.key"),
            name="digits-cnn", version="1", report=False, runtimes=("onnxruntime",),
        )
    )  # fmt: skip
    return Path(result.bundle) if result.bundle else None


def bundles(work: Path, burst: str = "magika") -> dict[str, Path]:
    """role -> its bundle in WORK/bundles, converting the missing ones."""
    folder = work / "bundles"
    folder.mkdir(parents=True, exist_ok=True)
    makers = {
        "detector": lambda: _corpus("nudenet-320n", work),
        "lm": lambda: _tinylm(work),
        "burst": lambda: _corpus(burst, work),
        "extra": lambda: _digits(work),
    }
    found: dict[str, Path] = {}
    for role in ROLES:
        path = folder / f"{role}.bundle"
        if not path.exists():
            print(
                f"== converting the {role} model for {PROFILE} (once: cached in {folder})", file=sys.stderr, flush=True
            )
            made = makers[role]()
            if made is None:
                raise SystemExit(f"multimodel: no {role} bundle")
            shutil.copyfile(made, path)
        found[role] = path
    return found


if __name__ == "__main__":
    for role, path in bundles(Path(sys.argv[1])).items():
        print(role, path)
