"""A generative bundle loaded on the provider chosen by measurement: generation with stop strings, token budgets and
chat prompts, the golden check, probes, and the drain before the model is closed.

Every generation registers a `Stopper` while it runs. `drain(timeout_s)` (a swap retiring this model) refuses new
generations, waits for those in flight to finish, and cuts the ones still running when the time is up: they end with
finish reason "cancelled" and say why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from edgefleet.agent.runtime.generative.budget import token_budget
from edgefleet.agent.runtime.generative.chat import chat_prompt
from edgefleet.agent.runtime.generative.golden import continuation_request, judge
from edgefleet.agent.runtime.generative.selection import bundle_threads, select
from edgefleet.agent.runtime.generative.session import (
    GenerationRequest,
    GenerationResult,
    GenerativeSession,
    OnText,
    Stopper,
)
from edgefleet.agent.runtime.generative.stop_strings import StopStrings
from edgefleet.agent.runtime.selection.policy import Policy, ProviderChoice
from edgefleet.core.bundle.generation import GenerationSpec
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.errors import BundleError, EdgefleetError
from edgefleet.core.quality.generation import GoldenPrompts
from edgefleet.core.quality.golden import GoldenResult

log = logging.getLogger(__name__)

PROBE_TOKENS = 16  # a probe generates at most this many tokens from a golden prompt
CUT_WAIT_S = 10.0  # after cutting, how long to wait for the cut generations to return


class Retired(EdgefleetError):
    """The model is being replaced: it takes no new generation (the caller retries on the model now served)."""


class GenerativeModel:
    def __init__(self, bundle_dir: Path, manifest: Manifest, threads: int = 0, *, policy: Policy | None = None) -> None:
        if manifest.generation is None:
            raise BundleError(f"bundle {manifest.bundle_id} has no generation block")
        self.spec: GenerationSpec = manifest.generation
        self.manifest = manifest
        self.golden = GoldenPrompts.load(bundle_dir / self.spec.golden)
        self.stop_ids = frozenset(self.spec.eos_token_ids)
        self.threads = bundle_threads(manifest, threads)
        selected = select(bundle_dir / self.spec.model_dir, manifest, self.golden, threads=self.threads,
                          policy=policy or Policy())  # fmt: skip
        self.session: GenerativeSession = selected.session
        self.choice: ProviderChoice = selected.choice
        self.selection_golden: GoldenResult = selected.golden
        self.last_golden: GoldenResult | None = None
        self._lock = threading.Condition()
        self._active: dict[int, Stopper] = {}
        self._retiring = False
        self._probe_index = 0

    @property
    def provider(self) -> str:
        return self.choice.provider

    @property
    def context_length(self) -> int:
        return self.spec.context_length

    @property
    def active(self) -> int:
        """Generations running now."""
        return len(self._active)

    # --- prompts and budgets
    def encode(self, text: str) -> list[int]:
        return self.session.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.session.decode(ids)

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> tuple[str, str]:
        """(the prompt text of a chat, "model" or "plain": which template made it; agent/runtime/generative/chat.py)."""
        return chat_prompt(self.session, messages)

    def budget(self, prompt_tokens: int, requested: int | None, cap: int) -> int:
        """The tokens a request may generate (agent/runtime/generative/budget.py); BudgetError when none."""
        return token_budget(
            prompt_tokens, requested, default=self.spec.max_new_tokens, cap=cap, context_length=self.context_length
        )

    # --- generation
    def generate(
        self,
        request: GenerationRequest,
        on_text: OnText,
        *,
        stop_strings: Sequence[str] = (),
        stopper: Stopper | None = None,
    ) -> GenerationResult:
        """Generate; the bundle's end tokens always stop it. Text up to the first stop string reaches `on_text`."""
        stopper = stopper or Stopper()
        with self._lock:
            if self._retiring:
                raise Retired(f"bundle {self.manifest.bundle_id} is being replaced")
            self._active[id(stopper)] = stopper
        matcher = StopStrings(stop_strings)
        emitted: list[str] = []

        def piece(text: str) -> None:
            out = matcher.feed(text)
            if out:
                emitted.append(out)
                on_text(out)
            if matcher.stopped:
                stopper.stop("stop")

        if not request.stop_ids >= self.stop_ids:
            request = replace(request, stop_ids=request.stop_ids | self.stop_ids)
        try:
            result = self.session.generate(request, piece, stopper)
        finally:
            with self._lock:
                self._active.pop(id(stopper), None)
                self._lock.notify_all()
        tail = matcher.flush()
        if tail:
            emitted.append(tail)
            on_text(tail)
        return replace(result, text="".join(emitted))

    # --- quality
    def check_golden(self) -> GoldenResult:
        verdict = judge(self.session, self.golden, self.context_length, self.stop_ids)
        self.last_golden = verdict.result
        return verdict.result

    def probe(self) -> GenerationResult:
        """One short greedy generation from the next golden prompt (probe traffic on a quiet device)."""
        prompt = self.golden.prompts[self._probe_index % len(self.golden.prompts)]
        self._probe_index += 1
        request = continuation_request(prompt, self.context_length, self.stop_ids)
        return self.generate(replace(request, max_new_tokens=min(request.max_new_tokens, PROBE_TOKENS)), _ignore)

    # --- retiring
    def drain(self, timeout_s: float) -> int:
        """Take no new generation, let those in flight finish for up to `timeout_s`, then cut the rest; returns how
        many were cut."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._retiring = True
            while self._active and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
            cut = list(self._active.values())
        for stopper in cut:
            stopper.stop("cancelled", f"the model was replaced and the {timeout_s:g} s drain ran out")
        if cut:
            log.warning("cut %d generations on %s after a %g s drain", len(cut), self.manifest.bundle_id, timeout_s)
            with self._lock:
                end = time.monotonic() + CUT_WAIT_S
                while self._active and (left := end - time.monotonic()) > 0:
                    self._lock.wait(left)
        return len(cut)

    def close(self) -> None:
        self.session.close()


def _ignore(_piece: str) -> None:
    return None


__all__ = ["GenerativeModel", "Retired"]
