"""Installing a bundle like an A/B update: verify → download → unpack → load → golden set → commit.

Nothing touches the committed bundle until the new one has passed every check; any failure leaves
the device on what it was running. What can be known from the signed manifest alone is checked before a
single block is downloaded: the signature, the profile, the version, the size, the disk, and whether this
device can run the bundle at all (its format, at least one of its execution providers, the GPU a TensorRT
bundle needs, the custom operators it holds); each refusal says why.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgefleet.agent.install.signed_files import check_bundle_files, check_manifest_paths
from edgefleet.agent.install.store import FloorHolder, Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.agent.runtime import LoadedModel, RuntimeOptions, backends, custom_ops
from edgefleet.agent.transfer import LinkPacer, TransferError, open_download, resolve_index, write_index
from edgefleet.core.bundle.archive import MANIFEST_NAME, SignedManifest, parse_manifest, unpack_pinned, verify_files
from edgefleet.core.bundle.manifest import Manifest, parse_version
from edgefleet.core.durable import atomic_write
from edgefleet.core.errors import BrokerError, BundleError, DiskFullError, SignatureError
from edgefleet.core.messages import BundleOffer, Desired, MessageError, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.transfer.blocks import check_layout, verify_offer
from edgefleet.core.trust.keyset import public_pem

log = logging.getLogger(__name__)

SUPPORTED_FORMATS = ("onnx", "openvino-ir", "coreml", "onnx-tensorrt", "onnx-genai", "openvino-genai")
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")  # what an onnx-tensorrt bundle is for
OFFER_NAME = "offer.json"  # the signed offer an installed bundle was verified by (re-checked at start-up)
SIGNER_NAME = "signer.pub"  # the bundle key that signed it, as delegated at install time


class Refused(BundleError):
    """The bundle must not be installed here (bad signature, wrong profile, downgrade, failed checks)."""


@dataclass(frozen=True)
class InstallContext:
    conn: Connection
    topics: Topics
    store: Store
    trust: DeviceTrust
    profile: str
    runtime: RuntimeOptions
    block_window: int
    offer_timeout_s: float
    min_free_bytes: int
    size_limit_bytes: int
    accepted_profiles: tuple[str, ...] = ()  # every profile this device runs bundles for; () = `profile` alone
    link: LinkPacer | None = None  # the device link's cap and report priority (agent/transfer/link.py)


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


def check_offer(
    ctx: InstallContext, offer: BundleOffer, desired: Desired, floor: dict[str, str], *, shadow: bool = False
) -> Manifest:
    """Everything that can be refused before a single block is downloaded: one signature by a delegated bundle
    key over the manifest AND the transfer layout, a possible layout, the document's exact bundle, the version
    floor. Not enough disk is transient (TransferError): the device retries when space returns."""
    try:
        ctx.trust.consider(offer.keyset)
        verify_offer(offer, ctx.trust.keys("bundle"))
    except SignatureError as err:
        raise Refused(f"offer rejected: {err}") from err
    check_layout(offer.transfer, ctx.size_limit_bytes)
    manifest = parse_manifest(offer.manifest_json)
    if manifest.benchmark_only:
        raise Refused(f"{manifest.bundle_id} is a benchmark-only candidate: measured on request, never installed")
    _check_paths(manifest)
    _check_matches(manifest, offer, desired, shadow=shadow)
    accepted = ctx.accepted_profiles or (ctx.profile,)
    if manifest.profile not in accepted:
        raise Refused(
            f"bundle is built for profile {manifest.profile}; this device is {ctx.profile} "
            f"and runs bundles for {', '.join(accepted)}"
        )
    if manifest.format not in SUPPORTED_FORMATS:
        raise Refused(
            f"bundle format {manifest.format} is not supported by this agent ({', '.join(SUPPORTED_FORMATS)})"
        )
    check_runnable(manifest)
    if not shadow:  # a shadow runs beside the served bundle and is never committed: the floor does not apply
        check_floor(manifest, desired, floor, ctx.store.floor_holders(), manifest_sha256(offer))
    free = shutil.disk_usage(ctx.store.root).free
    needed = 2 * offer.transfer.size + ctx.min_free_bytes  # the download and its unpacked copy
    if free < needed:
        raise TransferError(
            f"not enough disk: {free / 2**20:.1f} MiB free, {needed / 2**20:.1f} MiB needed (will retry)"
        )
    return manifest


def _check_paths(manifest: Manifest) -> None:
    try:
        check_manifest_paths(manifest)
    except BundleError as err:
        raise Refused(f"bundle {manifest.bundle_id} refused: {err}") from err


def _check_matches(manifest: Manifest, offer: BundleOffer, desired: Desired, *, shadow: bool = False) -> None:
    """Mix-and-match: the signed offer must be exactly the bundle the signed desired document names (for a shadow,
    the document names only its bundle id)."""
    if manifest.bundle_id != offer.bundle_id or manifest.bundle_id != desired.bundle_id:
        raise Refused(f"signed manifest is for {manifest.bundle_id}, not the desired {desired.bundle_id}")
    if shadow:
        return
    named = (desired.model_name, desired.model_version, desired.profile)
    if (manifest.model_name, manifest.model_version, manifest.profile) != named:
        raise Refused(
            f"desired document names {'/'.join(named)} but bundle {manifest.bundle_id} is "
            f"{manifest.model_name}/{manifest.model_version}/{manifest.profile}"
        )


def manifest_sha256(offer: BundleOffer) -> str:
    """sha256 of the signed manifest's bytes, as an installed bundle keeps them (its manifest.json)."""
    return hashlib.sha256(offer.manifest_json.encode()).hexdigest()


def check_floor(
    manifest: Manifest, desired: Desired, floor: dict[str, str], holders: Mapping[str, FloorHolder] | None = None,
    digest: str | None = None,
) -> None:  # fmt: skip
    """A version at or below the highest ever committed for the model needs a signed document naming exactly
    this bundle in `allow_downgrade_to`; the unsigned `rollback` flag alone never allows one. The one exception:
    the very bundle that committed the floor version (same id, same signed manifest bytes, `digest`) may be
    installed again, so a rollout retried after a rollback installs it; another bundle reusing the version may
    not (docs/trust.md, "Retrying a rolled-back bundle")."""
    highest = floor.get(manifest.model_name)
    if highest is None or parse_version(manifest.model_version) > parse_version(highest):
        return
    holder = (holders or {}).get(manifest.model_name)
    if (
        holder is not None and digest is not None and holder.version == manifest.model_version == highest
        and holder.bundle_id == manifest.bundle_id and holder.manifest_sha256 == digest
    ):  # fmt: skip
        log.info("%s: the bundle that committed the floor %s, installed again", manifest.bundle_id, highest)
        return
    if desired.allow_downgrade_to == manifest.bundle_id:
        log.warning("signed downgrade of %s to %s (floor %s)", manifest.model_name, manifest.model_version, highest)
        return
    raise Refused(
        f"{manifest.model_name} version {manifest.model_version} is not newer than {highest}, the highest this "
        "device ever committed (a downgrade must be a signed decision naming this bundle)"
    )


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
    unit = "chunks" if offer.transfer.chunks else "blocks"

    def progress(held: int, total: int) -> None:
        fraction = held / total
        if fraction - last[0] >= 0.1 or held == total:
            last[0] = fraction
            notify("download-progress", f"{held}/{total} {unit}", fraction)

    pruned = ctx.store.prune_downloads(keep=offer.bundle_id)
    if pruned:
        log.info("pruned abandoned downloads: %s", ", ".join(pruned))
    fetch = open_download(
        ctx.conn,
        ctx.topics,
        offer,
        ctx.store.download_path(offer.bundle_id),
        bundles_dir=ctx.store.bundles,
        window=ctx.block_window,
        progress=progress,
        link=ctx.link,
    )
    pieces = f"{len(offer.transfer.chunks) or offer.transfer.block_count} {unit}"
    if fetch.held_blocks():
        notify("download-started", f"resuming with {fetch.held_blocks()} of {pieces}", None)
    else:
        notify("download-started", f"{offer.transfer.size} bytes in {pieces}", 0.0)
    path = fetch.run()
    notify("downloaded", f"{fetch.summary()}, every piece's sha256 ok", 1.0)
    return path


def stage(ctx: InstallContext, offer: BundleOffer, bundle_file: Path) -> tuple[Path, Manifest]:
    """Unpack into `<id>.staging` (only once every piece matched its signed sha256; the unpack checks the exact
    signed manifest and every file's pin, which agent/transfer/blocks.py says stands for a whole-file hash), keeping
    the signed offer and its signer's key beside the files. A full disk is transient: TransferError, retried later."""
    staging = ctx.store.staging_dir(offer.bundle_id)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        manifest = unpack_pinned(bundle_file, staging, offer.manifest_json)
    except DiskFullError as err:
        raise TransferError(f"{err}; will retry when space returns") from err
    except BundleError as err:
        Path(bundle_file).unlink(missing_ok=True)
        raise Refused(f"bundle failed verification: {err}") from err
    signer = ctx.trust.keys("bundle").public_keys()[offer.key_id]
    try:
        write_index(staging, bundle_file, offer.transfer)  # which chunks a later delta can take from these files
        atomic_write(staging / MANIFEST_NAME, offer.manifest_json.encode())
        atomic_write(staging / OFFER_NAME, offer.model_dump_json().encode())
        atomic_write(staging / SIGNER_NAME, public_pem(signer).encode())
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise TransferError(f"cannot record the signed offer: {err}; will retry") from err
    return staging, manifest


def load_and_check(bundle_dir: Path, manifest: Manifest, runtime: RuntimeOptions) -> LoadedModel:
    """Check that every file the load opens is a signed file inside `bundle_dir` (agent/install/signed_files.py),
    then load (choosing the provider), warm up and run the golden set; Refused when outputs leave tolerance."""
    try:
        check_bundle_files(bundle_dir, manifest)
    except BundleError as err:
        raise Refused(f"bundle {manifest.bundle_id} refused: {err}") from err
    model = runtime.load(bundle_dir, manifest)
    result = model.check_golden()
    if not result.passed:
        raise Refused(f"golden set failed on this device: {result.reason}")
    return model


def load_installed(store: Store, bundle_id: str, trust: DeviceTrust, runtime: RuntimeOptions) -> LoadedModel:
    """Re-verify an installed bundle (its signed offer and every file hash) and load it; used at start-up and for
    a local rollback. A bundle whose signer was revoked since is refused."""
    directory = store.bundle_dir(bundle_id)
    try:
        offer = BundleOffer.model_validate_json((directory / OFFER_NAME).read_bytes())
        signer = (directory / SIGNER_NAME).read_text("ascii") if (directory / SIGNER_NAME).exists() else None
        manifest_text = (directory / MANIFEST_NAME).read_text("utf-8")
    except FileNotFoundError:
        # Installed by an agent from before signed offers: the converter's manifest signature, current keys only.
        try:
            manifest = SignedManifest.from_dir(directory).verify(trust.keys("bundle"))
        except OSError as err:
            raise BundleError(f"installed bundle {bundle_id} has no readable signed offer or manifest") from err
    except (OSError, ValueError) as err:
        raise BundleError(f"installed bundle {bundle_id} has no readable signed offer") from err
    else:
        if trust.revoked(offer.key_id):
            raise BundleError(f"installed bundle {bundle_id} was signed by {offer.key_id}, which is now revoked")
        verify_offer(offer, trust.installed_keys(signer))
        manifest = parse_manifest(offer.manifest_json)
        if manifest_text != offer.manifest_json:
            raise BundleError(f"installed bundle {bundle_id}'s manifest differs from its signed offer")
    verify_files(directory, manifest)
    return load_and_check(directory, manifest, runtime)


def install(
    ctx: InstallContext, desired: Desired, floor: dict[str, str], notify: Notify, *, shadow: bool = False,
    admit: Callable[[Manifest], object] | None = None,
) -> LoadedModel:  # fmt: skip
    """The whole pipeline up to (not including) commit. Raises Refused, TransferError or BrokerError. `admit`: the
    memory admission (agent/install/admission.py), asked once the signed offer checks out and before a single block
    (of the index or the bundle) is fetched; it raises Refused when the model does not fit."""
    offer = fetch_offer(ctx, desired.bundle_id)
    manifest = check_offer(ctx, offer, desired, floor, shadow=shadow)
    if admit is not None:
        admit(manifest)
    notify(
        "verified",
        f"signature by {offer.key_id} ok; {manifest.model_name} {manifest.model_version} for {manifest.profile}",
        None,
    )
    ctx.runtime.prestart(manifest)  # the measuring worker starts while the bundle downloads
    offer = resolve_index(ctx.conn, ctx.topics, offer, size_limit=ctx.size_limit_bytes, link=ctx.link)  # big list
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
    "check_floor",
    "check_runnable",
    "fetch_offer",
    "install",
    "load_installed",
]


def fetch_candidate(ctx: InstallContext, bundle_id: str, folder: Path) -> tuple[Path, Manifest]:
    """A benchmark-only candidate (agent/runtime/benchmark.py), fetched and verified like any bundle (one signature over
    manifest and layout, signed piece hashes, the tar opened only once every piece matched, unpacked against the
    signed manifest) into `folder`, outside the store: it is measured and deleted, never installed."""
    offer = fetch_offer(ctx, bundle_id)
    try:
        ctx.trust.consider(offer.keyset)
        verify_offer(offer, ctx.trust.keys("bundle"))
    except SignatureError as err:
        raise Refused(f"offer rejected: {err}") from err
    check_layout(offer.transfer, ctx.size_limit_bytes)
    manifest = parse_manifest(offer.manifest_json)
    _check_paths(manifest)
    if not manifest.benchmark_only:
        raise Refused(f"{bundle_id} is not marked benchmark-only; only candidates are measured on request")
    accepted = ctx.accepted_profiles or (ctx.profile,)
    if manifest.profile not in accepted:
        raise Refused(f"candidate {bundle_id} is built for {manifest.profile}; this device runs {', '.join(accepted)}")
    offer = resolve_index(ctx.conn, ctx.topics, offer, size_limit=ctx.size_limit_bytes, link=ctx.link)
    fetch = open_download(ctx.conn, ctx.topics, offer, folder / "candidate.bundle", bundles_dir=ctx.store.bundles,
                          window=ctx.block_window, link=ctx.link)  # fmt: skip
    downloaded = fetch.run()
    try:
        manifest = unpack_pinned(downloaded, folder / "bundle", offer.manifest_json)
    except BundleError as err:
        raise Refused(f"candidate {bundle_id} failed verification: {err}") from err
    finally:
        Path(downloaded).unlink(missing_ok=True)
    try:
        check_bundle_files(folder / "bundle", manifest)
    except BundleError as err:
        raise Refused(f"candidate {bundle_id} refused: {err}") from err
    return folder / "bundle", manifest
