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
- the golden set, the drift reference and a TensorRT calibration table the manifest names;
- a generative bundle's model folder (`generation.model_dir`), which its runtime loads whole: it must hold nothing
  but listed regular files, its `model_path` lies inside it, the ONNX files its `genai_config.json` names are listed
  files of the folder, and their external data is checked as above; its golden prompts and tokenizer files.
Custom-op libraries are never bundle files: a bundle names them by file name and the device looks them up in its
own library folders (agent/runtime/custom_ops.py), so a name must be a bare file name. TensorRT engine caches are
the device's own, in its cache folder, and not checked here.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from edgefleet.agent.runtime.external_data import external_data
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import BundleError

ONNX_FORMATS = ("onnx", "onnx-tensorrt")
MAX_GENAI_CONFIG_BYTES = 1 << 20  # a genai_config.json larger than this is refused unread


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
    if manifest.generation is not None:
        folder = _relative(manifest.generation.model_dir, "generation model_dir")
        if not model.startswith(folder + "/"):
            raise BundleError(f"model_path {model!r} is not inside the generation model folder {folder!r}")
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
    if manifest.generation is not None:
        named.append((manifest.generation.golden, "golden prompts"))
        named += [(rel, "tokenizer file") for rel in manifest.generation.tokenizer_files]
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
    if manifest.generation is not None:
        _check_generative(files, manifest, model)
        return
    if manifest.format in ONNX_FORMATS and not model_rel.endswith(
        ".ort"
    ):  # ONNX Runtime's ORT format: no external data
        _check_external_data(files, model_rel, model)
    if manifest.format == "openvino-ir" and model_rel.endswith(".xml"):
        weights = model_rel[: -len(".xml")] + ".bin"
        if weights in files.listed or os.path.lexists(files.root.joinpath(*PurePosixPath(weights).parts)):
            files.file(weights, "OpenVINO weights")


def _check_external_data(files: _Files, model_rel: str, model: Path) -> None:
    """Every external-data file of the ONNX model `model_rel` is a listed file, and holds the bytes asked of it."""
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


def _check_generative(files: _Files, manifest: Manifest, model: Path) -> None:
    """The folder a generation runtime loads whole: nothing in it but listed regular files; for ONNX Runtime GenAI,
    the ONNX files its config names and their external data."""
    assert manifest.generation is not None
    folder = manifest.generation.model_dir
    files.folder(folder, "generation model folder")
    if manifest.format != "onnx-genai":
        return
    for name in _genai_model_files(model):
        what = f"ONNX file {name!r} named by {manifest.model_path}"
        onnx_rel = posixpath.join(folder, _relative(name, what))
        _check_external_data(files, onnx_rel, files.file(onnx_rel, what))


def _genai_model_files(config_path: Path) -> list[str]:
    """The `filename` entries of a genai_config.json (the decoder's, and any other model part's)."""
    if config_path.stat().st_size > MAX_GENAI_CONFIG_BYTES:
        raise BundleError(f"{config_path.name} is over {MAX_GENAI_CONFIG_BYTES} bytes")
    try:
        config = json.loads(config_path.read_text("utf-8"))
    except (OSError, ValueError) as err:
        raise BundleError(f"{config_path.name} is not readable JSON: {err}") from err
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "filename":
                    if not isinstance(value, str):
                        raise BundleError(f"{config_path.name} names a model file that is not a string: {value!r}")
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(config.get("model") if isinstance(config, dict) else None)
    return found


__all__ = ["check_bundle_files", "check_manifest_paths"]
