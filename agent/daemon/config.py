"""The agent's typed configuration (from the command line today; a file can feed the same model)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edgefleet.agent.api import GenerationConfig, ServiceConfig
from edgefleet.agent.quality import QualityConfig
from edgefleet.agent.runtime import Policy
from edgefleet.core.mqtt.connection import Protocol, TlsFiles
from edgefleet.core.topics import DEFAULT_PREFIX, check_segment


class AgentConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    broker: str = Field(description="mqtt://host:port or mqtts://host:port")
    device_id: str
    state_dir: Path
    profile: str = Field(default="auto", description="a profile name, or auto to detect it")
    groups: list[str] = Field(default_factory=list)
    trust: list[Path] = Field(
        default_factory=list, description="pinned ROOT public keys (files or directories of *.pub)"
    )
    keyset: Path | None = Field(
        default=None, description="a root-signed key set to start from (offers and desired documents carry newer)"
    )
    prefix: str = DEFAULT_PREFIX
    tls_ca: Path | None = Field(default=None, description="CA certificate of the broker (mqtts://)")
    tls_cert: Path | None = Field(default=None, description="this device's client certificate (CN = device id)")
    tls_key: Path | None = Field(default=None, description="the client certificate's private key")
    protocol: Protocol = "auto"
    telemetry_interval_s: float = Field(default=5.0, gt=0)
    threads: int = Field(default=0, ge=0, description="inference threads; 0: the bundle's count or measured")
    block_window: int = Field(default=16, ge=1, le=256, description="block requests in flight at first (RTT-sized)")
    max_bytes_per_s: int | None = Field(
        default=None, ge=1024, description="byte-rate cap of the device's link; signed desired state may lower it"
    )
    keep_previous: int = Field(default=2, ge=0)
    memory_budget_mb: float | None = Field(
        default=None, gt=0, description="the memory the device's models may use (None: the profile's budget)"
    )
    offer_timeout_s: float = Field(default=30.0, gt=0)
    retry_delay_s: float = Field(default=10.0, gt=0)
    min_free_bytes: int = Field(default=16 * 2**20, ge=0, description="disk kept free beyond a download")
    spool_max_records: int = Field(default=10_000, ge=10, description="telemetry/events kept until stored")
    report_resend_after_s: float = Field(
        default=30.0, gt=0, description="a report the broker took but the control plane has not stored is sent again "
        "after this long",
    )  # fmt: skip
    report_resend_per_s: float = Field(default=50.0, gt=0, description="reports sent again per second, at most")
    health_interval_s: float = Field(default=30.0, gt=0, description="how often the committed bundle is re-checked")
    rollback_on_failure: bool = Field(default=True, description="roll back when the committed bundle turns bad")
    max_failure_ratio: float = Field(default=0.5, gt=0, le=1, description="runtime failures tolerated per window")
    failure_window: int = Field(default=20, ge=1, description="requests per failure-ratio window")
    quality: QualityConfig = Field(default_factory=QualityConfig, description="drift, shadow and probe settings")
    benchmark_max_cpu_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="the most of this device's cores a benchmark request (the fleet as the benchmark farm) may "
        "use; 0 refuses benchmark requests",
    )

    @field_validator("device_id")
    @classmethod
    def _device_id(cls, value: str) -> str:
        return check_segment("device id", value)

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: list[str]) -> list[str]:
        return [check_segment("group", g) for g in value]

    launcher: Path | None = Field(
        default=None, description="the launcher's directory when edgefleet-launcher started this agent (its env)"
    )
    trial_token: str | None = Field(
        default=None, description="set while this agent is a release on trial: its health report carries it"
    )
    max_release_mb: float = Field(default=512.0, gt=0, description="the largest agent release this device fetches")

    selection: Policy = Field(default_factory=Policy, description="how the execution provider is chosen")
    http: ServiceConfig | None = Field(
        default_factory=ServiceConfig, description="the local inference API; None turns it off"
    )
    generation: GenerationConfig = Field(
        default_factory=GenerationConfig, description="generative models: concurrency, token cap, drain before a swap"
    )

    @property
    def tls(self) -> TlsFiles | None:
        if self.tls_ca is None:
            return None
        return TlsFiles(
            ca=str(self.tls_ca),
            cert=str(self.tls_cert) if self.tls_cert else None,
            key=str(self.tls_key) if self.tls_key else None,
        )

    @property
    def trusted_paths(self) -> list[Path]:
        return self.trust or [self.state_dir / "trusted"]
