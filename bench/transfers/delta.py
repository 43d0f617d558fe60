"""Deltas between bundle versions on real models: bytes on the wire, time, and the ratio to a full transfer.

    python bench/transfer.py --delta [--rounds 3] [--json out.json]

For each pair (version N, version N+1), through one loopback Mosquitto:
- the device holds N, installed as the agent installs it (unpacked, chunk index written), and fetches N+1 with the
  agent's ChunkDownload: bytes on the wire (zstd where it paid), wall time (median of `--rounds`), ratio to the
  N+1 bundle file;
- full: the same N+1 fetched by a device holding nothing (the same path, every chunk), bytes and time;
- cdc / blocks / tensors, for comparison (uncompressed): content-defined cuts without the cut at each tensor start;
  fixed 128 KiB blocks named by their hash; whole changed tensors plus the graph and a changed golden file.

Pairs (real models: silero-vad, PP-OCRv4 det and magika from their PyPI wheels; an 8.8 MB CNN built here):
- same weights, another golden set (silero-vad);
- same weights, another recipe: the same model file under another recipe in the manifest (ppocr-det); and the
  exported graph vs ONNX Runtime's basic-optimized graph, re-serialized with its tensors reordered (ppocr-det);
- fine-tuned last layer: only the classifier head (Gemm weight + bias) retrained (bench CNN);
- full retrain: every weight changed (bench CNN);
- INT8 versus FP32: dynamic INT8 quantization of the same model (bench CNN, magika).
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefleet.agent.transfer.chunk_index import ChunkIndex, write_index
from edgefleet.agent.transfer.chunks import ChunkDownload
from edgefleet.control.publish.chunker import plan_chunks
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.bundle.archive import (
    describe_files,
    pack_bundle,
    parse_manifest,
    read_signed_manifest,
    unpack_pinned,
)
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.messages import BundleOffer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import DEFAULT_BLOCK_SIZE, describe_transfer
from edgefleet.core.trust.signing import SigningKey

GOALS = {"golden": 0.05, "recipe": 0.05, "head": 0.10, "retrain": 1.02}


@dataclass
class Pair:
    key: str  # goal key
    name: str
    model: str
    old_model: bytes
    new_model: bytes
    old_golden: bytes
    new_golden: bytes


def cnn(seed: int, head_seed: int | None = None, scale: float = 1.0) -> bytes:
    """A CNN of about 8.8 MB (FP32): five 3x3 convolutions and a 512 -> 100 classifier head. `head_seed` draws the
    head alone again (a fine-tuned last layer); another `seed` redraws everything (a full retrain)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    widths = [3, 64, 128, 256, 256, 512]
    nodes, inits, x = [], [], "input"
    for i, (cin, cout) in enumerate(itertools.pairwise(widths)):
        w = (rng.standard_normal((cout, cin, 3, 3)) * scale / np.sqrt(cin * 9)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"conv{i}.w"),
            numpy_helper.from_array(np.zeros(cout, np.float32), f"conv{i}.b"),
        ]
        nodes += [helper.make_node("Conv", [x, f"conv{i}.w", f"conv{i}.b"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]  # fmt: skip
        x = f"r{i}"
    head = np.random.default_rng(head_seed if head_seed is not None else seed + 1)
    inits += [numpy_helper.from_array((head.standard_normal((512, 100)) / 23).astype(np.float32), "fc.w"),
              numpy_helper.from_array(head.standard_normal(100).astype(np.float32) * 0.01, "fc.b")]  # fmt: skip
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pool"]), helper.make_node("Flatten", ["pool"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"])]  # fmt: skip
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 100])]
    graph = helper.make_graph(nodes, "bench-cnn", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def int8(model: bytes, work: Path) -> bytes:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = work / "fp32.onnx", work / "int8.onnx"
    src.write_bytes(model)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    return dst.read_bytes()


def ort_basic(model: Path, work: Path) -> bytes:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(work / "basic.onnx")
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return (work / "basic.onnx").read_bytes()


def golden(seed: int, model: bytes) -> bytes:
    """A golden set's bytes: fixed inputs and outputs that follow the model (a new model, new reference outputs)."""
    import io

    out = io.BytesIO()
    rng = np.random.default_rng(seed)
    follow = np.random.default_rng(int.from_bytes(__import__("hashlib").sha256(model).digest()[:8], "little"))
    np.savez(out, inputs=rng.standard_normal((16, 3, 32, 32)).astype(np.float32),
             outputs=follow.standard_normal((16, 100)).astype(np.float32))  # fmt: skip
    return out.getvalue()


def pairs(work: Path) -> list[Pair]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from support.fleet import silero_model
    from support.models.corpus import by_name  # the corpus models come from their PyPI wheels

    silero = silero_model().read_bytes()
    det = by_name("ppocr-det").path()
    base, head, retrained = cnn(1), cnn(1, head_seed=99), cnn(2)
    magika = by_name("magika").path().read_bytes()
    magika_int8 = int8(magika, work)
    return [
        Pair("golden", "same weights, another golden set", "silero-vad", silero, silero, golden(1, silero),
             golden(2, silero)),
        Pair("recipe", "same weights, another recipe (manifest only)", "ppocr-det", det.read_bytes(),
             det.read_bytes(), golden(3, det.read_bytes()), golden(3, det.read_bytes())),
        Pair("recipe", "another recipe: ORT basic-optimized graph", "ppocr-det", det.read_bytes(),
             ort_basic(det, work), golden(3, det.read_bytes()), golden(3, det.read_bytes())),
        Pair("head", "fine-tuned last layer (head 0.2 MB)", "bench CNN 8.8 MB", base, head, golden(4, base),
             golden(4, head)),
        Pair("retrain", "full retrain", "bench CNN 8.8 MB", base, retrained, golden(4, base), golden(4, retrained)),
        Pair("int8", "INT8 versus FP32", "bench CNN 8.8 MB", base, int8(base, work), golden(4, base), golden(5, base)),
        Pair("int8", "INT8 versus FP32", "magika", magika, magika_int8, golden(3, magika), golden(6, magika_int8)),
    ]  # fmt: skip


def make_bundle(
    template: Manifest,
    key: SigningKey,
    work: Path,
    tag: str,
    model: bytes,
    gold: bytes,
    providers: list[str] | None = None,
) -> Path:
    folder = work / f"src-{tag}"
    folder.mkdir(parents=True)
    (folder / template.model_path).parent.mkdir(parents=True, exist_ok=True)
    (folder / template.model_path).write_bytes(model)
    (folder / "golden.npz").write_bytes(gold)
    sources = {template.model_path: folder / template.model_path, "golden.npz": folder / "golden.npz"}
    manifest = template.model_copy(update={"bundle_id": f"bench-{tag}", "model_version": tag.split("-")[-1],
                                           "files": describe_files(sources), "drift_reference": None,
                                           "providers": providers or template.providers})  # fmt: skip
    path = work / f"bench-{tag}.bundle"
    pack_bundle(path, manifest, sources, key)
    return path


def install(offer: BundleOffer, bundle: Path, bundles: Path) -> None:
    """What the agent keeps of an installed bundle: its files and their chunk index."""
    target = bundles / offer.bundle_id
    unpack_pinned(bundle, target, offer.manifest_json)
    write_index(target, bundle, offer.transfer)


def fetch(device: Connection, offer: BundleOffer, part: Path, bundles: Path | None) -> tuple[int, float]:
    index = ChunkIndex(bundles) if bundles is not None else None
    start = time.perf_counter()
    download = ChunkDownload(device, Topics(), offer, part, index=index, window=16)
    download.run()
    elapsed = time.perf_counter() - start
    download.cleanup()
    return download.bytes_received, elapsed


def block_delta(old: Path, new: Path) -> int:
    held = set(describe_transfer(old, DEFAULT_BLOCK_SIZE).block_sha256)
    data = new.read_bytes()
    layout = describe_transfer(new, DEFAULT_BLOCK_SIZE)
    return sum(len(data[i * DEFAULT_BLOCK_SIZE : (i + 1) * DEFAULT_BLOCK_SIZE])
               for i, h in enumerate(layout.block_sha256) if h not in held)  # fmt: skip


def cdc_only_delta(old: Path, new: Path) -> int:
    """Raw bytes of the chunks of N+1 that N lacks with content-defined cuts alone (no cut at tensor starts)."""
    import hashlib

    def chunks(path: Path) -> list[tuple[str, int]]:
        data = path.read_bytes()
        return [(hashlib.sha256(data[p.offset : p.offset + p.size]).hexdigest(), p.size)
                for p in plan_chunks(path, DEFAULT_BLOCK_SIZE, align_tensors=False)]  # fmt: skip

    held = {sha for sha, _ in chunks(old)}
    return sum(size for sha, size in dict(chunks(new)).items() if sha not in held)


def tensor_bound(pair: Pair) -> int:
    """What a delta aligned to whole tensors would send (uncompressed): the golden set file if it changed, the
    model's graph (all but its tensors) if the model changed, and every tensor (initializer or Constant) of N+1
    whose bytes N does not hold."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    def tensors(blob: bytes) -> tuple[dict[str, int], int]:
        model = onnx.load_from_string(blob)
        sizes = {}
        held = list(model.graph.initializer)
        held += [
            a.t for node in model.graph.node if node.op_type == "Constant" for a in node.attribute if a.name == "value"
        ]
        for tensor in held:
            raw = numpy_helper.to_array(tensor).tobytes()
            sizes[hashlib.sha256(raw).hexdigest()] = len(raw)
        return sizes, len(blob) - sum(sizes.values())

    bound = len(pair.new_golden) if pair.new_golden != pair.old_golden else 0
    if pair.new_model != pair.old_model:
        old, _ = tensors(pair.old_model)
        new, graph = tensors(pair.new_model)
        bound += max(graph, 0) + sum(size for sha, size in new.items() if sha not in old)
    return bound


def run(broker_url: str, template_bundle: Path, key: SigningKey, rounds: int) -> list[dict[str, object]]:
    template = parse_manifest(read_signed_manifest(template_bundle).manifest_json)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="edgefleet-delta-") as tmp:
        work = Path(tmp)
        host = Connection(broker_url, "bench-delta-host").start()
        device = Connection(broker_url, "bench-delta-device").start()
        try:
            for n, pair in enumerate(pairs(work)):
                old = make_bundle(template, key, work, f"{n}-1", pair.old_model, pair.old_golden)
                recipe = ["CPUExecutionProvider"] if pair.new_model == pair.old_model else None  # another recipe
                new = make_bundle(template, key, work, f"{n}-2", pair.new_model, pair.new_golden, recipe)
                _, old_offer = publish_bundle(host, Topics(), old)
                started = time.perf_counter()
                _, offer = publish_bundle(host, Topics(), new)
                publish_s = time.perf_counter() - started
                bundles = work / f"device-{n}" / "bundles"
                bundles.mkdir(parents=True)
                install(old_offer, old, bundles)
                deltas = [fetch(device, offer, work / f"d{n}-{r}.part", bundles) for r in range(rounds)]
                fulls = [fetch(device, offer, work / f"f{n}-{r}.part", None) for r in range(rounds)]
                size = new.stat().st_size
                delta_bytes, full_bytes = deltas[0][0], fulls[0][0]
                rows.append({
                    "pair": pair.name, "model": pair.model, "goal": GOALS.get(pair.key),
                    "bundle_bytes": size, "delta_bytes": delta_bytes, "delta_ratio": round(delta_bytes / size, 4),
                    "delta_s": round(statistics.median(t for _, t in deltas), 3),
                    "full_bytes": full_bytes, "full_ratio": round(full_bytes / size, 4),
                    "full_s": round(statistics.median(t for _, t in fulls), 3),
                    "blocks_128k_delta_ratio": round(block_delta(old, new) / size, 4),
                    "tensor_bound_ratio": round(tensor_bound(pair) / size, 4),
                    "cdc_only_delta_ratio": round(cdc_only_delta(old, new) / size, 4),
                    "chunks": len(offer.transfer.chunks),
                    "zstd_chunks": sum(1 for c in offer.transfer.chunks if c.zstd),
                    "host_publish_s": round(publish_s, 3),
                })  # fmt: skip
                shutil.rmtree(bundles.parent, ignore_errors=True)
        finally:
            host.stop()
            device.stop()
    return rows


def report(rows: list[dict[str, object]], json_path: Path | None) -> None:
    print(f"{'pair':48} {'model':18} {'bundle':>9} {'delta':>9} {'ratio':>7} {'goal':>6} {'time':>7} "
          f"{'full':>9} {'time':>7} {'cdc':>7} {'blocks':>7} {'tensors':>7}")  # fmt: skip
    for r in rows:
        goal = f"{r['goal']:.0%}" if r["goal"] else "report"
        print(f"{r['pair']:48} {r['model']:18} {r['bundle_bytes']:>9} {r['delta_bytes']:>9} "
              f"{r['delta_ratio']:>7.1%} {goal:>6} {r['delta_s']:>6.2f}s {r['full_bytes']:>9} {r['full_s']:>6.2f}s "
              f"{r['cdc_only_delta_ratio']:>7.1%} {r['blocks_128k_delta_ratio']:>7.1%} "
              f"{r['tensor_bound_ratio']:>7.1%}")  # fmt: skip
    print("ratio: delta bytes on the wire / the N+1 bundle file; full: a device holding nothing (same path);")
    print("cdc: content-defined cuts alone (no cut at tensor starts, raw bytes); blocks: fixed 128 KiB blocks named")
    print("by hash; tensors: whole changed tensors + graph + the changed golden file (uncompressed)")
    if json_path:
        json_path.write_text(json.dumps({"delta": rows}, indent=2))
    print(json.dumps({"delta": rows}))
