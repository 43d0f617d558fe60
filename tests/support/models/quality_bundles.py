"""Bundles for the model-quality tests: the digits model converted, and a negated copy that is wrong."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import helper

from edgefleet.core.trust.signing import SigningKey

from support.paths import DIGITS

PROFILE = "intel-x86-vnni"


def convert_digits_like(
    model: Path, calib: Path, evaluation: Path, out: Path, key: SigningKey, name: str, version: str, **kw: object
) -> Path:
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[get_profile(PROFILE)], calib=calib, eval=evaluation, out=out, key=key, name=name,
            version=version, report=False, **kw,  # type: ignore[arg-type]
        )
    )  # fmt: skip
    assert result.bundle, result.error
    return Path(result.bundle)


# --- a shadow that disagrees
@pytest.fixture(scope="module")
def negated_digits_bundle(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> Path:
    """The digits CNN with its logits negated (argmax becomes argmin): a valid bundle that disagrees."""
    work = tmp_path_factory.mktemp("shadow")
    model = onnx.load(DIGITS / "digits_cnn.onnx")
    (output,) = model.graph.output
    model.graph.node[-1].output[0] = "logits_raw"
    model.graph.node.append(helper.make_node("Neg", ["logits_raw"], [output.name]))
    onnx.save(model, work / "negated.onnx")
    calib, evaluation = DIGITS / "calib.npz", DIGITS / "eval.npz"
    return convert_digits_like(work / "negated.onnx", calib, evaluation, work / "out", signing_key, "digits-cnn", "2")
