"""Generative (language) models: the generation runtimes behind the backend interface (ONNX Runtime GenAI and
OpenVINO GenAI, one file each, registered with the backends when this room is imported; neither runtime is imported
until used), the provider chosen by measurement on the golden prompts, the golden check, token budgets, stop strings
and chat prompts.

Other rooms use: `GenerativeModel` (a generative bundle loaded and checked; LoadedModel holds one), the request and
result types (`GenerationRequest`, `GenerationResult`, `Sampling`, `Stopper`), `BudgetError` (a request that cannot
fit: the caller's fault) and `Retired` (the model is being replaced).
"""

from edgefleet.agent.runtime.generative import openvino_genai, ort_genai
from edgefleet.agent.runtime.generative.budget import BudgetError
from edgefleet.agent.runtime.generative.chat import ROLES
from edgefleet.agent.runtime.generative.model import GenerativeModel, Retired
from edgefleet.agent.runtime.generative.session import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    Sampling,
    Stopper,
)

__all__ = [
    "ROLES",
    "BudgetError",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "GenerativeModel",
    "Retired",
    "Sampling",
    "Stopper",
    "openvino_genai",
    "ort_genai",
]
