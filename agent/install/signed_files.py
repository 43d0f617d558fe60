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
  but listed regular files, its `model_path` lies inside it, and its golden prompts and tokenizer files. Its
  `genai_config.json` is read as data before anything loads it: every key on the allow-list of
  edgefleet/core/bundle/runtime_config.py (nothing that loads a library, names a path or sets a provider the
  profile does not allow), and every file it names (`filename`, `config_filename`, `adapter_filename`, `data_file`,
  `tokenizer_dir`) a listed file (or folder of them) of the model folder; the ONNX files' external data is checked as
  above. The manifest's `generation.runtime_config` passes the same allow-list from the manifest alone, and a
  generative bundle lists only providers its profile allows.
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

from edgefleet.agent.runtime import backends as runtime_backends
from edgefleet.agent.runtime.external_data import external_data
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.bundle.runtime_config import (
    ConfigRefused,
    check_genai_config,
    check_runtime_config,
    runtime_of,
)
from edgefleet.core.errors import BundleError, EdgefleetError
from edgefleet.core.profiles import get_profile

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
        generative_providers(manifest)
        check_runtime_config(runtime_of(manifest.format), manifest.generation.runtime_config)
    for rel, what in _named_files(manifest):
        _listed(_relative(rel, what), what, listed)
    for op in manifest.custom_ops:
        name = op.library
        if name is not None and (not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name):
            raise BundleError(
                f"custom op {op.key} names library {name!r}: a library is a bare file name the device looks up in "
                "its own custom-op library folders"
            )


def generative_providers(manifest: Manifest) -> list[str]:
    """The providers a generative bundle lists, when its profile allows each of them, or a backend plugin this device
    loaded itself claims it ($EDGEFLEET_BACKENDS: the operator's opt-in, as `--custom-op-libs` is for libraries);
    ConfigRefused naming one neither allows. A profile this agent does not know (a profile folder of its own) adds no
    limit."""
    try:
        profile = get_profile(manifest.profile)
    except EdgefleetError:
        return list(manifest.providers)
    allowed = {p for target in profile.generation for p in target.providers}
    for provider in manifest.providers:
        if provider not in allowed and not _device_plugin_claims(provider):
            raise ConfigRefused(
                f"provider {provider!r} is not one profile {manifest.profile} allows for language models "
                f"({', '.join(sorted(allowed)) or 'none'}), nor one a backend plugin of this device claims"
            )
    return list(manifest.providers)


def _device_plugin_claims(provider: str) -> bool:
    """Whether a backend the device's operator loaded as a plugin (not one of the agent's own) claims `provider`."""
    return any(
        not type(backend).__module__.startswith("edgefleet.") and backend.claims(provider)
        for backend in runtime_backends.backends()
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
    its genai_config.json checked as data against the allow-list, the files it names and their external data."""
    assert manifest.generation is not None
    folder = manifest.generation.model_dir
    files.folder(folder, "generation model folder")
    if manifest.format != "onnx-genai":
        return
    devices = [p.split(":", 1)[1] for p in generative_providers(manifest) if ":" in p]
    named = check_genai_config(_read_genai_config(model), devices)
    for where, name in named.named:
        what = f"{where} {name!r} named by {manifest.model_path}"
        rel = posixpath.join(folder, _relative(name, what))
        if where.endswith(".tokenizer_dir"):
            if not (rel == folder or _directory(rel, files.listed)):
                raise BundleError(f"{what} is not a folder of the bundle's signed files")
            continue
        path = files.file(rel, what)
        if where.endswith(".filename"):
            _check_external_data(files, rel, path)


def _read_genai_config(config_path: Path) -> object:
    """The parsed genai_config.json, read as data (never handed to the runtime unchecked)."""
    if config_path.stat().st_size > MAX_GENAI_CONFIG_BYTES:
        raise BundleError(f"{config_path.name} is over {MAX_GENAI_CONFIG_BYTES} bytes")
    try:
        return json.loads(config_path.read_text("utf-8"))
    except (OSError, ValueError) as err:
        raise BundleError(f"{config_path.name} is not readable JSON: {err}") from err


__all__ = ["check_bundle_files", "check_manifest_paths", "generative_providers"]
