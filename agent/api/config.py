"""The local inference API's configuration: where it listens, how much it takes, how long it waits."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edgefleet.agent.schedule.batcher import BatchingConfig


class ServiceConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(
        default="127.0.0.1", description="the listen address: loopback, or any address when `api_token` is set"
    )
    port: int = Field(default=8470, ge=0, le=65535, description="TCP port; 0 picks a free one")
    unix_socket: Path | None = Field(default=None, description="serve on this Unix socket instead of TCP")
    socket_mode: int = Field(default=0o660, description="permissions of the Unix socket")
    max_body_bytes: int = Field(default=8 * 2**20, ge=1024, description="larger requests get 413")
    max_decoded_bytes: int = Field(default=64 * 2**20, ge=1024, description="most bytes one input decodes to")
    concurrency: int = Field(default=2, ge=1, description="requests running inference at once")
    queue_size: int = Field(default=64, ge=0, description="requests waiting for a slot; beyond that 503")
    queue_timeout_s: float = Field(default=30.0, gt=0, description="longest wait for a slot before 503")
    keep_alive_s: float = Field(default=30.0, gt=0, description="idle keep-alive connections close after this")
    max_connections: int = Field(default=512, ge=4, description="open connections; the oldest idle one makes room")
    header_timeout_s: float = Field(default=10.0, gt=0, description="a request head must arrive within this")
    body_timeout_s: float = Field(default=30.0, gt=0, description="an admitted body must arrive within this")
    send_timeout_s: float = Field(default=10.0, gt=0, description="an answer must be taken within this")
    allowed_hosts: tuple[str, ...] = Field(
        default=(), description="Host names (name or name:port) the API answers besides the listen address and "
        "localhost, 127.0.0.1 and [::1] (DNS rebinding: any other Host is refused, agent/api/callers.py)",
    )  # fmt: skip
    api_token: str | None = Field(
        default=None, repr=False, min_length=16, description="when set, every request must carry "
        "Authorization: Bearer TOKEN (401 otherwise); required to listen beyond loopback",
    )  # fmt: skip
    batching: BatchingConfig | None = Field(
        default=None,
        description="dynamic batching of models with a batch dimension (agent/schedule/batcher.py); None: off",
    )
    workers: int = Field(
        default=0,
        ge=0,
        description="worker threads for requests other than generations; 0: concurrency + 2 (each "
        "generation the gate admits adds one: a stream holds its worker)",
    )


__all__ = ["ServiceConfig"]
