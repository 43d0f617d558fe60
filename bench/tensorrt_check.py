"""Device check for TensorRT bundles, for a machine with an NVIDIA GPU (a Jetson, or a lent GPU host).

Converts the demo CNN for jetson-orin-nano (FP16, portable ONNX + TensorRT EP options), then loads it twice with
the agent's runtime and the same state directory: the first load builds the TensorRT engine, the second must
find it (key folder under STATE/cache/tensorrt) and load much faster. Prints, as JSON: the provider chosen and
why the others were not (TensorRT / CUDA / CPU measured on the golden set), both load times, the engine folder
and its files, and the golden-set verdict of the FP16 engine.

Setup on the GPU machine (replaces the CPU onnxruntime in that environment; torch is not needed):
    pip install onnxruntime-gpu tensorrt-cu12 && pip install -e . --no-deps
    python bench/tensorrt_check.py --state-dir /tmp/trt-state
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "models" / "digits"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=Path(tempfile.mkdtemp(prefix="edgefleet-trt-")))
    parser.add_argument("--bundle", type=Path, default=None, help="a jetson bundle (default: convert the demo CNN)")
    args = parser.parse_args()

    from edgefleet.agent.runtime.backends import tensorrt_engines as engines
    from edgefleet.agent.runtime.model import RuntimeOptions
    from edgefleet.core.bundle.archive import read_signed_manifest, unpack_bundle
    from edgefleet.core.trust.signing import SigningKey, TrustedKeys, generate_keypair

    work = args.state_dir
    private, public = generate_keypair(work / "keys") if not (work / "keys").exists() else (
        work / "keys" / "signing.key", work / "keys" / "signing.pub"
    )  # fmt: skip
    bundle = args.bundle
    if bundle is None:
        from edgefleet.converter import ConvertRequest, convert
        from edgefleet.core.profiles import get_profile

        (result,) = convert(
            ConvertRequest(
                model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("jetson-orin-nano")],
                calib=DIGITS / "calib.npz", eval=DIGITS / "eval.npz", out=work / "out", key=SigningKey.load(private),
                name="digits", version="1", report=False,
            )
        )  # fmt: skip
        assert result.bundle, result.error
        bundle = Path(result.bundle)
    target = work / "bundle"
    if not target.exists():
        unpack_bundle(bundle, target, TrustedKeys.load([public]))
    manifest = read_signed_manifest(bundle).verify(TrustedKeys.load([public]))
    runtime = RuntimeOptions(threads=0, cache_dir=work / "cache")
    report: dict[str, object] = {"tensorrt": engines.tensorrt_version(), "gpu_arch": engines.gpu_architecture()}
    for attempt in ("first load (builds the engine)", "second load (reuses it)"):
        started = time.perf_counter()
        model = runtime.load(target, manifest)
        golden = model.check_golden()
        report[attempt] = {
            "seconds": round(time.perf_counter() - started, 3),
            "provider": model.provider,
            "why": model.choice.summary,
            "not_chosen": model.choice.reasons,
            "medians_ms": model.choice.medians_ms,
            "golden": golden.reason,
            "golden_passed": golden.passed,
            "session": model.session.describe(),
        }
        model.close()
    engine_root = work / "cache" / "tensorrt"
    report["engine_files"] = sorted(str(p.relative_to(engine_root)) for p in engine_root.rglob("*") if p.is_file())
    print(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
