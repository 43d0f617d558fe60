"""Typed, versioned MQTT payloads. Every JSON message carries `schema_version`; only blocks are binary."""

from __future__ import annotations

import base64
import time
from typing import Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgefleet.core.errors import EdgefleetError

SCHEMA_VERSION = 1


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


DeviceState = Literal["starting", "idle", "downloading", "installing", "serving", "offline"]


class Hardware(Message):
    arch: str
    os: str
    cpu_count: int
    memory_mb: int
    hostname: str


class DeviceStatus(Message):
    """Retained on `devices/{id}/status`; the last will sets online=false."""

    device_id: str
    online: bool
    state: DeviceState
    ts: float = Field(default_factory=now)
    agent_version: str = ""
    profile: str | None = None
    groups: list[str] = Field(default_factory=list)
    hardware: Hardware | None = None
    providers: list[str] = Field(default_factory=list, description="execution providers available here")
    active_bundle: str | None = None
    active_model: str | None = Field(default=None, description="name@version of the committed model")
    provider_in_use: str | None = None
    provider_summary: str | None = Field(default=None, description="why the provider in use was chosen")
    providers_not_chosen: dict[str, str] = Field(default_factory=dict, description="provider -> why not")
    verified: bool = Field(default=False, description="the active bundle passed signature and golden checks")
    last_error: str | None = None


class LatencySummary(Message):
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


class Telemetry(Message):
    device_id: str
    seq: int = Field(default=0, ge=0, description="per-device sequence shared with events; gaps mean loss")
    ts: float = Field(default_factory=now)
    bundle_id: str | None
    provider: str | None
    window_s: float
    requests: int
    errors: int
    throughput_rps: float
    latency: LatencySummary
    golden_agreement: float | None = Field(description="share of golden inputs agreeing with the FP32 reference")
    golden_max_abs_error: float | None
    cpu_percent: float
    rss_mb: float
    temperature_c: float | None = None
    queue_depth: int = Field(default=0, description="inference requests waiting (MQTT and local API)")
    errors_by_kind: dict[str, int] = Field(default_factory=dict, description="refused/failed requests by kind")
    field_accuracy: float | None = Field(
        default=None, description="share of correct answers among those an application gave the true label for"
    )
    field_samples: int = Field(default=0, description="feedbacks behind field_accuracy")
    spool_depth: int = Field(default=0, description="reports waiting on the device for the broker")
    spool_dropped: int = Field(default=0, description="reports dropped (oldest first) since the device started")


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
]


class Event(Message):
    device_id: str
    kind: EventKind
    seq: int = Field(default=0, ge=0)
    ts: float = Field(default_factory=now)
    bundle_id: str | None = None
    detail: str = ""
    progress: float | None = Field(default=None, ge=0, le=1)


class Desired(Message):
    """Retained on `devices/{id}/desired` or `groups/{g}/desired`: the bundle to run."""

    bundle_id: str
    model_name: str
    model_version: str
    profile: str
    rollback: bool = Field(default=False, description="allow a version older than the one running")
    issued_at: float = Field(default_factory=now)


class Transfer(Message):
    """How the bundle file is split into retained blocks, with the hashes to check each one."""

    size: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    block_size: int = Field(ge=1024)
    block_sha256: list[str] = Field(min_length=1)

    @property
    def block_count(self) -> int:
        return len(self.block_sha256)


class BundleOffer(Message):
    """Retained on `bundles/{id}/manifest`: the signed manifest (verifiable before any download)."""

    bundle_id: str
    manifest_json: str
    key_id: str
    signature: str
    transfer: Transfer


class WireTensor(Message):
    dtype: str
    shape: list[int]
    data: str = Field(description="base64 of the C-ordered bytes")

    @classmethod
    def of(cls, array: np.ndarray) -> WireTensor:
        array = np.ascontiguousarray(array)
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
    inputs: dict[str, WireTensor]


class InferResponse(Message):
    request_id: str
    ok: bool
    outputs: dict[str, WireTensor] = Field(default_factory=dict)
    error: str | None = None
    latency_ms: float | None = None
    provider: str | None = None
    bundle_id: str | None = None
