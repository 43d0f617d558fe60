"""The signed file list is all a device loads: every file a load of the bundle would open must be one of the
manifest's `files` (each pinned by its sha256 in the signed manifest), named by a relative path, and lie inside the
bundle's directory after symbolic links are resolved.

Checked by the agent itself, never left to the runtime: from the manifest alone before a block is downloaded
(`check_manifest_paths`), and on the unpacked files at install, at start-up, before a local rollback and by the
health check (`check_bundle_files`). The files a load opens:
- `model_path`, and for a CoreML package (a folder) every file in it;
- an ONNX model's external data (its tensors' `location`s, relative to the model's folder; read from the graph
  without loading a weight, agent/runtime/external_data.py), within the file's size;
- an OpenVINO IR's weights (the `.bin` beside the `.xml`);
- the golden set, the drift reference and a TensorRT calibration table the manifest names.
Custom-op libraries are never bundle files: a bundle names them by file name and the device looks them up in its
own library folders (agent/runtime/custom_ops.py), so a name must be a bare file name. TensorRT engine caches are
the device's own, in its cache folder, and not checked here.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from edgefleet.agent.runtime.external_data import external_data
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import BundleError

ONNX_FORMATS = ("onnx", "onnx-tensorrt")


def _relative(rel: str, what: str) -> str:
    """`rel` when it is a plain relative bundle path ('/'-separated, normalized, no '..'), else BundleError."""
    windows = PureWindowsPath(rel)
    if (
        not rel
        or "\x00" in rel
        or "\\" in rel
        or PurePosixPath(rel).is_absolute()
        or windows.drive
        or ".." in PurePosixPath(rel).parts
        or posixpath.normpath(rel) != rel
    ):
        raise BundleError(
            f"{what} {rel!r} is not a relative path inside the bundle: a device loads only its signed files"
        )
    return rel


def _listed(rel: str, what: str, listed: set[str]) -> str:
    if rel not in listed:
        raise BundleError(
            f"{what} {rel!r} is not in the bundle's signed file list: a device loads only its signed files"
        )
    return rel


def _directory(rel: str, listed: set[str]) -> bool:
    """Whether `rel` names a folder of listed files (a CoreML package) rather than a listed file."""
    return rel not in listed and any(path.startswith(rel + "/") for path in listed)


def check_manifest_paths(manifest: Manifest) -> None:
    """What the manifest alone tells: every path it names for loading is relative and in its own file list."""
    listed = {entry.path for entry in manifest.files}
    for entry in manifest.files:
        _relative(entry.path, "bundle file")
    model = _relative(manifest.model_path, "model_path")
    if not (manifest.format == "coreml" and _directory(model, listed)):
        _listed(model, "model_path", listed)
    for rel, what in _named_files(manifest):
        _listed(_relative(rel, what), what, listed)
    for op in manifest.custom_ops:
        name = op.library
        if name is not None and (not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name):
            raise BundleError(
                f"custom op {op.key} names library {name!r}: a library is a bare file name the device looks up in "
                "its own custom-op library folders"
            )


def _named_files(manifest: Manifest) -> list[tuple[str, str]]:
    named = [(manifest.golden.path, "golden set")]
    if manifest.drift_reference:
        named.append((manifest.drift_reference, "drift reference"))
    if manifest.tensorrt is not None and manifest.tensorrt.calibration_table:
        named.append((manifest.tensorrt.calibration_table, "TensorRT calibration table"))
    return named


class _Files:
    """The unpacked bundle at `root`, each path checked against the signed list and resolved on disk."""

    def __init__(self, bundle_dir: Path, manifest: Manifest) -> None:
        try:
            self.root = bundle_dir.resolve(strict=True)
        except OSError as err:
            raise BundleError(f"bundle folder {bundle_dir} cannot be read: {err}") from err
        self.listed = {entry.path for entry in manifest.files}

    def file(self, rel: str, what: str) -> Path:
        """The listed file `rel`, a regular file at exactly root/rel: no link anywhere on the way, nothing outside."""
        _listed(_relative(rel, what), what, self.listed)
        lexical = self.root.joinpath(*PurePosixPath(rel).parts)
        try:
            resolved = lexical.resolve(strict=True)
        except OSError as err:
            raise BundleError(f"{what} {rel!r} is missing from the installed bundle: {err}") from err
        if resolved != lexical:
            where = "outside the bundle" if not resolved.is_relative_to(self.root) else "elsewhere in the bundle"
            raise BundleError(f"{what} {rel!r} is a symbolic link to {where} ({resolved}): a device loads only its "
                              "signed files")  # fmt: skip
        if not lexical.is_file():
            raise BundleError(f"{what} {rel!r} is not a regular file")
        return lexical

    def folder(self, rel: str, what: str) -> None:
        """A CoreML package: every entry in it a regular file on the signed list (or a folder of them)."""
        _relative(rel, what)
        top = self.root.joinpath(*PurePosixPath(rel).parts)
        if top.is_symlink() or not top.is_dir():
            raise BundleError(f"{what} {rel!r} is not a folder of the bundle's signed files")
        for folder, dirs, names in os.walk(top, followlinks=False):
            for name in [*dirs, *names]:
                path = Path(folder) / name
                inner = path.relative_to(self.root).as_posix()
                mode = path.lstat().st_mode
                if stat.S_ISDIR(mode):
                    continue
                if not stat.S_ISREG(mode):
                    raise BundleError(f"{what} holds {inner!r}, which is not a regular file: a device loads only its "
                                      "signed files")  # fmt: skip
                self.file(inner, f"{what} file")


def check_bundle_files(bundle_dir: Path, manifest: Manifest) -> None:
    """Every file loading this unpacked bundle would open is a signed file inside `bundle_dir`; BundleError
    naming the first that is not."""
    check_manifest_paths(manifest)
    files = _Files(bundle_dir, manifest)
    model_rel = manifest.model_path
    if manifest.format == "coreml" and _directory(model_rel, files.listed):
        files.folder(model_rel, "model_path")
        model = None
    else:
        model = files.file(model_rel, "model_path")
    for rel, what in _named_files(manifest):
        files.file(rel, what)
    if model is None:
        return
    if manifest.format in ONNX_FORMATS and not model_rel.endswith(
        ".ort"
    ):  # ONNX Runtime's ORT format: no external data
        folder = posixpath.dirname(model_rel)
        for ref in external_data(model):
            what = f"external data of tensor {ref.tensor!r}"
            location = _relative(ref.location, what)
            data = files.file(posixpath.join(folder, location) if folder else location, what)
            size = data.stat().st_size
            if ref.offset > size or (ref.length is not None and ref.offset + ref.length > size):
                raise BundleError(
                    f"{what} asks for bytes {ref.offset}..{ref.offset + (ref.length or 0)} of {location!r}, "
                    f"which holds {size}"
                )
    if manifest.format == "openvino-ir" and model_rel.endswith(".xml"):
        weights = model_rel[: -len(".xml")] + ".bin"
        if weights in files.listed or os.path.lexists(files.root.joinpath(*PurePosixPath(weights).parts)):
            files.file(weights, "OpenVINO weights")


__all__ = ["check_bundle_files", "check_manifest_paths"]
