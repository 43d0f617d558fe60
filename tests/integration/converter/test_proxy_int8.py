"""A host that stands in for other hardware judges an INT8 candidate on the quantized graph as written (Q/DQ
around float ops): the arithmetic TensorRT, a VNNI CPU or the browser computes, not this CPU's fused int8
kernels, which saturate on a CPU without VNNI (CI once ran on one: TensorRT and browser INT8 were refused for
accuracy they would have had on the device)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.runners import ort_runner
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey

from support.paths import DIGITS


def test_a_proxys_int8_candidates_run_as_written_and_its_float_ones_as_usual(
    tmp_path: Path, signing_key: SigningKey
) -> None:
    (result,) = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("browser-wasm")], calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz", out=tmp_path, key=signing_key, name="digits", version="1", report=False,
        )
    )  # fmt: skip
    providers = {c["name"]: str(c["provider"]) for c in result.candidates if c["accuracy"] is not None}
    int8 = [p for name, p in providers.items() if "int8" in name]
    assert int8 and all(p == "CPUExecutionProvider, graph as written (proxy for web:webgpu)" for p in int8), providers
    floats = [p for name, p in providers.items() if "int8" not in name]
    assert all(p == "CPUExecutionProvider (proxy for web:webgpu)" for p in floats), providers


class _Calibration(CalibrationDataReader):
    def __init__(self, samples: np.ndarray) -> None:
        self._samples = iter([{"input": x} for x in samples])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._samples, None)


# Top-1 of a QDQ model on the evaluation set, through the converter's own runner, as written or fused.
_TOP1 = """
import sys, numpy as np
from pathlib import Path
from edgefleet.converter.runners import ort_runner
data = np.load(sys.argv[1])
run = ort_runner(Path(sys.argv[2]), as_written=sys.argv[3] == "written")
hits = sum(int(np.argmax(run({"input": x})["logits"]) == y) for x, y in zip(data["input"], data["labels"], strict=True))
print(hits)
"""


@pytest.mark.slow
@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_on_an_emulated_cpu_without_vnni_the_graph_as_written_keeps_the_int8_accuracy_fused_kernels_lose(
    tmp_path: Path, activations: str
) -> None:
    """QEMU's Haswell (AVX2, no VNNI, no AVX-512) runs onnxruntime's real kernels: the fused int8 path loses top-1
    on the digits CNN; the graph as written scores what the graph states (what a VNNI CPU's kernels score)."""
    qemu = shutil.which("qemu-x86_64")
    assert qemu, "qemu-user is not installed: apt-get install -y qemu-user"
    model = tmp_path / f"digits-{activations}.onnx"
    quantize_static(
        str(DIGITS / "digits_cnn.onnx"), str(model), _Calibration(np.load(DIGITS / "calib.npz")["input"]),
        quant_format=QuantFormat.QDQ, per_channel=True, weight_type=QuantType.QInt8,
        activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
    )  # fmt: skip
    data = np.load(DIGITS / "eval.npz")
    # The graph as written on this host: the int8 arithmetic the model states, whatever this CPU's kernels (a VNNI
    # CPU's fused kernels score the same; an AVX2-only host's fused kernels saturate like the emulated Haswell's).
    here = ort_runner(model, as_written=True)
    pairs = zip(data["input"], data["labels"], strict=True)
    native = sum(int(np.argmax(here({"input": x})["logits"]) == y) for x, y in pairs)

    def emulated(mode: str) -> int:
        done = subprocess.run(
            [qemu, "-cpu", "Haswell", sys.executable, "-c", _TOP1, str(DIGITS / "eval.npz"), str(model), mode],
            capture_output=True, text=True, timeout=600, check=True,
        )  # fmt: skip
        return int(done.stdout.split()[-1])

    fused, written = emulated("fused"), emulated("written")
    assert fused < native, f"the emulated CPU's fused kernels scored {fused}, the graph as written {native}: no loss"
    assert written == native, f"as written on the emulated CPU: {written} of {len(data['labels'])}; here {native}"
