"""An attacker's native library and the generative bundles that try to have the agent load it.

`constructor_library(folder)` compiles, with the machine's C compiler, a shared library whose constructor writes a
marker file (its path from $EDGEFLEET_TEST_MARKER, read when the library is loaded): if the marker exists, the
library's code ran. It has no `RegisterCustomOps`, so a runtime that loads it fails afterwards, too late.

`resigned_with(...)` re-signs a tinylm bundle with the bundle key alone (what the attacker holds): the library added
to the model folder and the signed file list, its genai_config.json and/or the manifest's runtime_config edited.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgefleet.core.bundle.archive import describe_files, pack_bundle, unpack_bundle
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

MARKER_ENV = "EDGEFLEET_TEST_MARKER"
_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void edgefleet_test_mark(void) {
    const char *path = getenv("EDGEFLEET_TEST_MARKER");
    if (path == NULL) return;
    FILE *f = fopen(path, "w");
    if (f != NULL) { fputs("the library's constructor ran\n", f); fclose(f); }
}
"""


def constructor_library(folder: Path, name: str = "libedgefleet_marker.so") -> Path:
    """A shared library whose constructor writes $EDGEFLEET_TEST_MARKER. Fails (never skips) without a C compiler:
    CI installs gcc (.ci/run)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler (cc or gcc) is needed to build the attacker's library: apt-get install gcc"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "marker.c"
    source.write_text(_SOURCE)
    library = folder / name
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, capture_output=True)
    return library


def resigned_with(
    source: Path,
    out: Path,
    key: SigningKey,
    trusted: TrustedKeys,
    version: str,
    *,
    library: Path | None = None,
    edit_config: Callable[[dict[str, Any]], None] | None = None,
    runtime_config: dict[str, str | int] | None = None,
) -> Path:
    """`source` (a signed onnx-genai bundle) re-signed by `key` as `version`: `library` copied into its model folder
    and signed, `edit_config` applied to its genai_config.json, `runtime_config` set in the manifest."""
    unpacked = out / f"resigned-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    assert manifest.generation is not None
    folder = manifest.generation.model_dir
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    if library is not None:
        rel = f"{folder}/{library.name}"
        shutil.copyfile(library, unpacked / rel)
        sources[rel] = unpacked / rel
    if edit_config is not None:
        config_path = unpacked / folder / "genai_config.json"
        config = json.loads(config_path.read_text())
        edit_config(config)
        config_path.write_text(json.dumps(config, indent=2))
    generation = manifest.generation
    if runtime_config is not None:
        generation = generation.model_copy(update={"runtime_config": runtime_config})
    updated = manifest.model_copy(update={
        "model_version": version, "bundle_id": f"{manifest.model_name}-{version}-{manifest.profile}",
        "files": describe_files(sources), "generation": generation,
    })  # fmt: skip
    path = out / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


def custom_ops_library(name: str) -> Callable[[dict[str, Any]], None]:
    """A genai_config.json edit: the decoder's session options name `name` as their custom-op library."""

    def edit(config: dict[str, Any]) -> None:
        config["model"]["decoder"]["session_options"]["custom_ops_library"] = name

    return edit


__all__ = ["MARKER_ENV", "constructor_library", "custom_ops_library", "resigned_with"]
