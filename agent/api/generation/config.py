"""How the agent serves generations: how many at once, how many wait, a request's token cap, the body cap, and the
drain before a replaced model is closed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GenerationConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(default=2, ge=1, description="generations running at once (local API and MQTT together)")
    queue: int = Field(
        default=2, ge=0, description="generations waiting for a generation place; beyond it they are refused (503)"
    )
    queue_timeout_s: float = Field(default=10.0, gt=0, description="longest wait for a generation place before a 503")
    max_tokens: int = Field(
        default=1024, ge=1, description="the most tokens one request may generate (also capped by the context)"
    )
    max_body_bytes: int = Field(default=256 * 1024, ge=1024, description="a generation request's body, at most (413)")
    body_timeout_s: float = Field(
        default=10.0, gt=0, description="a generation request's whole body must arrive within this (else 408)"
    )
    drain_s: float = Field(
        default=30.0, ge=0, description="a swap lets the old model's generations finish this long before cutting them"
    )
    stream_interval_s: float = Field(
        default=0.002,
        ge=0,
        description="streamed text on the local API: the first piece at once, then pieces "
        "joined for at most this long (agent/api/generation/pacing.py)",
    )
    mqtt_chunk_interval_s: float = Field(
        default=0.05, ge=0, description="streamed text over MQTT: the first piece at once, then at most this often"
    )

    @property
    def capacity(self) -> int:
        """Generations admitted at most: running and waiting. Each holds a local-API worker while it lasts."""
        return self.concurrency + self.queue


__all__ = ["GenerationConfig"]
