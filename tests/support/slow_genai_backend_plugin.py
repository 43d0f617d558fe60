"""A generative backend plugin (loaded through $EDGEFLEET_BACKENDS) that stands in for a device on which a bundle
generates slower than on the host: ONNX Runtime GenAI on the CPU, with every output token delayed by
$EDGEFLEET_TOKEN_DELAY_MS (default 5 ms). A real runtime cannot be made slower on demand, and a CPU hog would slow
the baseline too. Provider name: "plugin-slow-genai:cpu"; a bundle that lists only it is served slowed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from edgefleet.agent.runtime.backends import Availability, CancelToken, LoadOptions, register
from edgefleet.agent.runtime.generative.ort_genai import OrtGenAIBackend
from edgefleet.agent.runtime.generative.session import (
    GenerationRequest,
    GenerationResult,
    GenerativeSession,
    OnText,
    Stopper,
)

PROVIDER = "plugin-slow-genai:cpu"


@register
class SlowGenAIBackend(OrtGenAIBackend):
    key = "plugin-slow-genai"
    title = "ONNX Runtime GenAI with every token delayed (a slower device)"
    known_providers = (PROVIDER,)

    def claims(self, provider: str) -> bool:
        return provider == PROVIDER

    def availability(self, provider: str) -> Availability:
        return super().availability("onnxruntime-genai:cpu")

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> GenerativeSession:
        session = super().load(model_path, "onnxruntime-genai:cpu", options, cancel)
        delay = float(os.environ.get("EDGEFLEET_TOKEN_DELAY_MS", "5")) / 1000
        inner = session.generate

        def generate(request: GenerationRequest, on_text: OnText, stopper: Stopper | None = None) -> GenerationResult:
            def slowed(piece: str) -> None:
                time.sleep(delay)  # inside the token loop: the next token's clock includes it
                on_text(piece)

            return inner(request, slowed, stopper)

        session.generate = generate  # type: ignore[method-assign]
        session.provider = PROVIDER
        return session
