"""The copy of a model with its Python-op nodes addressed as onnxruntime-extensions registers them, external data
included, as both the agent and the converter load it.

The copy is written into a folder of its own with the model's external data files beside it under the same
relative names: ONNX Runtime reads external data relative to the model file, and refuses a symbolic link that
leaves the model's folder, so each file is hard-linked there (copied where a link cannot be made). The weights
are never read into memory (the graph is loaded with `load_external_data=False`), so a model over protobuf's
2 GiB limit is renamed as cheaply as a small one. Like custom_op_packages.py, this module imports no onnx: the
caller passes the module it imported.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from edgefleet.core.custom_ops.packages import CustomOpPackageError, contrib_name, graphs, rename_to_contrib

_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL


def _tensors(model: Any) -> Iterator[Any]:
    for graph in graphs(model.graph):
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors


def external_locations(model: Any) -> list[str]:
    """The external data files an onnx ModelProto names, relative to its folder; a location that is absolute or
    leaves the folder is refused (the bundle is signed, but the copy must never reach outside it)."""
    found: dict[str, None] = {}
    for tensor in _tensors(model):
        if tensor.data_location != _EXTERNAL:
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        parts = PurePosixPath(location.replace("\\", "/")).parts
        if not location or PurePosixPath(location).is_absolute() or ".." in parts or Path(location).is_absolute():
            raise CustomOpPackageError(
                f"tensor {tensor.name!r}: external data location {location!r} is not a file inside the model's folder"
            )
        found.setdefault(location, None)
    return list(found)


def _place(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:  # another file system, or hard links not allowed: copy
        shutil.copyfile(source, target)


def renamed_copy(onnx: Any, model_path: Path, keys: Iterable[str], work_dir: Path) -> Path:
    """The model at `model_path` with the ops `keys` (`domain::op_type`) renamed to the contrib domain and their
    own domains' imports dropped, with its external data beside it; reused when already made for these files."""
    keys = sorted(set(keys))
    model = onnx.load(str(model_path), load_external_data=False)
    locations = external_locations(model)
    identity = hashlib.sha256(model_path.read_bytes())
    for location in locations:  # the same graph with other weights (another bundle) gets its own copy
        source = model_path.parent / location
        if not source.is_file():
            raise CustomOpPackageError(f"external data file {location} of {model_path.name} is missing")
        stat = source.stat()
        identity.update(f"\0{location}\0{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    folder = work_dir / f"{identity.hexdigest()[:16]}-{'-'.join(contrib_name(k) for k in keys)}"
    target = folder / model_path.name
    if target.is_file():
        return target
    rename_to_contrib(model, keys)
    domains = {key.split("::", 1)[0] for key in keys}
    kept = [imp for imp in model.opset_import if imp.domain not in domains]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    folder.mkdir(parents=True, exist_ok=True)
    for location in locations:
        _place(model_path.parent / location, folder / location)
    partial = target.with_name(target.name + ".partial")
    onnx.save(model, str(partial))  # the graph only: its tensors still point at the external files
    partial.replace(target)  # last: a complete target means its data is in place
    return target
