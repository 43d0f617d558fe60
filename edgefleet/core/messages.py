"""Typed, versioned MQTT payloads. Every JSON message carries `schema_version`; only blocks are binary."""

from __future__ import annotations

import base64
import math
import time
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from edgefleet.core.errors import EdgefleetError
from edgefleet.core.topics import DEFAULT_SLOT, check_slot

SCHEMA_VERSION = 1

# How a golden check judges one output, by its kind (edgefleet/core/quality/output_rules.py): the manifest records it
# per output and telemetry reports the score under it.
OutputRule = Literal["class-agreement", "position-agreement", "continuous"]


class MessageError(EdgefleetError):
    """A payload that is not valid JSON of the expected message type."""


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = SCHEMA_VERSION

    def encode(self) -> bytes:
        return self.model_dump_json().encode("utf-8")


M = TypeVar("M", bound=Message)


def decode(kind: type[M], payload: bytes) -> M:
    """Parse a payload; a MessageError names the message type and the first problem."""
    try:
        message = kind.model_validate_json(payload)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "payload"
        raise MessageError(f"malformed {kind.__name__}: {first['msg']} at {where}") from err
    if message.schema_version != SCHEMA_VERSION:
        raise MessageError(f"{kind.__name__} schema_version {message.schema_version} is not {SCHEMA_VERSION}")
    return message


def now() -> float:
    return round(time.time(), 3)


# --- Bounds on the numbers a device reports (issue 32, item 5). A device is untrusted input: a number is refused
# at the typed boundary unless it is finite and inside a range that makes sense for it, so no report that parses
# can put Infinity into a JSON answer, overflow a sum in the store, or date itself into the far future. What needs
# the time received or the device's own cores (timestamps within a skew, CPU under 100 × cores) is checked by the
# control plane's admission (edgefleet/control/fleet/admission.py). Each report model refuses NaN and ±Infinity.
MAX_COUNT = 2**53 - 1  # a counter that only grows (sequence numbers, bytes): exact as a double and a JSON number
# A count over one report's window (requests, errors, tokens): the store sums a bucket's reports into 64-bit
# integers, and 2^32 per report times the most reports one device can date into one bucket stays below 2^63.
MAX_WINDOW_COUNT = 2**32
MAX_MS = 3_600_000.0  # a latency or round trip: under an hour
MAX_WINDOW_S = 7 * 86400.0  # a telemetry window: at most a week
MAX_CORES = 4096
MAX_CPU_PERCENT = 100.0 * MAX_CORES  # psutil's process CPU: up to 100 per core (admission checks the device's)
MAX_MB = float(2**30)  # memory in MB (a petabyte)
MAX_RATE = 1e9  # requests or tokens a second
MAX_TS = 2**32  # a timestamp (seconds since the epoch) is below the year 2106 (admission: near the time received)

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
WindowCount = Annotated[int, Field(ge=0, le=MAX_WINDOW_COUNT)]
Millis = Annotated[float, Field(ge=0, lt=MAX_MS, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Similarity = Annotated[float, Field(ge=-1, le=1, allow_inf_nan=False)]  # an agreement share or a cosine
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-1e300, le=1e300)]
Timestamp = Annotated[float, Field(ge=0, lt=MAX_TS, allow_inf_nan=False)]


def _no_figure(value: object) -> object:
    """A figure the device could not compute (a golden check that failed reports an infinite error) is absent:
    the wire has always carried it as null (pydantic writes a non-finite float so)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


# The report models (what a device sends) refuse NaN and Infinity in every float field, whatever its type says.
_REPORT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# A slot's name (edgefleet/core/topics.py, check_slot): checked wherever a message carries one.
SlotName = Annotated[str, AfterValidator(check_slot)]
# How the device's scheduler treats a slot's work: a real-time slot keeps its latency objective, an interactive one
# (a language model a person talks to) yields between tokens while real-time work waits, batch work runs in what is
# left.
SlotClass = Literal["real-time", "interactive", "batch"]

DeviceState = Literal["starting", "idle", "downloading", "installing", "serving", "offline"]


class Hardware(Message):
    model_config = _REPORT
    arch: str
    os: str
    cpu_count: int = Field(ge=1, le=MAX_CORES)
    memory_mb: int = Field(ge=0, le=MAX_MB)
    hostname: str


class NativeCodeLoad(Message):
    """A native library the agent handed a runtime to load (a custom-op library from the device's own opt-in)."""

    path: str = Field(description="the library's resolved path on the device")
    sha256: str = Field(description="its sha256 when it was last loaded")
    origin: str = Field(description="where the device's opt-in named it (e.g. --custom-op-libs, a custom-op package)")
    bundle_id: str = Field(description="the bundle whose load was last given it")
    loads: int = Field(ge=1, description="how many loads were given it since the agent started")
    first_ts: float
    last_ts: float


class Placement(Message):
    """Where a slot runs and why: the provider measured with the other slots loaded, and its share of the cores."""

    model_config = _REPORT
    provider: str
    threads: int = Field(ge=0, le=MAX_CORES, description="intra-op threads the slot was given (0: the runtime's)")
    summary: str = Field(default="", description="why this provider and these threads (the measurements)")
    not_chosen: dict[str, str] = Field(default_factory=dict, description="provider -> why not")


class SlotStatus(Message):
    """One slot of a device: the model it serves, and what the device knows about it."""

    model_config = _REPORT
    slot: SlotName
    state: DeviceState
    active_bundle: str | None = None
    active_model: str | None = Field(default=None, description="name@version of the committed model")
    provider_in_use: str | None = None
    provider_summary: str | None = Field(default=None, description="why the provider in use was chosen")
    providers_not_chosen: dict[str, str] = Field(default_factory=dict, description="provider -> why not")
    verified: bool = Field(default=False, description="the active bundle passed signature and golden checks")
    last_error: str | None = None
    slot_class: SlotClass = "interactive"
    latency_objective_ms: Millis | None = Field(default=None, description="a real-time slot's p95 objective")
    memory_mb: Annotated[float, Field(ge=0, le=MAX_MB, allow_inf_nan=False)] | None = Field(
        default=None, description="the memory the slot's model holds, measured on the device"
    )
    placement: Placement | None = None
    refused: str | None = Field(
        default=None, description="why the slot's desired bundle is not run (over the budget, …); None: not refused"
    )


class DeviceStatus(Message):
    """Retained on `devices/{id}/status`; the last will sets online=false."""

    model_config = _REPORT
    device_id: str
    online: bool
    state: DeviceState
    ts: Timestamp = Field(default_factory=now)
    agent_version: str = ""
    profile: str | None = None
    accepts_profiles: list[str] = Field(
        default_factory=list, description="profiles whose bundles this device runs, most specific first"
    )
    profile_detection: list[str] = Field(
        default_factory=list,
        description="why the agent detected its profile: what matched, what did not and why, what INT8 lacks here",
    )
    groups: list[str] = Field(default_factory=list)
    hardware: Hardware | None = None
    providers: list[str] = Field(default_factory=list, description="execution providers available here")
    slots: list[SlotStatus] = Field(
        default_factory=list, description="every slot the device runs or was told to run, by name (unique)"
    )
    last_error: str | None = Field(default=None, description="the device's own last error (a slot's is on the slot)")
    memory_free_mb: Annotated[float, Field(ge=0, le=MAX_MB, allow_inf_nan=False)] | None = Field(
        default=None, description="memory the device measured free for models, after the slots it runs"
    )
    desired_stale: str | None = Field(
        default=None, description="why the signed desired state is stale (expired, none newer arrived); None: fresh"
    )
    native_code: list[NativeCodeLoad] = Field(
        default_factory=list, description="every native library loaded into the agent since it started"
    )
    agent_update: str | None = Field(
        default=None,
        description="the agent's own update, in words: the last release its launcher committed or rolled back "
        "(and why), or the one it is fetching or refused; None: never updated",
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> Any:
        """`native_code` and `profile_detection` are left out when empty, so control planes that predate them still
        parse the status of every device that loads no native code and was given its profile (--profile NAME)."""
        data = handler(self)
        for optional in ("native_code", "profile_detection", "agent_update"):
            if not data.get(optional):
                data.pop(optional, None)
        return data


class LatencySummary(Message):
    model_config = _REPORT
    count: WindowCount
    p50_ms: Millis | None
    p95_ms: Millis | None
    p99_ms: Millis | None


DriftBand = Literal["none", "moderate", "drift"]


class OutputScore(Message):
    """How one output compares with its reference, by the rule the manifest records for that output's kind."""

    model_config = _REPORT
    output: str
    rule: OutputRule
    score: Similarity = Field(description="the rule's headline figure, higher is better (agreement share or cosine)")
    passed: bool = Field(description="inside the manifest's tolerances")
    detail: dict[str, Finite] = Field(default_factory=dict, description="other figures: sqnr_db, max_abs, top_k …")


class GoldenTask(Message):
    """The bundle's task rule as the device's golden check applied it (edgefleet/core/quality/task_rule.py)."""

    model_config = _REPORT
    metric: str = Field(description="the task metric the converter chose the recipe by, e.g. argmax-agreement")
    computable: bool = Field(description="False: the device cannot compute it; the per-output checks judged alone")
    score: Finite | None = Field(default=None, description="the device's score on the golden set")
    floor: Finite | None = Field(default=None, description="the least score that passes")
    passed: bool = True


class DriftScore(Message):
    """Drift of one input (or input channel) or output over the device's sliding window, against the bundle's
    reference statistics."""

    model_config = _REPORT
    name: str = Field(description="input or output name; a channel is name[c]")
    kind: Literal["input", "output"]
    psi: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
    ks: Fraction | None = None
    band: DriftBand
    samples: Count = Field(description="live samples in the window behind this score")


class ShadowReport(Message):
    """A shadow bundle run on a sampled share of live requests, compared with the served one."""

    model_config = _REPORT
    bundle_id: str
    requests: Count
    agreement: Similarity | None = Field(description="worst per-output score; None until a request was mirrored")
    per_output: list[OutputScore] = Field(default_factory=list)
    latency: LatencySummary | None = None
    dropped: Count = Field(default=0, description="requests not mirrored because of the CPU budget")
    failures: Count = Field(default=0, description="mirrored requests the shadow failed to run")


class LinkReport(Message):
    """The device's link as the agent counts it (agent/transfer/link.py): its cap and the bytes that crossed it."""

    model_config = _REPORT
    cap_bytes_per_s: Count | None = Field(default=None, description="the byte-rate cap in force (None: no cap)")
    bulk_bytes: Count = Field(default=0, description="bundle bytes received since the agent started")
    report_bytes: Count = Field(default=0, description="report bytes published since the agent started")
    clock_s: Annotated[float, Field(ge=0, le=MAX_COUNT, allow_inf_nan=False)] = Field(
        default=0.0, description="the agent's monotonic clock when counted (rates = deltas)"
    )
    window: WindowCount | None = Field(default=None, description="requests in flight of the current download")
    srtt_ms: Millis | None = Field(default=None, description="smoothed round trip of a block request")


class GenerationStats(Message):
    """Generation over the telemetry window (a generative bundle's device): token latency and volume, and what was
    cut or refused. Names follow OpenTelemetry's gen_ai.server.* where it has them."""

    model_config = _REPORT
    streams: WindowCount = Field(default=0, description="generations finished in the window (streamed or not)")
    refused: WindowCount = Field(default=0, description="generations refused: busy, over the token budget, bad input")
    cut: WindowCount = Field(default=0, description="generations ended early: client gone, a swap's drain ran out")
    prompt_tokens: WindowCount = 0
    output_tokens: WindowCount = 0
    ttft: LatencySummary | None = Field(
        default=None, description="time to first token (gen_ai.server.time_to_first_token)"
    )
    tpot: LatencySummary | None = Field(
        default=None, description="time per output token after the first (gen_ai.server.time_per_output_token)"
    )
    tokens_per_s: Annotated[float, Field(ge=0, le=MAX_RATE, allow_inf_nan=False)] | None = Field(
        default=None, description="output tokens / decode time, over the window"
    )
    probe_streams: WindowCount = Field(default=0, description="generations the agent ran on its golden prompts")


class SlotTiming(Message):
    """The scheduler's account of one slot over a window: time waiting for its turn, and time computing (as Triton
    separates queue and compute time)."""

    model_config = _REPORT
    queue_ms: LatencySummary | None = None
    compute_ms: LatencySummary | None = None
    batches: WindowCount = Field(default=0, description="runs the slot made (a batched run counts once)")
    batched_requests: WindowCount = Field(default=0, description="requests those runs answered")
    yields: WindowCount = Field(default=0, description="times this slot's work yielded to a real-time slot")


class Telemetry(Message):
    """One telemetry window. Every number is bounded (see MAX_* above): counters are integers in [0, MAX_COUNT],
    a window's counts in [0, MAX_WINDOW_COUNT], latencies in [0, MAX_MS), shares in [0, 1]; nothing is NaN or
    infinite."""

    model_config = _REPORT
    device_id: str
    seq: Count = Field(default=0, description="per-device sequence shared with events; gaps mean loss")
    ts: Timestamp = Field(default_factory=now)
    slot: SlotName = Field(default=DEFAULT_SLOT, description="the slot these figures are of (one report per slot)")
    bundle_id: str | None
    provider: str | None
    window_s: Annotated[float, Field(ge=0, le=MAX_WINDOW_S, allow_inf_nan=False)]
    requests: WindowCount
    errors: WindowCount
    throughput_rps: Annotated[float, Field(ge=0, le=MAX_RATE, allow_inf_nan=False)]
    latency: LatencySummary
    golden_agreement: Fraction | None = Field(description="share of golden inputs agreeing with the FP32 reference")
    golden_max_abs_error: Annotated[
        Annotated[float, Field(ge=0, le=1e300, allow_inf_nan=False)] | None, BeforeValidator(_no_figure)
    ]
    cpu_percent: Annotated[float, Field(ge=0, le=MAX_CPU_PERCENT, allow_inf_nan=False)]
    rss_mb: Annotated[float, Field(ge=0, le=MAX_MB, allow_inf_nan=False)]
    temperature_c: Annotated[float, Field(ge=-273.15, le=1000, allow_inf_nan=False)] | None = None
    idle_cpu_percent: Annotated[float, Field(ge=0, le=MAX_CPU_PERCENT, allow_inf_nan=False)] | None = Field(
        default=None,
        description="the agent's CPU over a window without client requests (probes, reports, runtime threads), "
        "% of one core; None when it served requests",
    )
    queue_depth: WindowCount = Field(default=0, description="inference requests waiting (MQTT and local API)")
    errors_by_kind: dict[str, WindowCount] = Field(default_factory=dict, description="refused/failed requests by kind")
    field_accuracy: Fraction | None = Field(
        default=None, description="share of correct answers among those an application gave the true label for"
    )
    field_samples: WindowCount = Field(default=0, description="feedbacks behind field_accuracy")
    spool_depth: Count = Field(default=0, description="reports waiting on the device for the broker")
    spool_dropped: Count = Field(default=0, description="reports dropped (oldest first) since the device started")
    golden_scores: list[OutputScore] = Field(default_factory=list, description="per-output golden-set scores")
    golden_task: GoldenTask | None = Field(default=None, description="the task rule's score on the golden set")
    drift: list[DriftScore] = Field(default_factory=list, description="per input/output drift over the window")
    shadow: ShadowReport | None = None
    probe_requests: WindowCount = Field(default=0, description="requests the agent generated from its golden set")
    link: LinkReport | None = Field(default=None, description="the link's cap and byte counters")
    generation: GenerationStats | None = Field(default=None, description="generative bundles: token figures")
    scheduling: SlotTiming | None = Field(
        default=None, description="the scheduler's queue and compute time for the slot"
    )


EventKind = Literal[
    "desired",
    "download-started",
    "download-progress",
    "downloaded",
    "verified",
    "installed",
    "committed",
    "rolled-back",
    "refused",
    "health-failed",
    "error",
    "desired-stale",
    "reports-dropped",
    "removed",  # a slot drained, unloaded and forgotten by a signed decision (Desired.remove)
    "agent-release",  # the agent's own update (docs/agent.md, agent updates): staged, handed over, refused
    "agent-committed",  # a new agent release passed its health gate; the launcher committed it
    "agent-rolled-back",  # a new agent release failed its health gate; the previous agent runs again
]


class Event(Message):
    model_config = _REPORT
    device_id: str
    kind: EventKind
    seq: Count = 0
    ts: Timestamp = Field(default_factory=now)
    slot: SlotName | None = Field(default=None, description="the slot the event is about; None: the device's own")
    bundle_id: str | None = None
    detail: str = ""
    progress: Fraction | None = None
    dropped_through: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="on a `reports-dropped` event: the device's full spool dropped reports, the newest of them "
        "numbered this; every report with seq <= dropped_through that the control plane has not stored is lost "
        "for good and will never be sent (again), so the host may count its contiguous run past it",
    )

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> Any:
        """`dropped_through` is left out unless set, so control planes that predate it still parse every other
        event unchanged (they refuse only the `reports-dropped` events, which they could not act on)."""
        data = handler(self)
        if data.get("dropped_through") is None:
            data.pop("dropped_through", None)
        return data


class StoredUpTo(Message):
    """Retained on `devices/{id}/stored` by the control plane: every report (telemetry or event) of this device
    with `seq <= up_to` is in the store. The broker's PUBACK only says the broker took a report; this says the
    store has it, so only this lets a device drop a report from its spool.

    The device's sequence (telemetry and events share it) is gap-free and survives restarts: a number is taken in
    the same write that spools its report. The one gap a device can make is a full spool dropping its oldest
    reports; it then sends a `reports-dropped` event whose `dropped_through` says which numbers will never come,
    so the highest contiguous sequence can move past them. A device re-sends, in order, every report the broker
    acknowledged that is not covered after a while, and never one that is."""

    device_id: str
    up_to: Count = Field(description="the highest sequence number up to which every report is stored")
    ts: float = Field(default_factory=now)


class Desired(Message):
    """The bundle one slot runs; travels inside a `SignedDesired` on `devices/{id}/desired/{slot}` or
    `groups/{g}/desired/{slot}`. Each slot's document has its own counter, expiry and version floor on the device."""

    slot: SlotName = Field(default=DEFAULT_SLOT, description="the slot: the only one it is valid for (its topic's)")
    slot_class: SlotClass = Field(default="interactive", description="how the device's scheduler treats the slot")
    latency_objective_ms: Millis | None = Field(
        default=None, description="a real-time slot's p95 objective on the device (the neighbour guardrail's bar)"
    )
    bundle_id: str
    model_name: str
    model_version: str
    profile: str
    rollback: bool = Field(default=False, description="informational: the host marked this a rollback")
    issued_at: float = Field(default_factory=now, description="when the operator decided (kept across re-signing)")
    shadow_bundle_id: str | None = Field(default=None, description="a bundle to run beside the served one, unserved")
    target: str = Field(default="", description="'device:<id>' or 'group:<name>': the only topic it is valid on")
    counter: int = Field(default=0, ge=0, description="monotonic across every document the control plane signs")
    expires_at: float = Field(default=0.0, description="after this the device reports its desired state stale")
    allow_downgrade_to: str | None = Field(
        default=None, description="the exact bundle id this document allows below the device's version floor"
    )
    clear: bool = Field(
        default=False,
        description="a signed 'no desired state' for this target: the device forgets the target's document and "
        "keeps what it runs (bundle fields empty)",
    )
    max_bytes_per_s: int | None = Field(
        default=None, ge=1024, description="a byte-rate cap for the device's link (paid links); None: no cap"
    )
    remove: bool = Field(
        default=False,
        description="a signed decision to stop serving the slot: the device drains it, unloads it and forgets its "
        "files (bundle fields empty); unlike `clear`, which only withdraws this target's document",
    )
    agent_release: AgentRelease | None = Field(
        default=None, description="the agent release the device should run (any slot's document may name it)"
    )

    @model_serializer(mode="wrap")
    def _omit_no_release(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Left out unless set: a document without a release is the very text agents from before releases parse."""
        data = handler(self)
        if isinstance(data, dict) and data.get("agent_release") is None:
            data.pop("agent_release", None)
        return data


class AgentRelease(Message):
    """The agent release a device should run (core/release/): named in a signed desired document, fetched from its
    retained offer on `agent-releases/{release_id}/offer`. The version floor applies as to bundles: a release below
    the highest agent version the device committed needs `allow_downgrade_to` naming exactly this release."""

    release_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    version: str = Field(pattern=r"^[0-9]+(\.[0-9]+)*$", max_length=64)
    allow_downgrade_to: str | None = Field(
        default=None, description="the exact release id this document allows below the device's agent floor"
    )


class SignedPayload(Message):
    """A document (JSON text) and an ed25519 signature over its domain-separated bytes (see core/trust/keyset.py)."""

    kind: Literal["keyset", "desired"]
    payload: str
    key_id: str
    signature: str


class SignedDesired(Message):
    """Retained on a desired topic: a `Desired` signed by an operations key, with the key set that delegates it."""

    desired: SignedPayload
    keyset: SignedPayload | None = None


class ChunkRef(BaseModel):
    """One content-addressed chunk of a bundle file (core/transfer/chunks.py): retained on `chunks/{sha256}`, named by
    the sha256 of its uncompressed bytes; `zstd` is the length of the zstd frame on the wire, None when sent raw."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=1, description="uncompressed bytes")
    zstd: int | None = Field(default=None, ge=1, description="bytes on the wire when zstd-compressed")


class Transfer(Message):
    """How the bundle file travels: fixed-size retained blocks (`block_sha256`, the first layout) or, when `chunks`
    is set, content-addressed chunks listed in file order (`block_size` is then the largest chunk allowed)."""

    size: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    block_size: int = Field(ge=1024)
    block_sha256: list[str] = Field(default_factory=list)
    chunks: list[ChunkRef] = Field(default_factory=list, description="the chunk layout; empty for blocks")
    index: list[ChunkRef] = Field(default_factory=list, description="index pages of a big chunk list (chunk_index)")
    chunk_count: int = Field(default=0, ge=0, description="chunks the index pages list")

    @model_serializer(mode="wrap")
    def _omit_empty_index(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)  # an offer without pages is the very JSON agents from before pages parse (and sign)
        if isinstance(data, dict) and not self.index and not self.chunk_count:
            data.pop("index", None)
            data.pop("chunk_count", None)
        return data

    @property
    def block_count(self) -> int:
        return len(self.block_sha256)


class BundleOffer(Message):
    """Retained on `bundles/{id}/manifest`: the manifest and the transfer layout under ONE signature by a bundle
    key (over `core.transfer.offer_signing_bytes`), verifiable before any download."""

    bundle_id: str
    manifest_json: str
    key_id: str
    signature: str
    transfer: Transfer
    keyset: SignedPayload | None = Field(default=None, description="the root-signed key set delegating the signer")


class ReleaseOffer(Message):
    """Retained on `agent-releases/{id}/offer`: an agent release's manifest and its transfer layout under ONE
    signature by a release-role key (core/release/offer.py), verifiable before any download. It travels as a
    bundle does: content-addressed chunks (core/transfer/)."""

    release_id: str
    manifest_json: str
    key_id: str
    signature: str
    transfer: Transfer
    keyset: SignedPayload | None = Field(default=None, description="the root-signed key set delegating the signer")


def _unicode(array: np.ndarray) -> np.ndarray:
    """Text of any numpy kind as fixed-width unicode; bytes are UTF-8 (ONNX strings), never their repr."""
    items = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()]
    return np.array(items, dtype=str).reshape(array.shape)


class WireTensor(Message):
    dtype: str
    shape: list[int]
    data: str = Field(description="base64 of the C-ordered bytes")

    @classmethod
    def of(cls, array: np.ndarray) -> WireTensor:
        array = np.ascontiguousarray(_unicode(array) if array.dtype.kind in "OS" else array)  # strings: unicode
        return cls(dtype=str(array.dtype), shape=list(array.shape), data=base64.b64encode(array.tobytes()).decode())

    def to_array(self) -> np.ndarray:
        try:
            dtype = np.dtype(self.dtype)
            if dtype.hasobject:
                raise TypeError("object arrays are not accepted")
            return np.frombuffer(base64.b64decode(self.data, validate=True), dtype=dtype).reshape(self.shape)
        except (TypeError, ValueError) as err:
            raise MessageError(f"tensor ({self.dtype}, {self.shape}) cannot be decoded: {err}") from err


class InferRequest(Message):
    request_id: str
    client_id: str = Field(description="the response goes to devices/{id}/infer/response/{client_id}")
    slot: SlotName | None = Field(default=None, description="the slot to run (None: the device's only slot)")
    inputs: dict[str, WireTensor]


class InferFeedback(Message):
    """On `devices/{id}/infer/feedback`: the true labels of a request answered over MQTT (field accuracy)."""

    request_id: str = Field(description="the request_id of the InferRequest")
    client_id: str = Field(description="the client_id of the InferRequest")
    labels: list[int] = Field(min_length=1, description="true class per sample of the request, in order")


class InferResponse(Message):
    request_id: str
    ok: bool
    outputs: dict[str, WireTensor] = Field(default_factory=dict)
    error: str | None = None
    latency_ms: float | None = None
    provider: str | None = None
    bundle_id: str | None = None
