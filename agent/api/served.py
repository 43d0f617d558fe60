"""What the routes need of the service, and what the service needs of a model: small protocols, so that the routes
(/v1, /v2) and the service each depend on these and never on each other (agent/api/service.py implements them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from edgefleet.agent.api.config import ServiceConfig
from edgefleet.agent.api.metrics.histograms import ServiceMetrics
from edgefleet.core.bundle.manifest import Manifest


class ServedModel(Protocol):
    """What the service needs of a model (agent.runtime.LoadedModel is one)."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def bundle_id(self) -> str: ...

    @property
    def provider(self) -> str: ...

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class Admitted(Protocol):
    """An admitted inference request: its place in the queue and the model it runs on."""

    @property
    def model(self) -> ServedModel: ...

    def quick(self) -> bool: ...

    def release(self) -> None: ...

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]: ...

    def remember(
        self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray], client_id: str | None = None
    ) -> str: ...


class Serving(Protocol):
    """The service as the routes see it."""

    @property
    def config(self) -> ServiceConfig: ...

    @property
    def metrics(self) -> ServiceMetrics: ...

    def admit(self, name: str, version: str | None = None) -> Admitted: ...

    def models(self) -> dict[str, ServedModel]: ...

    def lookup(self, name: str) -> ServedModel | None: ...

    def slot_of(self, model_name: str) -> str: ...

    @property
    def repository(self) -> Callable[[], list[tuple[str, str | None, str, str]]]: ...

    def describe(self, model: ServedModel) -> dict[str, Any]: ...

    def feedback(self, name: str, body: bytes) -> dict[str, Any]: ...

    def render_metrics(self, accept: str = "") -> tuple[bytes, str]: ...


__all__ = ["Admitted", "ServedModel", "Serving"]
