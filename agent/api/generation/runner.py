"""One generation from a `GenerationCall` to its result, the same for every path: the model resolved by name, the
prompt tokenized (a chat through the model's template, else the plain one), the token budget, a place at the shared
gate, the run, and its accounting.

`prepare` refuses what cannot be served (404, 400) before a gate place is taken; `run` answers with the result. A model
being replaced meanwhile (a swap's drain) is left for the model now served, once. The model's own failure is a 500
and counts against its health; a refusal never does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from edgefleet.agent.api.error_log import SampledLog
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation.accounting import GenerationAccounting
from edgefleet.agent.api.generation.call import GenerationCall
from edgefleet.agent.api.generation.config import GenerationConfig
from edgefleet.agent.api.generation.gate import GenerationGate
from edgefleet.agent.api.metrics.generation import GenerationMetrics
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.agent.runtime.generative import (
    BudgetError,
    GenerationRequest,
    GenerationResult,
    GenerativeModel,
    Retired,
    Stopper,
)
from edgefleet.agent.schedule.gate import ComputeGate
from edgefleet.agent.telemetry import RequestStats
from edgefleet.core.bundle.manifest import Manifest

log = logging.getLogger(__name__)


class Served(Protocol):
    """A served model as generation sees it (agent.runtime.LoadedModel; `generative` is None for a tensor model)."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def bundle_id(self) -> str: ...


@dataclass(frozen=True)
class GenerationParts:
    """What every generation path shares: the limits, the gate that bounds generations device-wide, the accounting."""

    config: GenerationConfig
    gate: GenerationGate
    accounting: GenerationAccounting
    compute: ComputeGate | None = None  # the scheduler's compute gate: each token is a step of the model's slot

    def with_compute(self, compute: ComputeGate | None) -> GenerationParts:
        """These parts with the scheduler's compute gate (agent/schedule/gate.py)."""
        return replace(self, compute=compute)

    @classmethod
    def build(
        cls, config: GenerationConfig, stats: RequestStats, service: ServiceMetrics | None = None
    ) -> GenerationParts:
        """The daemon's: one gate and one accounting for every path."""
        return cls(config, GenerationGate(config), GenerationAccounting(stats, GenerationMetrics(), service))

    @classmethod
    def standalone(cls, config: GenerationConfig | None = None, stats: RequestStats | None = None) -> GenerationParts:
        """Parts of their own (a service or a test without the daemon's)."""
        return cls.build(config or GenerationConfig(), stats or RequestStats())


@dataclass(frozen=True)
class Prepared:
    call: GenerationCall
    served: Any  # a Served with a generative model
    model: GenerativeModel
    request: GenerationRequest
    template: str = ""  # a chat's: "model" or "plain"
    stopper: Stopper = field(default_factory=Stopper)

    @property
    def name(self) -> str:
        return str(self.served.manifest.model_name)


class GenerationRunner:
    def __init__(self, parts: GenerationParts, models: Callable[[], Mapping[str, Served]]) -> None:
        self.parts, self._models = parts, models
        self._errors = SampledLog(log)  # a traceback a minute per kind, the rest counted

    @property
    def accounting(self) -> GenerationAccounting:
        return self.parts.accounting

    def served(self) -> Mapping[str, Served]:
        return self._models()

    def resolve(self, name: str) -> tuple[Any, GenerativeModel]:
        served = self._models().get(name)
        if served is None:
            names = ", ".join(sorted(self._models())) or "none"
            raise RequestError(404, "not-found", f"no model named {name!r} is served here (serving: {names})")
        generative = getattr(served, "generative", None)
        if not isinstance(generative, GenerativeModel):
            raise RequestError(400, "bad-request", f"{name} is not a generative model: use its infer endpoint")
        return served, generative

    def prepare(self, call: GenerationCall, stopper: Stopper | None = None) -> Prepared:
        """The request the model will run, or RequestError (404, 400) saying why it cannot."""
        served, model = self.resolve(call.model)
        template = ""
        if call.messages or isinstance(call.prompt, str):
            ids, template = self._tokens(model, call)
        else:
            ids = list(call.prompt)
            vocab = model.spec.vocab_size
            if any(t >= vocab for t in ids):
                raise RequestError(400, "bad-request", f"prompt: token ids must be below the vocabulary size {vocab}")
        vocab = model.spec.vocab_size
        if call.sampling is not None and call.sampling.top_k > vocab:  # ORT GenAI fails on it
            raise RequestError(400, "bad-request", f"top_k: at most the vocabulary size {vocab}, "
                               f"not {call.sampling.top_k}")  # fmt: skip
        if not ids:
            raise RequestError(400, "bad-request", "prompt: it is empty (no tokens): give the model something to go on")
        try:
            budget = model.budget(len(ids), call.max_tokens, self.parts.config.max_tokens)
        except BudgetError as err:
            raise RequestError(400, "bad-request", str(err)) from err
        compute, slot = self.parts.compute, str(served.manifest.model_name)
        step = None if compute is None else partial(compute.step, slot)
        request = GenerationRequest(
            tuple(ids), budget, model.stop_ids, call.sampling, ignore_stop=call.ignore_eos, step=step
        )
        return Prepared(call, served, model, request, template, stopper or Stopper())

    def _tokens(self, model: GenerativeModel, call: GenerationCall) -> tuple[list[int], str]:
        """The prompt's tokens (a chat's through its template). Text was checked at the boundary (call.py); a
        tokenizer that still refuses it refuses the request (400), never the model's health."""
        try:
            if call.messages:
                text, template = model.chat_prompt([{"role": r, "content": c} for r, c in call.messages])
                return list(model.encode(text)), template
            assert isinstance(call.prompt, str)
            return list(model.encode(call.prompt)), ""
        except Exception as err:
            self._errors.exception("tokenizer", "the tokenizer refused a prompt for %s", call.model)
            raise RequestError(400, "bad-request", f"prompt: the tokenizer refused it ({type(err).__name__})") from err

    def run(self, prepared: Prepared, on_text: Callable[[str], None]) -> GenerationResult:
        """Run a prepared generation (its generation place taken); the result, accounted for."""
        try:
            result = self._generate(prepared, on_text)
        except Retired:  # replaced since it was prepared, before it started: the model now served takes it
            prepared = self.prepare(prepared.call, prepared.stopper)
            result = self._generate(prepared, on_text)
        self.accounting.finished(prepared.call.operation, prepared.name, prepared.served.bundle_id, result)
        return result

    def _generate(self, prepared: Prepared, on_text: Callable[[str], None]) -> GenerationResult:
        try:
            return prepared.model.generate(
                prepared.request, on_text, stop_strings=prepared.call.stop, stopper=prepared.stopper
            )
        except Retired:
            raise
        except Exception as err:  # the model's own failure: answers this request, counts against its health
            self._errors.exception("generation", "generation failed on %s", prepared.served.bundle_id)
            self.accounting.failed(prepared.name)
            raise RequestError(500, "runtime", f"generation failed: {type(err).__name__}: {err}") from err


__all__ = ["GenerationParts", "GenerationRunner", "Prepared", "Served"]
