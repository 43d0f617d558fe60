"""Where the host cuts a bundle: content-defined cuts that fall back in step after a change, tensors of an ONNX model
chunked on their own so a re-serialized graph keeps them, and every byte covered once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.control.publish.chunker import cut_region, encode, plan_chunks
from edgefleet.control.publish.onnx_spans import NotOnnx, tensor_spans
from edgefleet.core.bundle.archive import describe_files, pack_bundle, parse_manifest, read_signed_manifest
from edgefleet.core.trust.signing import SigningKey

from support.fleet import silero_model


def _names(data: bytes, sizes: list[int]) -> list[str]:
    out, at = [], 0
    for size in sizes:
        out.append(hashlib.sha256(data[at : at + size]).hexdigest())
        at += size
    return out


def test_content_defined_cuts_fall_back_in_step_after_an_insertion() -> None:
    data = np.random.default_rng(3).bytes(3 << 20)
    changed = data[:1_000_000] + b"inserted" + data[1_000_000:]
    before = _names(data, cut_region(memoryview(data), max_size=128 * 1024))
    after = _names(changed, cut_region(memoryview(changed), max_size=128 * 1024))
    assert len(set(after) - set(before)) <= 2, "one insertion costs the chunk it lands in (and maybe one more)"
    sizes = cut_region(memoryview(data), max_size=128 * 1024)
    assert sum(sizes) == len(data) and max(sizes) <= 128 * 1024 and min(sizes[:-1]) >= 16 * 1024


def test_the_tensor_reader_finds_every_tensor_payload_of_a_real_model() -> None:
    blob = silero_model().read_bytes()
    model = onnx.load_from_string(blob)
    spans = tensor_spans(blob, 1)
    found = {hashlib.sha256(blob[s:e]).hexdigest() for s, e in spans}
    for init in model.graph.initializer:
        if init.raw_data:
            assert hashlib.sha256(init.raw_data).hexdigest() in found, init.name
    assert sum(e - s for s, e in spans) > 0.9 * len(blob), "silero-vad is mostly weights (subgraphs included)"
    with pytest.raises(NotOnnx):
        tensor_spans(b"\xff" * 64, 1)


def _model(order: list[int]) -> bytes:
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((64, 64, 3, 3)).astype(np.float32) for _ in range(4)]  # 147 KiB each
    inits = [numpy_helper.from_array(weights[i], f"w{i}") for i in order]
    nodes, x = [], "x"
    for i in range(4):
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"y{i}"], pads=[1, 1, 1, 1]))
        x = f"y{i}"
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [1, 64, 8, 8])],
                              [value(x, TensorProto.FLOAT, [1, 64, 8, 8])], inits)  # fmt: skip
    return helper.make_model(graph).SerializeToString()


def test_an_unchanged_tensor_keeps_its_chunks_when_the_graph_is_reordered(
    tmp_path: Path, demo_bundles: dict[str, Path], signing_key: SigningKey
) -> None:
    template = parse_manifest(read_signed_manifest(demo_bundles["generic-x86-64"]).manifest_json)
    bundles = []
    for tag, order in (("a", [0, 1, 2, 3]), ("b", [3, 1, 0, 2])):
        model = tmp_path / tag / template.model_path
        model.parent.mkdir(parents=True)
        model.write_bytes(_model(order))
        sources = {template.model_path: model}
        manifest = template.model_copy(update={"bundle_id": f"cut-{tag}", "files": describe_files(sources)})
        pack_bundle(tmp_path / f"{tag}.bundle", manifest, sources, signing_key)
        bundles.append(tmp_path / f"{tag}.bundle")

    def chunks(path: Path, align: bool) -> dict[str, int]:
        data = path.read_bytes()
        pieces = plan_chunks(path, 128 * 1024, align_tensors=align)
        assert sum(p.size for p in pieces) == len(data) and pieces[0].offset == 0
        return {hashlib.sha256(data[p.offset : p.offset + p.size]).hexdigest(): p.size for p in pieces}

    aligned = [chunks(b, True) for b in bundles]
    new_bytes = sum(size for sha, size in aligned[1].items() if sha not in aligned[0])
    assert new_bytes < 0.05 * bundles[1].stat().st_size, "the four tensors are the same bytes in another order"


def test_compression_is_kept_only_where_it_pays() -> None:
    assert encode(b"abc" * 10_000) is not None
    assert encode(np.random.default_rng(1).bytes(50_000)) is None
