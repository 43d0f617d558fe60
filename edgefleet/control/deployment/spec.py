"""What a deployment directory is made from: the options of `edgefleet init`, and what follows from them."""

from __future__ import annotations

import ipaddress
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgefleet.core.topics import DEFAULT_PREFIX, HOST_IDENTITY

OPERATOR_IDENTITY = "edgefleet-cli"  # the operator's commands; `control serve` is HOST_IDENTITY
DEFAULT_EDGEFLEET = "/opt/edgefleet/venv/bin/edgefleet"
DEFAULT_MOSQUITTO = "/usr/sbin/mosquitto"
_WILDCARDS = ("0.0.0.0", "::", "", "all")
_PLUGIN = "mosquitto_dynamic_security.so"
_MULTIARCH = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu",
              "arm64": "aarch64-linux-gnu", "armv7l": "arm-linux-gnueabihf"}  # fmt: skip


def default_dynsec_plugin() -> str:
    """The dynamic-security plugin's path: where this machine has it, else Debian's path for this architecture."""
    arch = _MULTIARCH.get(platform.machine().lower(), "x86_64-linux-gnu")
    candidates = [f"/usr/lib/{arch}/{_PLUGIN}", f"/usr/lib/{_PLUGIN}", f"/usr/local/lib/{_PLUGIN}"]
    return next((c for c in candidates if Path(c).is_file()), candidates[0])


@dataclass(frozen=True)
class DeploymentSpec:
    """`directory` is where the files are written; `install_path` where they will run (the systemd units name it;
    everything else is relative to the directory)."""

    directory: Path
    devices: Mapping[str, Sequence[str]] = field(default_factory=dict)
    install_path: Path | None = None
    listen: str = "127.0.0.1"
    port: int = 8883
    hosts: Sequence[str] = ()
    prefix: str = DEFAULT_PREFIX
    broker_user: str = "mosquitto"
    dynsec_plugin: str = field(default_factory=default_dynsec_plugin)
    mosquitto: str = DEFAULT_MOSQUITTO
    edgefleet: str = DEFAULT_EDGEFLEET
    dashboard: str = "127.0.0.1:8780"
    context_name: str = "fleet"

    @property
    def where(self) -> Path:
        return self.install_path or self.directory.resolve()

    @property
    def host_identities(self) -> tuple[str, str]:
        return (HOST_IDENTITY, OPERATOR_IDENTITY)

    @property
    def local_url(self) -> str:
        """The broker as the host commands on the broker's machine dial it."""
        host = "127.0.0.1" if self.listen in _WILDCARDS or _is_loopback(self.listen) else self.listen
        return f"mqtts://{_url_host(host)}:{self.port}"

    @property
    def device_url(self) -> str:
        """The broker as devices dial it: the first --host, else the listen address (loopback by default)."""
        host = self.hosts[0] if self.hosts else ("127.0.0.1" if self.listen in _WILDCARDS else self.listen)
        return f"mqtts://{_url_host(host)}:{self.port}"

    @property
    def server_names(self) -> list[str]:
        """The broker certificate's names (localhost and 127.0.0.1 are always added by pki)."""
        names = list(self.hosts)
        if self.listen not in _WILDCARDS and self.listen not in names:
            names.append(self.listen)
        return names or ["localhost"]

    @property
    def listener(self) -> str:
        return f"listener {self.port}" if self.listen in ("", "all") else f"listener {self.port} {self.listen}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
