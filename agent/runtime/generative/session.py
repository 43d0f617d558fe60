"""What a generation runtime offers the agent: one request in, text pieces out as they are decoded, a result with
its token figures; teacher-forced logits for the golden check; the tokenizer.

A `GenerativeSession` is also a `Session` of the backend interface (agent/runtime/backends): its tensor view is a
causal language model's, `run({"input_ids": [1, S]})` → `{"logits": [1, S, vocab]}` from an empty cache.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from edgefleet.agent.runtime.backends import Session

FinishReason = Literal["stop", "length", "cancelled"]
OnText = Callable[[str], None]  # receives each decoded text piece, in order; must not raise
StepGate = Callable[[], AbstractContextManager[object]]  # entered around each step of compute (agent/schedule/gate.py)


@dataclass(frozen=True)
class Sampling:
    """Sampling instead of greedy decoding. A seed makes the draw repeatable on the same runtime."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stop_ids: frozenset[int] = frozenset()  # a token that ends the generation (not part of its text)
    sampling: Sampling | None = None  # None: greedy
    ignore_stop: bool = False  # run the whole budget whatever comes (timing)
    # The scheduler's compute gate, entered around the prefill and each generated token, so that the generation
    # yields between tokens while real-time work waits (None: it runs freely).
    step: StepGate | None = field(default=None, compare=False)


@dataclass(frozen=True)
class GenerationResult:
    tokens: tuple[int, ...]  # every generated token, the one that stopped it included
    text: str  # the text handed to `on_text`, joined
    finish_reason: FinishReason
    prompt_tokens: int
    ttft_ms: float  # from the call to the first generated token (the prompt's prefill included)
    decode_ms: float  # from the first token to the last
    cancelled_by: str = ""  # why a cancelled generation was cut

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first (None with fewer than two tokens)."""
        return self.decode_ms / (len(self.tokens) - 1) if len(self.tokens) > 1 else None


class Stopper:
    """Ends a running generation early, from any thread: checked between tokens."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: FinishReason = "cancelled"
        self.why = ""

    def stop(self, reason: FinishReason = "cancelled", why: str = "") -> None:
        if not self._event.is_set():
            self.reason, self.why = reason, why
            self._event.set()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()


@dataclass
class TokenClock:
    """Times a generation: TTFT from the start to the first token, decode time from there to the last."""

    start: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float = 0.0

    def token(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now

    @property
    def ttft_ms(self) -> float:
        return ((self.first if self.first is not None else time.perf_counter()) - self.start) * 1000

    @property
    def decode_ms(self) -> float:
        return (self.last - self.first) * 1000 if self.first is not None else 0.0


class GenerativeSession(Session):
    """A generative model loaded for one provider. `generate` may be called from several threads at once (a runtime
    that cannot run two generations at once serializes them itself)."""

    def __init__(self) -> None:
        self.output_names = ["logits"]

    @abstractmethod
    def generate(self, request: GenerationRequest, on_text: OnText, stopper: Stopper | None = None) -> GenerationResult:
        """Generate up to `request.max_new_tokens`, handing each decoded piece of text to `on_text` as it comes."""

    @abstractmethod
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits [len(ids), vocab] from an empty cache (at most the context length)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> str | None:
        """The prompt the model's own chat template makes of `messages`; None when the bundle has no template."""
        return None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = np.asarray(feeds["input_ids"]).reshape(-1)
        return {"logits": self.logits([int(i) for i in ids])[None]}


__all__ = [
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "GenerativeSession",
    "OnText",
    "Sampling",
    "StepGate",
    "Stopper",
    "TokenClock",
]
