"""A bundle's runtime configuration never loads native code: a language-model bundle signed by the REAL bundle key
(the attacker holds it alone) that asks ONNX Runtime GenAI to load a library, by its genai_config.json or by the
manifest's generation.runtime_config, or that sets a provider its profile does not allow, is refused with the
reason by a real agent process over a real Mosquitto, and the library's constructor never runs.

The library is compiled here (tests/support/native_library.py): its constructor writes a marker file named by the
agent's environment, so the marker exists if and only if its code ran inside the agent. Succeeding means the marker
exists, or the device committed or served the bundle, or its status reports native code. After the attacks the
device still installs a valid bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgefleet.core.messages import Event
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.attacks.ledger import AttackLedger
from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle
from support.models.generative import TinylmBundles
from support.native_library import MARKER_ENV, constructor_library, custom_ops_library, resigned_with
from support.slots import slot_of

pytestmark = pytest.mark.slow  # the session's tinylm conversion, then real agents installing a language model

StartAgent = Callable[..., AgentProcess]
INSTALL_S = 180.0  # a language model's install (download, golden prompts) on a loaded 2-core machine


def _refusal(watcher: FleetWatcher, device: str, bundle_id: str) -> Event:
    return watcher.wait_for(
        f"{device} refusing {bundle_id}",
        lambda: next(
            (e for e in watcher.events if e.device_id == device and e.bundle_id == bundle_id and e.kind == "refused"),
            None,
        ),
        INSTALL_S,
    )


def _other_provider(config: dict[str, Any]) -> None:
    """QNN's options name its backend library: a provider the generic-x86-64 profile does not allow."""
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"qnn": {"backend_path": "libQnnHtp.so"}}]


def test_a_language_model_bundle_cannot_make_the_agent_load_native_code(
    tinylm_bundles: TinylmBundles, start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    signing_key: SigningKey, trusted: TrustedKeys, tmp_path: Path, attack_ledger: AttackLedger,
) -> None:  # fmt: skip
    device = "atk-native-code"
    marker = tmp_path / "constructor-ran"
    agent = start_agent(device, profile="generic-x86-64", env={MARKER_ENV: str(marker)})
    v1 = tinylm_bundles["generic-x86-64"]
    v1_id = deploy_to(host, topics, v1, devices=(device,))
    watcher.serving(device, v1_id, timeout=INSTALL_S)
    library = constructor_library(tmp_path / "attacker")
    library.parent.chmod(0o777)  # world-writable: what an attacker on the device could rewrite at will
    attempts: dict[str, tuple[dict[str, Any], str]] = {
        "genai_config.json names a signed library as custom_ops_library (real bundle key)": (
            {"edit_config": custom_ops_library(library.name)},
            "genai_config.json model.decoder.session_options: 'custom_ops_library' loads a native library",
        ),
        "generation.runtime_config names a library outside the bundle as custom_ops_library (real bundle key)": (
            {"runtime_config": {"custom_ops_library": str(library)}},
            "generation.runtime_config: 'custom_ops_library' loads a native library",
        ),
        "genai_config.json provider_options sets a provider the profile does not allow (real bundle key)": (
            {"edit_config": _other_provider},
            "sets provider 'qnn', which the bundle's profile does not allow here",
        ),
    }
    for version, (name, (change, reason)) in enumerate(attempts.items(), start=2):
        bundle = resigned_with(v1, tmp_path, signing_key, trusted, str(version), library=library, **change)
        bundle_id = deploy_to(host, topics, bundle, devices=(device,))
        event = _refusal(watcher, device, bundle_id)
        assert reason in event.detail, event.detail
        status = watcher.status[device]
        committed = any(e.device_id == device and e.bundle_id == bundle_id and e.kind == "committed"
                        for e in watcher.events)  # fmt: skip
        succeeded = marker.exists() or committed or slot_of(status).active_bundle != v1_id or bool(status.native_code)
        assert not attack_ledger.record(name, succeeded, event.detail)
    fetched = {e.bundle_id for e in watcher.events if e.device_id == device and e.kind == "download-started"}
    assert "tinylm-3-generic-x86-64" not in fetched, "a runtime_config is refused from the signed manifest alone"
    v9 = derive_bundle(v1, tmp_path, signing_key, trusted, model_version="9")
    v9_id = deploy_to(host, topics, v9, devices=(device,))
    status = watcher.serving(device, v9_id, timeout=INSTALL_S)
    assert agent.alive and not marker.exists() and status.native_code == []
