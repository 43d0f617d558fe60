"""What the control-plane commands share: durations, optional thresholds, the store option, publishing."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.cli.common import add_store as add_store  # re-exported for the commands
from edgefleet.cli.common import connect, resolve
from edgefleet.cli.common import duration as duration  # re-exported for the commands

if TYPE_CHECKING:
    from edgefleet.control.store import Store

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


def optional_float(text: str) -> float | None:
    """A number, or `none` to switch a criterion off."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid number {text!r} (or 'none' to switch it off)") from err


def open_from(args: argparse.Namespace) -> Store:
    from edgefleet.control.store import open_store

    resolve(args)
    return open_store(args.store)


def publish_bundles(args: argparse.Namespace, store: Store, bundles: list[Path]) -> list[Any]:
    """Publish bundle files (blocks + signed offer) and record them in the store; their manifests."""
    from edgefleet.control.publish.publisher import publish_bundle
    from edgefleet.control.rollout.judge.bundle_facts import record_facts
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
            record_facts(store, path, manifest, offer.transfer)  # what its rollouts weigh device reports against
            manifests.append(manifest)
    finally:
        conn.stop()
    return manifests
