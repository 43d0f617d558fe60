"""A language-model bundle may name only the providers its profile allows for generation, or one that a backend
plugin the device's operator loaded claims ($EDGEFLEET_BACKENDS, the device's own opt-in); a provider one of the
agent's own backends claims but the profile does not list is still refused (agent/install/signed_files.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgefleet.agent.install.signed_files import generative_providers
from edgefleet.agent.runtime import backends
from edgefleet.core.bundle.runtime_config import ConfigRefused


class OperatorPlugin(backends.Backend):
    """A backend from outside the agent's package, as $EDGEFLEET_BACKENDS loads one."""

    key, title, formats, known_providers = "operator-plugin", "Operator plugin", ("onnx-genai",), ("operator-x:cpu",)

    def claims(self, provider: str) -> bool:
        return provider == "operator-x:cpu"

    def availability(self, provider: str) -> backends.Availability:
        return backends.Availability.yes()

    def version(self, provider: str) -> str:
        return "1"

    def load(self, model_path: Path, provider: str, options: Any, cancel: Any) -> Any:
        raise NotImplementedError


def manifest(*providers: str) -> Any:
    return SimpleNamespace(profile="generic-x86-64", providers=list(providers))


def test_the_profiles_generation_providers_are_taken() -> None:
    assert generative_providers(manifest("onnxruntime-genai:cpu")) == ["onnxruntime-genai:cpu"]


def test_a_provider_outside_the_profile_is_refused_naming_it() -> None:
    with pytest.raises(ConfigRefused, match="operator-x:cpu"):
        generative_providers(manifest("onnxruntime-genai:cpu", "operator-x:cpu"))


def test_a_provider_of_a_plugin_the_device_loaded_is_the_devices_own_opt_in() -> None:
    with backends.registered(OperatorPlugin()):
        assert generative_providers(manifest("operator-x:cpu")) == ["operator-x:cpu"]


def test_a_provider_only_the_agents_own_backends_claim_is_still_refused() -> None:
    own = [
        b
        for b in backends.backends()
        if type(b).__module__.startswith("edgefleet.") and b.claims("CUDAExecutionProvider")
    ]
    assert own, "an agent backend claims CUDAExecutionProvider"
    with pytest.raises(ConfigRefused, match="CUDAExecutionProvider"):
        generative_providers(manifest("CUDAExecutionProvider"))
