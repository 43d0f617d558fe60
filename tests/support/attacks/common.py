"""What the broker attack tests share: the topics, an inbox, a deployment by the CLI or by hand, the bundles a device
was granted."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from edgefleet.control.rights.dynsec import device_role
from edgefleet.control.rights.sync import DynsecClient
from edgefleet.control.store import Deployment, Store
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.topics import Topics

from support.servers.secure_broker import CLI_IDENTITY, SecureBroker

WAIT = 10.0


class Inbox:
    """A Connection handler that keeps every message (topic, payload, retained) and lets a test wait for one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.messages: list[tuple[str, bytes, bool]] = []

    def __call__(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._cond:
            self.messages.append((topic, payload, retained))
            self._cond.notify_all()

    def wait_for(self, topic: str, payload: bytes, timeout: float = WAIT) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: any(m[:2] == (topic, payload) for m in self.messages), timeout):
                raise AssertionError(f"{topic} {payload!r} not received within {timeout:g} s; got {self.topics()}")

    def topics(self) -> set[str]:
        with self._cond:
            return {m[0] for m in self.messages}


def cli_deploy(broker: SecureBroker, bundle: Path, *targets: str) -> dict[str, object]:
    tls = broker.pki.tls(CLI_IDENTITY)
    cmd = [sys.executable, "-m", "edgefleet", "deploy", str(bundle), *targets, "--broker", broker.url,
           "--ca", tls.ca, "--cert", str(tls.cert), "--key", str(tls.key), "--json"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def bundle_id_of(bundle: Path) -> str:
    return parse_manifest(read_signed_manifest(bundle).manifest_json).bundle_id


TOPICS = Topics()


def granted_bundles(client: DynsecClient, device: str) -> set[str]:
    (reply,) = client.check([{"command": "getRole", "rolename": device_role(device)}])
    prefix = f"{TOPICS.prefix}/bundles/"
    return {
        a["topic"][len(prefix) :].split("/")[0] for a in reply["data"]["role"]["acls"] if a["topic"].startswith(prefix)
    }


def deploy_group(store: Store, group: str, manifest: Manifest) -> None:
    store.put_deployment(
        Deployment(scope="group", target=group, profile=manifest.profile, bundle_id=manifest.bundle_id,
                   model_name=manifest.model_name, model_version=manifest.model_version, updated_at=time.time())
    )  # fmt: skip
