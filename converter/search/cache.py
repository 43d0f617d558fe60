"""Content-addressed cache of built candidates: key = sha256 of (source model, data, recipe, tool versions).

Holds the artifact files, the candidate's outputs on the evaluation set and its pass records, so a repeated
conversion skips quantization and export. Latency is never cached: it is re-measured in interleaved rounds
every run, because a figure from another run is not comparable with this run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CACHE_FORMAT = 2  # 2: files kept at their bundle-relative paths (an .mlpackage is a directory)


def tool_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    packages = ("onnx", "onnxruntime", "onnxscript", "openvino", "nncf", "numpy", "torch", "onnx2torch", "coremltools")
    for package in packages:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps({"format": CACHE_FORMAT, "tools": tool_versions(), **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CachedBuild:
    directory: Path
    meta: dict[str, Any]
    outputs: dict[str, np.ndarray]

    def file(self, name: str) -> Path:
        return self.directory / name


class BuildCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str) -> CachedBuild | None:
        entry = self.root / key[:2] / key
        try:
            meta = json.loads((entry / "meta.json").read_text("utf-8"))
            with np.load(entry / "outputs.npz", allow_pickle=False) as archive:
                outputs = {k: archive[k] for k in archive.files}
        except (OSError, ValueError):
            return None
        return CachedBuild(entry, meta, outputs)

    def put(
        self,
        key: str,
        files: dict[str, Path],
        meta: dict[str, Any],
        outputs: dict[str, np.ndarray],
        *,
        replace: bool = False,
    ) -> None:
        """Write into a temporary directory then rename, so a crash never leaves half an entry. `replace`: an
        entry stored before its evaluation finished gets its outputs (files are copied first: they may be the
        old entry's own)."""
        final = self.root / key[:2] / key
        if final.exists() and not replace:
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=final.parent))
        try:
            for name, path in files.items():  # bundle-relative names, '/' separated
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, tmp / name)
            (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True), "utf-8")
            with (tmp / "outputs.npz").open("wb") as handle:
                np.savez(handle, **outputs)  # type: ignore[arg-type]
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
