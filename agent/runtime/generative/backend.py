"""A generation runtime behind the backend interface (agent/runtime/backends): a key, the provider names it claims,
whether one is available here and why not, its version; `load` gives a `GenerativeSession` for the bundle's model
folder. Each runtime is one file of this room that registers itself with `@register`."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

from edgefleet.agent.runtime.backends import Backend, CancelToken, LoadOptions
from edgefleet.agent.runtime.generative.session import GenerativeSession


class GenerativeBackend(Backend):
    @abstractmethod
    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> GenerativeSession:
        """Load the model folder `model_path` (the manifest's `generation.model_dir`) for `provider`, with
        `options.threads` and `options.runtime_config` applied; LoadError with the runtime's reason."""


__all__ = ["GenerativeBackend"]
