"""Generation over one telemetry window (`GenerationStats`): generations finished, refused and cut, prompt and output
tokens, time to first token and time per output token (p50/p95/p99 of the window's generations, up to the latest
`keep`), and output tokens per second of decode time. Probe generations (the agent's own, on its golden prompts)
count in the token latencies and in `probe_streams`, not in `streams`."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from edgefleet.core.messages import GenerationStats, LatencySummary


def summary(values: deque[float]) -> LatencySummary | None:
    if not values:
        return None
    p50, p95, p99 = np.percentile(np.fromiter(values, dtype=np.float64), [50, 95, 99])
    return LatencySummary(
        count=len(values), p50_ms=round(float(p50), 4), p95_ms=round(float(p95), 4), p99_ms=round(float(p99), 4)
    )


class GenerationWindow:
    def __init__(self, keep: int = 4096) -> None:
        self._lock = threading.Lock()
        self._keep = keep
        self._reset()
        self.seen = False  # any generation, refusal or probe since the agent started

    def _reset(self) -> None:
        self._ttft: deque[float] = deque(maxlen=self._keep)
        self._tpot: deque[float] = deque(maxlen=self._keep)
        self._streams = self._refused = self._cut = self._probes = 0
        self._prompt_tokens = self._output_tokens = 0
        self._decode_ms = 0.0
        self._decode_tokens = 0

    def finished(
        self,
        prompt_tokens: int,
        output_tokens: int,
        ttft_ms: float,
        decode_ms: float,
        *,
        cut: bool = False,
        probe: bool = False,
    ) -> None:
        """A generation ended (`cut`: a client gone or a drain ran out before it finished)."""
        with self._lock:
            self.seen = True
            if probe:
                self._probes += 1
            else:
                self._streams += 1
                self._prompt_tokens += prompt_tokens
                self._output_tokens += output_tokens
            if cut:
                self._cut += 1
            if output_tokens:
                self._ttft.append(ttft_ms)
            if output_tokens > 1:
                self._tpot.append(decode_ms / (output_tokens - 1))
                self._decode_ms += decode_ms
                self._decode_tokens += output_tokens - 1

    def refused(self) -> None:
        with self._lock:
            self.seen = True
            self._refused += 1

    def snapshot(self) -> GenerationStats:
        """The window's figures; the window starts again."""
        with self._lock:
            stats = GenerationStats(
                streams=self._streams, refused=self._refused, cut=self._cut, prompt_tokens=self._prompt_tokens,
                output_tokens=self._output_tokens, ttft=summary(self._ttft), tpot=summary(self._tpot),
                tokens_per_s=round(self._decode_tokens / (self._decode_ms / 1000), 3) if self._decode_ms > 0 else None,
                probe_streams=self._probes,
            )  # fmt: skip
            self._reset()
        return stats


__all__ = ["GenerationWindow"]
