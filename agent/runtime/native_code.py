"""Every native library the agent hands a runtime to load, logged and kept for the device's status.

Native code a bundle needs (a custom-op library, onnxruntime-extensions' op library) comes only from the device's
own opt-in (`--custom-op-libs` folders, custom-op packages; agent/runtime/custom_ops.py); a bundle's files and its
runtime configuration never name one (edgefleet/core/bundle/runtime_config.py). Each time a bundle's load is
given such a library it is recorded here: logged with its path, sha256 and the bundle, and reported in the status
(`DeviceStatus.native_code`), so an operator sees which native code runs in the agent and for which bundle.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from edgefleet.core.messages import NativeCodeLoad, now

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_LOADS: dict[str, NativeCodeLoad] = {}  # path → what was recorded


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        return f"unreadable: {err.strerror or err}"
    return digest.hexdigest()


def record(path: str | Path, origin: str, bundle_id: str) -> NativeCodeLoad:
    """Record (and log) that `bundle_id`'s load is given the native library `path`, which comes from `origin`."""
    resolved = Path(path).resolve()
    sha256 = _sha256(resolved)
    with _LOCK:
        seen = _LOADS.get(str(resolved))
        at = now()
        entry = NativeCodeLoad(
            path=str(resolved), sha256=sha256, origin=origin, bundle_id=bundle_id,
            loads=(seen.loads + 1) if seen else 1, first_ts=seen.first_ts if seen else at, last_ts=at,
        )  # fmt: skip
        _LOADS[entry.path] = entry
    log.warning("native code: %s (%s, sha256 %s) loads for bundle %s", entry.path, origin, sha256, bundle_id)
    return entry


def loads() -> list[NativeCodeLoad]:
    """Every native library recorded since the agent started, oldest first."""
    with _LOCK:
        return sorted(_LOADS.values(), key=lambda e: e.first_ts)


__all__ = ["loads", "record"]
