"""Generation over MQTT request/response: a client asks a device's generative model for text and receives the answer
as chunks, in order, on its own response topic.

A `GenerateRequest` on `devices/{id}/generate/request` names the client; the device publishes `GenerateChunk`s on
`devices/{id}/generate/response/{client_id}` (QoS 1): with `stream`, each chunk holds the text generated since the
previous one (joined for at most the device's chunk interval), numbered from 0 by `index` so a client sees a gap; the
last chunk has `done` with the finish reason and the token counts; without `stream` only that last chunk, holding
all the text. A refusal or a failure is a last chunk with `error`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgefleet.core.messages import Message


class ChatMessage(Message):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str = Field(max_length=262_144)


class GenerateRequest(Message):
    request_id: str = Field(min_length=1, max_length=128)
    client_id: str = Field(description="the answer goes to devices/{id}/generate/response/{client_id}")
    prompt: str | None = Field(default=None, max_length=262_144, description="text to continue (or `messages`)")
    messages: list[ChatMessage] | None = Field(default=None, max_length=256, description="a chat to answer")
    model: str | None = Field(default=None, description="the served model's name (None: the one served)")
    max_tokens: int | None = Field(default=None, ge=1, description="None: the bundle's default budget")
    temperature: float = Field(default=0.0, ge=0, le=2, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=0)
    stop: list[str] = Field(default_factory=list, max_length=4)
    stream: bool = True


class GenerateUsage(Message):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)


class GenerateChunk(Message):
    request_id: str
    index: int = Field(ge=0, description="0, 1, 2, ... within the request: a gap means a lost chunk")
    text: str = ""
    done: bool = False
    finish_reason: Literal["stop", "length", "cancelled"] | None = None
    usage: GenerateUsage | None = None
    error: str | None = Field(default=None, description="why the request was refused or failed (on the last chunk)")
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    bundle_id: str | None = None
    provider: str | None = None


__all__ = ["ChatMessage", "GenerateChunk", "GenerateRequest", "GenerateUsage"]
