"""Benchmark: the converter's chosen bundle beside the usual baselines, interleaved in one run.

Per model and profile: the chosen recipe, ORT FP32, ORT INT8 dynamic (defaults), ORT INT8 static QDQ
(quantize_static defaults: S8S8, per-tensor, MinMax), OpenVINO FP32 (default compile config) and OpenVINO +
NNCF INT8 (defaults), all timed by the same runners in interleaved rounds (medians), with size and accuracy.
Goal: chosen ≤ 1.0× the fastest baseline that meets the same accuracy bar, and the chosen always meets it.

    python bench/convert.py [--threads 1] [--json bench/results/convert.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # test helpers: model paths
from edgefleet.converter.accuracy import Budget, gate
from edgefleet.converter.build import ConvertRequest, convert
from edgefleet.converter.measure import interleaved_latency, openvino_runner, ort_runner, predict
from edgefleet.converter.passes import openvino as ovp
from edgefleet.converter.passes import precision as prec
from edgefleet.core.errors import ConversionError
from edgefleet.core.profiles import get_profile
from edgefleet.core.signing import SigningKey, generate_keypair
from edgefleet.core.tensors import load_dataset

from fleet_helpers import silero_model

REPO = Path(__file__).resolve().parent.parent
SILERO = silero_model()
CASES = {
    "digits-cnn": (
        REPO / "models/digits/digits_cnn.onnx",
        REPO / "models/digits/calib.npz",
        REPO / "models/digits/eval.npz",
        {},
    ),
    "silero-vad": (
        SILERO,
        REPO / "models/testbed/silero_calib.npz",
        REPO / "models/testbed/silero_eval.npz",
        {"sr": "16000"},
    ),
}


def _baselines(model: Path, pins: dict[str, np.ndarray], calib, threads: int, names: list[str]):  # type: ignore[no-untyped-def]
    from edgefleet.converter.passes.graph import PinConfig, pin_inputs

    proto = onnx.load(str(model))
    if pins:  # the baselines get the same declared constant, nothing else
        proto = pin_inputs(proto, PinConfig(pins))
    built = {}

    def add(name: str, make):  # type: ignore[no-untyped-def]
        try:
            built[name] = make()
        except ConversionError as err:
            built[name] = err

    add("ORT FP32", lambda: (ort_runner(proto, threads), len(proto.SerializeToString())))

    def dyn():  # type: ignore[no-untyped-def]
        q = prec.quantize_int8_dynamic(proto, prec.DynamicConfig(op_types=()))
        return ort_runner(q, threads), len(q.SerializeToString())

    add("ORT INT8 dynamic", dyn)

    def static():  # type: ignore[no-untyped-def]
        import contextlib
        import io

        from onnxruntime.quantization import quantize_static

        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "m.onnx", Path(tmp) / "q.onnx"
            onnx.save(proto, str(src))
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    quantize_static(str(src), str(out), prec._Reader(calib, 256))
                except Exception as err:
                    raise ConversionError(str(err).splitlines()[0]) from err
            return ort_runner(out, threads), out.stat().st_size

    add("ORT INT8 static (defaults)", static)

    def ov_fp32():  # type: ignore[no-untyped-def]
        art = ovp.export_openvino(proto, ovp.OpenVINOConfig(None))
        return openvino_runner(art, names, threads), len(proto.SerializeToString())

    add("OpenVINO FP32", ov_fp32)

    def ov_nncf():  # type: ignore[no-untyped-def]
        art = ovp.quantize_nncf(ovp.export_openvino(proto, ovp.OpenVINOConfig(None)), ovp.NNCFConfig(), calib)
        with tempfile.TemporaryDirectory() as tmp:
            files = art.save(Path(tmp) / "m.xml")
            size = sum(f.stat().st_size for f in files)
        return openvino_runner(art, names, threads), size

    add("OpenVINO+NNCF INT8", ov_nncf)
    return built


def _chosen(bundle: Path, threads: int, names: list[str], work: Path):  # type: ignore[no-untyped-def]
    from edgefleet.core.bundle import parse_manifest, read_signed_manifest

    manifest = parse_manifest(read_signed_manifest(bundle).manifest_json)
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            if member.name.startswith("model/"):
                (work / Path(member.name).name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    path = work / Path(manifest.model_path).name
    size = sum(f.size for f in manifest.files if f.path.startswith("model/"))
    if manifest.format == "openvino-ir":
        import openvino as ov

        passes = [p for p in manifest.recipe.passes if p.name == "openvino-ir"]
        hint = passes[0].params.get("inference_precision_hint") if passes else None
        art = ovp.OpenVINOArtifact(ov.Core().read_model(str(path)), hint, False)  # type: ignore[arg-type]
        return openvino_runner(art, names, threads), size
    return ort_runner(path, threads), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", default="intel-x86-vnni")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "convert.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        key = SigningKey.load(generate_keypair(work / "keys")[0])
        for case, (model, calib_path, eval_path, pins) in CASES.items():
            profile = get_profile(args.profile)
            (result,) = convert(
                ConvertRequest(
                    model=model,
                    profiles=[profile],
                    calib=calib_path,
                    eval=eval_path,
                    out=work / case,
                    key=key,
                    name=case,
                    version="1",
                    threads=args.threads,
                    pins=pins,
                    report=False,
                )
            )
            from edgefleet.converter.model import load_model

            source = load_model(model)
            pinned = {
                k: np.asarray(json.loads(v), dtype=np.dtype(next(s.dtype for s in source.inputs if s.name == k)))
                for k, v in pins.items()
            }
            inputs = [s for s in source.inputs if s.name not in pinned]
            calib, evaluation = load_dataset(calib_path, inputs), load_dataset(eval_path, inputs)
            names = [o.name for o in source.outputs]
            reference = predict(_baselines(model, pinned, calib, args.threads, names)["ORT FP32"][0], evaluation)
            from edgefleet.converter.accuracy import plan_metric, score

            plan = plan_metric(reference, evaluation.labels)
            ref = score(reference, reference, evaluation.labels, plan).value
            budget = Budget(profile.accuracy_budget.max_drop, profile.accuracy_budget.min_sqnr_db)
            runners = _baselines(model, pinned, calib, args.threads, names)
            if result.bundle:
                (work / f"{case}-chosen").mkdir()
                runners[f"chosen: {result.recipe}"] = _chosen(
                    Path(result.bundle), args.threads, names, work / f"{case}-chosen"
                )
            ok = {n: r for n, r in runners.items() if not isinstance(r, Exception)}
            acc = {}
            for name, (run, _size) in ok.items():
                try:
                    acc[name] = score(predict(run, evaluation), reference, evaluation.labels, plan)
                except ConversionError as err:
                    runners[name] = err
            ok = {n: r for n, r in ok.items() if n in acc}
            lat = interleaved_latency({n: r[0] for n, r in ok.items()}, evaluation, rounds=15)
            for name, value in runners.items():
                if isinstance(value, Exception):
                    rows.append({"model": case, "profile": profile.name, "recipe": name, "error": str(value)[:120]})
                    continue
                s = acc[name]
                rows.append(
                    {
                        "model": case,
                        "profile": profile.name,
                        "recipe": name,
                        "median_ms": lat[name].median_ms,
                        "size_kb": value[1] / 1e3,
                        "metric": s.metric,
                        "value": s.value,
                        "meets_bar": gate(s, ref, budget) is None,
                    }
                )
            passing = [
                r for r in rows if r["model"] == case and r.get("meets_bar") and not r["recipe"].startswith("chosen")
            ]
            chosen = next((r for r in rows if r["model"] == case and r["recipe"].startswith("chosen")), None)
            if chosen and passing:
                best = min(passing, key=lambda r: r["median_ms"])
                chosen["vs_fastest_passing_baseline"] = chosen["median_ms"] / best["median_ms"]
                chosen["fastest_passing_baseline"] = best["recipe"]
            elif not result.bundle:
                rows.append(
                    {
                        "model": case,
                        "profile": profile.name,
                        "recipe": f"chosen: {result.recipe}",
                        "error": f"no bundle: {result.error}",
                    }
                )
    print(f"{'model':11} {'recipe':44} {'median ms':>9} {'size KB':>8} {'metric':>16} {'bar':>4} {'vs best':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:11} {r['recipe']:44} {'failed: ' + r['error']}")
            continue
        vs = f"{r['vs_fastest_passing_baseline']:.2f}x" if "vs_fastest_passing_baseline" in r else ""
        print(
            f"{r['model']:11} {r['recipe']:44} {r['median_ms']:9.4f} {r['size_kb']:8.1f} "
            f"{r['metric'] + ' ' + format(r['value'], '.4g'):>16} {'yes' if r['meets_bar'] else 'no':>4} {vs:>7}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
