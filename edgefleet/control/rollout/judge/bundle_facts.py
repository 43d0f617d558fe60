"""What the host knows about a bundle from its own build and publish records, to weigh what devices report on it.

Recorded when the bundle is published (`BundleFacts`, kept with the store's publish history), from the signed
manifest, the signed offer's transfer layout and the bundle's golden set:
- the bytes a device must fetch: every chunk on the wire (zstd where the offer says so), by sha256, so the chunks
  a device already held (those of bundles it is recorded as having committed) can be subtracted; a block layout
  is fetched whole; an offer whose chunk list went out as index pages records the pages alone (a weak bound);
- the bundle's own latency: the build's measurement, and the farm devices' per profile (`convert --measure-on`);
- the golden outputs' score bands (`golden_bands`): what any output within tolerance of the build's can score
  (a generative bundle's: its golden prompts' floors up to 1, `generative_bands`);
- the golden set's size (an install runs it once at least);
- the memory it needs on a device: the converter's measured peak per runtime (`Manifest.resources`), or, for a
  bundle built before that was measured, the size of its files (planning admission counts those twice).
Numbers only: nothing here is a string a device chose.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edgefleet.control.rollout.judge.golden_bands import Band, OutputBands, generative_bands, golden_bands
from edgefleet.control.rollout.judge.latency import Source
from edgefleet.control.store import Store
from edgefleet.core.bundle.manifest import Manifest, ResourceNeeds
from edgefleet.core.errors import BundleError
from edgefleet.core.messages import Transfer
from edgefleet.core.quality.generation import GoldenPrompts
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.transfer.chunks import wire_size

MAX_GOLDEN_BYTES = 64 * 1024 * 1024


class BundleFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bundle_id: str
    profile: str
    model_name: str = Field(default="", description="the manifest's model name (empty: recorded before it was kept)")
    io_signature: str = Field(
        default="", description="sha256 of its inputs' and outputs' names, dtypes and shapes (empty: not recorded)"
    )
    size: int = Field(description="the bundle file's bytes")
    wire_bytes: int = Field(description="bytes on the wire for a device that holds none of its chunks")
    chunks: dict[str, int] = Field(default_factory=dict, description="chunk sha256 → bytes on the wire")
    golden_count: int = Field(default=0, description="golden inputs an install runs")
    golden_min_agreement: float | None = Field(
        default=None, description="the manifest's own golden floor: the first bundle on a device is held to it"
    )
    golden: dict[str, OutputBands] = Field(default_factory=dict, description="per output: the scores it can have")
    build_latency_ms: float | None = Field(default=None, description="median at build")
    build_latency_p90_ms: float | None = Field(
        default=None, description="p90 of the build's timing runs (None: recorded before it was kept)"
    )
    build_machine: str = ""
    farm_latency_ms: dict[str, float] = Field(
        default_factory=dict, description="profile → median p50 of the farm devices of that profile"
    )
    runtime: str = Field(default="", description="the runtime the bundle was built for (its recipe's)")
    peak_memory_mb: dict[str, float] = Field(
        default_factory=dict, description="runtime/provider → measured peak memory (empty: not measured)"
    )
    files_bytes: int = Field(default=0, ge=0, description="the bytes of the files the manifest lists")

    def memory_mb(self) -> tuple[float, bool]:
        """(MB the bundle needs loaded, measured): the measured peak for its runtime (else the largest measured),
        or its files' size × 2 when the converter measured none (`measured` False)."""
        if self.peak_memory_mb:
            resources = ResourceNeeds(peak_memory_mb=self.peak_memory_mb)
            return resources.peak_mb(self.runtime or None), True
        return 2 * (self.files_bytes or self.size) / (1024 * 1024), False

    def needed_bytes(self, held: Iterable[BundleFacts]) -> int:
        """Bytes a device must fetch when it holds the chunks of `held` (the bundles it is recorded as having
        committed): a lower bound on what its link counters must show."""
        if not self.chunks:
            return self.wire_bytes
        have: set[str] = set()
        for other in held:
            have.update(other.chunks)
        return sum(n for sha, n in self.chunks.items() if sha not in have)

    def measured_latency(self, profile: str | None) -> tuple[float, Source, str] | None:
        """(median ms, "farm" or "build", where) the bundle's own measurement for a device of `profile`: the farm's
        devices of that profile, else the build's; None when neither measured it."""
        if profile is not None and profile in self.farm_latency_ms:
            return self.farm_latency_ms[profile], "farm", f"the farm's {profile} devices"
        if self.build_latency_ms is not None:
            return self.build_latency_ms, "build", f"the build ({self.build_machine or 'host'})"
        return None

    def measured_spread(self, profile: str | None) -> float:
        """How much the timing runs behind `measured_latency` varied: the build's p90 over its median (at least 1);
        1 for a farm figure (devices that measure alone) or a record without the p90. A build timed on a busy
        machine varies widely, and its median is only as good as that spread."""
        measured = self.measured_latency(profile)
        if measured is None or measured[1] != "build" or not self.build_latency_p90_ms:
            return 1.0
        return max(1.0, self.build_latency_p90_ms / measured[0])

    def model_change(self, previous: BundleFacts | None) -> str:
        """Why this bundle is another model than `previous` (another name, or a graph with other inputs/outputs), or
        "" when it is the same model or either is unknown: another model has no baseline on the device yet."""
        if previous is None or not self.model_name or not previous.model_name:
            return ""
        if self.model_name != previous.model_name:
            return f"another model ({previous.model_name} → {self.model_name})"
        if self.io_signature and previous.io_signature and self.io_signature != previous.io_signature:
            return f"another graph of {self.model_name} (its inputs or outputs changed)"
        return ""

    def build_agreement(self) -> float | None:
        """The share of golden inputs whose argmax the build's own outputs shared with the FP32 reference (its
        manifest's floor is that share less one input): 1.0 for an FP32 bundle, less for a lower precision."""
        if self.golden_min_agreement is None or self.golden_count <= 0:
            return None
        return min(1.0, self.golden_min_agreement + 1.0 / self.golden_count)

    def agreement_band(self) -> Band | None:
        """The band of the legacy `golden_agreement` (the lowest agreement over the outputs)."""
        if not self.golden:
            return None
        bands = [b.agreement for b in self.golden.values()]
        return Band(lo=min(b.lo for b in bands), hi=min(b.hi for b in bands))


def io_signature(manifest: Manifest) -> str:
    """What tells one graph of a model from another: its inputs' and outputs' names, dtypes and shapes. A retrained
    model (new weights, same graph) keeps it, and stays the same model, judged against its previous version."""
    tensors = [t.model_dump(mode="json") for t in (*manifest.inputs, *manifest.outputs)]
    blob = json.dumps({"inputs": len(manifest.inputs), "tensors": tensors}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def facts_of(manifest: Manifest, transfer: Transfer, golden: GoldenSet | GoldenPrompts | None) -> BundleFacts:
    """The facts of one bundle from its manifest, the transfer layout its offer signs, and its golden set."""
    if transfer.chunks:
        chunks = {c.sha256: wire_size(c) for c in transfer.chunks}
        wire = sum(chunks.values())
    elif transfer.index:  # paged chunk list: only the pages are known here
        chunks = {c.sha256: wire_size(c) for c in transfer.index}
        wire = sum(chunks.values())
    else:
        chunks, wire = {}, transfer.size
    farm: dict[str, list[float]] = {}
    for m in manifest.farm.devices if manifest.farm else []:
        if m.p50_ms is not None and m.p50_ms > 0:
            farm.setdefault(m.profile, []).append(m.p50_ms)
    latency = manifest.latency
    return BundleFacts(
        bundle_id=manifest.bundle_id, profile=manifest.profile, model_name=manifest.model_name,
        io_signature=io_signature(manifest), size=transfer.size, wire_bytes=wire, chunks=chunks,
        golden_count=manifest.golden.count, golden_min_agreement=manifest.golden.min_agreement,
        golden=_bands(golden, manifest),
        build_latency_ms=latency.median_ms if latency is not None and latency.median_ms > 0 else None,
        build_latency_p90_ms=latency.p90_ms if latency is not None and latency.median_ms > 0 else None,
        build_machine=latency.machine if latency is not None else "",
        farm_latency_ms={p: statistics.median(v) for p, v in farm.items()},
        runtime=manifest.recipe.runtime,
        peak_memory_mb=dict(manifest.resources.peak_memory_mb) if manifest.resources else {},
        files_bytes=sum(f.size for f in manifest.files),
    )  # fmt: skip


def _bands(golden: GoldenSet | GoldenPrompts | None, manifest: Manifest) -> dict[str, OutputBands]:
    if isinstance(golden, GoldenPrompts):
        return generative_bands(golden)
    return golden_bands(golden, manifest.golden) if golden is not None else {}


def read_golden(bundle: Path, manifest: Manifest) -> GoldenSet | GoldenPrompts | None:
    """The bundle file's golden set, or a generative bundle's golden prompts (None when the bundle carries none),
    checked against the manifest's hash."""
    entry = next((f for f in manifest.files if f.path == manifest.golden.path), None)
    if entry is None:
        return None
    try:
        with tarfile.open(bundle, "r:") as tar:
            member = tar.getmember(entry.path)
            if not member.isfile() or member.size != entry.size or member.size > MAX_GOLDEN_BYTES:
                raise BundleError(f"{bundle.name}: {entry.path} is not the file the manifest pins")
            handle = tar.extractfile(member)
            data = handle.read() if handle is not None else b""
    except (KeyError, tarfile.TarError, OSError) as err:
        raise BundleError(f"{bundle.name}: cannot read its golden set: {err}") from err
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise BundleError(f"{bundle.name}: {entry.path} does not match the manifest's sha256")
    suffix = ".json" if manifest.generation is not None else ".npz"
    with tempfile.NamedTemporaryFile(suffix=suffix) as tmp:
        tmp.write(data)
        tmp.flush()
        if manifest.generation is not None:
            return GoldenPrompts.load(Path(tmp.name))
        return GoldenSet.load(Path(tmp.name), manifest.inputs, manifest.outputs)


def facts_from_bundle(bundle: Path, manifest: Manifest, transfer: Transfer) -> BundleFacts:
    """`facts_of` for a bundle file about to be (or just) published with `transfer`."""
    return facts_of(manifest, transfer, read_golden(bundle, manifest))


def record_facts(store: Store, bundle: Path, manifest: Manifest, transfer: Transfer) -> BundleFacts:
    """Record a published bundle's facts in the store's publish history (what its rollouts weigh reports against)."""
    facts = facts_from_bundle(bundle, manifest, transfer)
    store.put_bundle_facts(manifest.bundle_id, facts.model_dump_json(), time.time())
    return facts


__all__ = ["BundleFacts", "facts_from_bundle", "facts_of", "io_signature", "read_golden", "record_facts"]
