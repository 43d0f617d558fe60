"""How close generation runs to this machine's limit. At batch 1 each output token reads every weight once (an
embedding table only its one row), so tokens/s cannot pass read bandwidth ÷ the bytes of weights read per token.

- **Weights read per token**, from the artifact's own graph: every weight, less the tables only a Gather reads
  (an untied embedding: one row a token). A tied embedding is the LM head's weight and is counted in full.
- **Read bandwidth**, measured here: `torch.sum` over a float32 array four times the last-level cache (at least
  128 MiB) at the profile's threads, the best of several runs. A pure read, as weights are read: the converter's
  roofline figure (converter/roofline/limits.py) streams an Add, two reads and a write whose write-allocate
  traffic it does not count, and read ~20 % lower on this machine (23-26 against 29-31 GB/s). Cached per CPU and
  threads in the process and under the cache directory.

The KV cache read per token is left out (it grows with the context); a model that fits in the last-level cache
reads its weights from there, faster than DRAM, so small models can show little of the limit or pass it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.core.bundle.generation import BandwidthLimit

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)
__all__ = ["ReadBandwidth", "limit_of", "read_bandwidth", "weights_read_per_token"]

MIN_ARRAY_BYTES = 128 * 2**20
RUNS = 10
GATHERS = frozenset({"Gather", "GatherBlockQuantized"})
DECOMPRESSION = frozenset({"Convert", "Subtract", "Multiply", "Reshape", "Unsqueeze", "Transpose"})
_MEMO: dict[str, ReadBandwidth] = {}


@dataclass(frozen=True)
class ReadBandwidth:
    gb_s: float
    threads: int
    method: str
    measured_at: str
    load_average: float


def limit_of(weights_bytes: int, bandwidth: ReadBandwidth, tpot_ms: float) -> BandwidthLimit:
    limit = bandwidth.gb_s * 1e9 / max(1, weights_bytes)
    return BandwidthLimit(
        weights_bytes=max(1, weights_bytes), bandwidth_gb_s=bandwidth.gb_s, limit_tokens_per_s=limit,
        achieved_tokens_per_s=1000.0 / tpot_ms,
    )  # fmt: skip


def weights_read_per_token(folder: Path, runtime: str, vocab_size: int) -> int:
    if runtime == "onnxruntime-genai":
        return _onnx_weights(folder, vocab_size)
    return _openvino_weights(folder, vocab_size)


def _onnx_weights(folder: Path, vocab_size: int) -> int:
    import onnx

    config = json.loads((folder / "genai_config.json").read_text("utf-8"))
    graph = onnx.load(str(folder / config["model"]["decoder"]["filename"]), load_external_data=False).graph
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, set()).add(node.op_type if position != 1 else f"{node.op_type}:indices")
    total = 0
    for init in graph.initializer:
        size = _initializer_bytes(init)
        ops = readers.get(init.name, set())
        total += size // max(1, vocab_size) if ops and ops <= GATHERS else size
    return total


def _initializer_bytes(tensor: onnx.TensorProto) -> int:
    import math

    from onnx import helper

    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    if tensor.raw_data:
        return len(tensor.raw_data)
    return math.prod(tensor.dims) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _openvino_weights(folder: Path, vocab_size: int) -> int:
    import openvino as ov

    model = ov.Core().read_model(str(folder / "openvino_model.xml"))
    total = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        size = int(op.get_byte_size())
        total += size // max(1, vocab_size) if _gather_only(op) else size
    return total


def _gather_only(op: Any) -> bool:
    """Whether a constant reaches only Gathers' data input, through its decompression (Convert, Subtract, ...)."""
    frontier, seen, reached = [op], set(), False
    while frontier:
        node = frontier.pop()
        for output in node.outputs():
            for target in output.get_target_inputs():
                consumer = target.get_node()
                kind = consumer.get_type_name()
                if kind == "Gather" and target.get_index() == 0:
                    reached = True
                elif kind in DECOMPRESSION and id(consumer) not in seen:
                    seen.add(id(consumer))
                    frontier.append(consumer)
                elif kind not in DECOMPRESSION:
                    return False
    return reached


def read_bandwidth(threads: int, cache_dir: Path | None = None) -> ReadBandwidth:
    """This machine's read bandwidth at `threads`: cached (process, then `cache_dir`), else measured (~2 s)."""
    from edgefleet.converter.roofline.limits import machine_key

    key, _ = machine_key(threads)
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir / "machine-limits" / f"read-{key}.json" if cache_dir else None
    if path is not None and path.is_file():
        try:
            found = ReadBandwidth(**json.loads(path.read_text("utf-8")))
            _MEMO[key] = found
            return found
        except (OSError, ValueError, TypeError) as err:
            log.info("cached read bandwidth %s unreadable (%s): measuring again", path, err)
    found = _measure(threads)
    _MEMO[key] = found
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(asdict(found)), "utf-8")
            os.replace(tmp, path)
        except OSError as err:
            log.info("cannot cache the read bandwidth at %s: %s", path, err)
    return found


def _measure(threads: int) -> ReadBandwidth:
    from datetime import datetime, timezone

    from edgefleet.converter.generative.torch_setup import import_torch
    from edgefleet.converter.roofline.limits import last_level_cache

    torch = import_torch(threads)
    size = max(MIN_ARRAY_BYTES, 4 * last_level_cache())
    array = torch.ones(size // 4, dtype=torch.float32)
    array.sum()  # pages touched, threads started
    best = float("inf")
    for _ in range(RUNS):
        start = time.perf_counter()
        array.sum()
        best = min(best, time.perf_counter() - start)
    return ReadBandwidth(
        gb_s=round(size / best / 1e9, 2), threads=threads,
        method=f"torch.sum over {size >> 20} MiB float32, {threads} thread(s), best of {RUNS}",
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        load_average=round(os.getloadavg()[0], 2),
    )  # fmt: skip
