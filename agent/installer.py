"""Installing a bundle like an A/B update: verify → download → unpack → load → golden set → commit.

Nothing touches the committed bundle until the new one has passed every check; any failure leaves
the device on what it was running. What can be known from the signed manifest alone is checked before a
single block is downloaded: the signature, the profile, the version, the size, the disk, and whether this
device can run the bundle at all (its format, at least one of its execution providers, the GPU a TensorRT
bundle needs, the custom operators it holds); each refusal says why.
"""

from __future__ import annotations

import logging
import queue
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgefleet.agent import backends, custom_ops
from edgefleet.agent.runtime import LoadedModel, RuntimeOptions
from edgefleet.agent.store import Store, atomic_write
from edgefleet.agent.transfer import BlockDownload, TransferError
from edgefleet.core.bundle import MANIFEST_NAME, SIGNATURE_NAME, SignedManifest, unpack_bundle, verify_files
from edgefleet.core.errors import BrokerError, BundleError
from edgefleet.core.manifest import Manifest, parse_version
from edgefleet.core.messages import BundleOffer, Desired, MessageError, decode
from edgefleet.core.mqtt import Connection
from edgefleet.core.signing import TrustedKeys
from edgefleet.core.topics import Topics

log = logging.getLogger(__name__)

SUPPORTED_FORMATS = ("onnx", "openvino-ir", "coreml", "onnx-tensorrt")
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")  # what an onnx-tensorrt bundle is for


class Refused(BundleError):
    """The bundle must not be installed here (bad signature, wrong profile, downgrade, failed checks)."""


@dataclass(frozen=True)
class InstallContext:
    conn: Connection
    topics: Topics
    store: Store
    trusted: TrustedKeys
    profile: str
    runtime: RuntimeOptions
    block_window: int
    offer_timeout_s: float
    min_free_bytes: int
    size_limit_bytes: int


Notify = Callable[[str, str, float | None], None]  # (event kind, detail, progress)


def fetch_offer(ctx: InstallContext, bundle_id: str) -> BundleOffer:
    """Wait for the retained offer of `bundle_id` (transient failure: BrokerError)."""
    inbox: queue.Queue[bytes] = queue.Queue()
    topic = ctx.topics.bundle_offer(bundle_id)
    ctx.conn.subscribe(topic, lambda _t, payload, _r: inbox.put(payload))
    try:
        payload = inbox.get(timeout=ctx.offer_timeout_s)
    except queue.Empty:
        raise BrokerError(f"no offer for bundle {bundle_id} on the broker within {ctx.offer_timeout_s:g} s") from None
    finally:
        ctx.conn.unsubscribe(topic)
    try:
        offer = decode(BundleOffer, payload)
    except MessageError as err:
        raise Refused(f"offer for {bundle_id} is malformed: {err}") from err
    if offer.bundle_id != bundle_id:
        raise Refused(f"offer on {bundle_id}'s topic names bundle {offer.bundle_id}")
    return offer


def check_offer(ctx: InstallContext, offer: BundleOffer, desired: Desired, versions: dict[str, str]) -> Manifest:
    """Everything that can be refused before a single block is downloaded."""
    try:
        manifest = SignedManifest(offer.manifest_json, offer.key_id, offer.signature).verify(ctx.trusted)
    except BundleError as err:
        raise Refused(str(err)) from err
    if manifest.bundle_id != desired.bundle_id:
        raise Refused(f"signed manifest is for {manifest.bundle_id}, not the desired {desired.bundle_id}")
    if manifest.profile != ctx.profile:
        raise Refused(f"bundle is built for profile {manifest.profile}; this device is {ctx.profile}")
    if manifest.format not in SUPPORTED_FORMATS:
        raise Refused(
            f"bundle format {manifest.format} is not supported by this agent ({', '.join(SUPPORTED_FORMATS)})"
        )
    check_runnable(manifest)
    running = versions.get(manifest.model_name)
    if running is not None and parse_version(manifest.model_version) <= parse_version(running) and not desired.rollback:
        raise Refused(
            f"{manifest.model_name} version {manifest.model_version} is not newer than {running}, "
            "which this device already installed (a rollback must be marked by the host)"
        )
    if offer.transfer.size > ctx.size_limit_bytes:
        raise Refused(
            f"bundle is {offer.transfer.size / 1e6:.1f} MB; "
            f"profile {ctx.profile} allows {ctx.size_limit_bytes / 1e6:.1f} MB"
        )
    free = shutil.disk_usage(ctx.store.root).free
    needed = 2 * offer.transfer.size + ctx.min_free_bytes  # the download and its unpacked copy
    if free < needed:
        raise Refused(f"not enough disk: {free / 2**20:.1f} MiB free, {needed / 2**20:.1f} MiB needed")
    return manifest


def check_runnable(manifest: Manifest) -> None:
    """Refused when this device cannot run the bundle, whatever the files hold: no usable provider (a CoreML
    bundle off macOS, a browser bundle), no NVIDIA GPU for a TensorRT bundle, custom ops it lacks."""
    try:
        custom_ops.check(manifest)
    except BundleError as err:
        raise Refused(str(err)) from err
    custom = [op.key for op in manifest.custom_ops]
    found = {p: backends.availability(p, manifest.format, custom_ops=custom) for p in dict.fromkeys(manifest.providers)}
    if manifest.format == "onnx-tensorrt":
        gpu = {p: a for p, a in found.items() if p in GPU_PROVIDERS}
        if not any(a.ok for a in gpu.values()):
            reasons = "; ".join(f"{p}: {a.reason}" for p, a in gpu.items()) or "the bundle lists neither"
            raise Refused(f"TensorRT bundle needs an NVIDIA GPU with the TensorRT or CUDA EP ({reasons})")
    if not any(a.ok for a in found.values()):
        reasons = "; ".join(f"{p}: {a.reason}" for p, a in found.items()) or "the bundle lists none"
        raise Refused(f"none of the bundle's execution providers can run on this device ({reasons})")


def download(ctx: InstallContext, offer: BundleOffer, notify: Notify) -> Path:
    last = [-1.0]

    def progress(held: int, total: int) -> None:
        fraction = held / total
        if fraction - last[0] >= 0.1 or held == total:
            last[0] = fraction
            notify("download-progress", f"{held}/{total} blocks", fraction)

    fetch = BlockDownload(
        ctx.conn,
        ctx.topics,
        offer,
        ctx.store.download_path(offer.bundle_id),
        window=ctx.block_window,
        progress=progress,
    )
    if fetch.held_blocks():
        notify("download-started", f"resuming with {fetch.held_blocks()}/{offer.transfer.block_count} blocks", None)
    else:
        notify("download-started", f"{offer.transfer.size} bytes in {offer.transfer.block_count} blocks", 0.0)
    path = fetch.run()
    notify("downloaded", f"{fetch.bytes_received} bytes fetched, sha256 ok", 1.0)
    return path


def stage(ctx: InstallContext, offer: BundleOffer, bundle_file: Path) -> tuple[Path, Manifest]:
    """Unpack and verify into `<id>.staging`, keeping the signed manifest beside the files."""
    staging = ctx.store.staging_dir(offer.bundle_id)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        manifest = unpack_bundle(bundle_file, staging, ctx.trusted)
    except BundleError as err:
        Path(bundle_file).unlink(missing_ok=True)
        raise Refused(f"bundle failed verification: {err}") from err
    signed = SignedManifest(offer.manifest_json, offer.key_id, offer.signature)
    if manifest.model_dump() != signed.verify(ctx.trusted).model_dump():
        shutil.rmtree(staging, ignore_errors=True)
        raise Refused("the bundle's manifest differs from the offered manifest")
    atomic_write(staging / MANIFEST_NAME, offer.manifest_json.encode())
    atomic_write(staging / SIGNATURE_NAME, signed.signature_json().encode())
    return staging, manifest


def load_and_check(bundle_dir: Path, manifest: Manifest, runtime: RuntimeOptions) -> LoadedModel:
    """Load (choosing the provider), warm up and run the golden set; Refused when outputs leave tolerance."""
    model = runtime.load(bundle_dir, manifest)
    result = model.check_golden()
    if not result.passed:
        raise Refused(f"golden set failed on this device: {result.reason}")
    return model


def load_installed(store: Store, bundle_id: str, trusted: TrustedKeys, runtime: RuntimeOptions) -> LoadedModel:
    """Re-verify an installed bundle (signature and file hashes) and load it; used at start-up."""
    directory = store.bundle_dir(bundle_id)
    try:
        signed = SignedManifest.from_dir(directory)
    except (OSError, ValueError) as err:
        raise BundleError(f"installed bundle {bundle_id} has no readable signed manifest") from err
    manifest = signed.verify(trusted)
    verify_files(directory, manifest)
    return load_and_check(directory, manifest, runtime)


def install(ctx: InstallContext, desired: Desired, versions: dict[str, str], notify: Notify) -> LoadedModel:
    """The whole pipeline up to (not including) commit. Raises Refused, TransferError or BrokerError."""
    offer = fetch_offer(ctx, desired.bundle_id)
    manifest = check_offer(ctx, offer, desired, versions)
    notify(
        "verified",
        f"signature by {offer.key_id} ok; {manifest.model_name} {manifest.model_version} for {manifest.profile}",
        None,
    )
    bundle_file = download(ctx, offer, notify)
    staging, manifest = stage(ctx, offer, bundle_file)
    try:
        model = load_and_check(staging, manifest, ctx.runtime)
    except BundleError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise Refused(str(err)) from err
    assert model.last_golden is not None
    notify("installed", f"staged and {model.last_golden.reason} on {model.provider}", None)
    return model


__all__ = [
    "InstallContext",
    "Refused",
    "TransferError",
    "check_runnable",
    "fetch_offer",
    "install",
    "load_installed",
]
