"""What the control-plane commands share: durations, optional thresholds, the store option, publishing."""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.cli.common import connect, edgefleet_home

if TYPE_CHECKING:
    from edgefleet.control.store import Store

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """ "90", "90s", "5m", "6h", "30d" → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 30s, 5m, 6h or 30d")
    return float(match[1]) * _UNITS[match[2]]


def optional_float(text: str) -> float | None:
    """A number, or `none` to switch a criterion off."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid number {text!r} (or 'none' to switch it off)") from err


def default_store() -> str:
    return os.environ.get("EDGEFLEET_STORE", f"sqlite://{edgefleet_home() / 'control.sqlite'}")


def add_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=default_store(),
        help="store URL, sqlite:///PATH or postgresql://USER@HOST/DB (env EDGEFLEET_STORE)",
    )


def open_from(args: argparse.Namespace) -> Store:
    from edgefleet.control.store_open import open_store

    return open_store(args.store)


def publish_bundles(args: argparse.Namespace, store: Store, bundles: list[Path]) -> list[Any]:
    """Publish bundle files (blocks + signed offer) and record them in the store; their manifests."""
    from edgefleet.control.publish import publish_bundle
    from edgefleet.control.store import BundleRecord

    conn, topics = connect(args, "control")
    manifests = []
    try:
        for path in bundles:
            manifest, offer = publish_bundle(conn, topics, path)
            store.put_bundle(
                BundleRecord(
                    manifest.bundle_id, manifest.model_name, manifest.model_version, manifest.profile,
                    offer.transfer.size, manifest.accuracy.budget, time.time(),
                )
            )  # fmt: skip
            manifests.append(manifest)
    finally:
        conn.stop()
    return manifests
