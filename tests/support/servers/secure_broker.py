"""Test helper: Mosquitto running the SHIPPED secure configuration (deploy/fleet/mosquitto.conf, what
`edgefleet init` writes).

The file is used as shipped, from a temporary directory laid out as `edgefleet init` lays one out (pki/,
broker/), with only what a test machine must change: the listener's port (a free one, on loopback) and `user`
(as root Mosquitto would switch to "mosquitto", who cannot enter the temporary directory; that the shipped
configuration starts as root with its own user is tests/integration/cli/test_init.py's). Every replaced line must
be found, so a change to the shipped file that these tests no longer cover fails here instead of passing silently.

Credentials: a CA, the broker's certificate, two control-plane identities (`edgefleet-host` for the control
plane, `edgefleet-cli` for operator commands and attackers' helpers) and one certificate per device; the
plugin's first configuration comes from `edgefleet.control.rights.dynsec.render_config` (what `edgefleet keys dynsec`
writes).
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgefleet.control.credentials.pki import CertFiles, create_ca, create_client_cert, create_server_cert
from edgefleet.control.rights.dynsec import render_config
from edgefleet.core.errors import BrokerError
from edgefleet.core.mqtt.connection import Connection, TlsFiles
from edgefleet.core.topics import HOST_IDENTITY

from support.paths import REPO
from support.servers.brokers import HOST, free_port, mosquitto_binary

SHIPPED = REPO / "deploy" / "fleet" / "mosquitto.conf"
CLI_IDENTITY = "edgefleet-cli"


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: CertFiles
    server: CertFiles
    hosts: dict[str, CertFiles]
    devices: dict[str, CertFiles]

    def tls(self, identity: str) -> TlsFiles:
        files = self.hosts.get(identity) or self.devices[identity]
        return TlsFiles(ca=str(self.ca.cert), cert=str(files.cert), key=str(files.key))

    def add_device(self, device_id: str) -> CertFiles:
        files = create_client_cert(self.directory, device_id)
        self.devices[device_id] = files
        return files


def make_pki(directory: Path, devices: Sequence[str], hosts: Sequence[str] = (HOST_IDENTITY, CLI_IDENTITY)) -> Pki:
    ca = create_ca(directory)
    return Pki(
        directory=directory,
        ca=ca,
        server=create_server_cert(directory, ["localhost"]),
        hosts={h: create_client_cert(directory, h) for h in hosts},
        devices={d: create_client_cert(directory, d) for d in devices},
    )


def render_shipped(port: int, *, crl: bool = False) -> str:
    """The shipped configuration with this machine's port and user (see the module docstring); `crl`: with its
    optional `crlfile` line switched on."""
    text = SHIPPED.read_text()
    replacements = {}
    if crl:  # and its reload logged (`SecureBroker.reload` waits for it)
        replacements["\n#crlfile pki/crl.pem\n"] = "\ncrlfile pki/crl.pem\n"
        replacements["\nlog_type notice\n"] = "\nlog_type notice\nlog_type information\n"
    replacements |= {
        "\nlistener 8883 127.0.0.1\n": f"\nlistener {port} {HOST}\n",
        "\nuser mosquitto\n": f"\nuser {pwd.getpwuid(os.getuid()).pw_name}\n",
    }
    for old, new in replacements.items():
        if old not in text:
            raise AssertionError(
                f"{SHIPPED} no longer contains {old.strip()!r}; update tests/support/servers/secure_broker.py"
            )
        text = text.replace(old, new)
    return text


class SecureBroker:
    """Mosquitto with the shipped configuration on a free loopback port; `url` is mqtts://."""

    def __init__(
        self,
        pki: Pki,
        devices: Mapping[str, Sequence[str]],
        *,
        host_users: Sequence[str] = (HOST_IDENTITY, CLI_IDENTITY),
        crl: Path | None = None,
    ) -> None:
        self.pki = pki
        self.port = free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="edgefleet-secure-mosquitto-")
        self.directory = Path(self._tmp.name)
        self.data = self.directory / "broker"
        self.data.mkdir()
        self.config_path = self.directory / "mosquitto.conf"
        self.log_path = self.directory / "stderr.log"
        # Certificates under the names the shipped file expects.
        certs = self.directory / "pki"
        certs.mkdir()
        for name, source in (("ca.crt", pki.ca.cert), ("server.crt", pki.server.cert), ("server.key", pki.server.key)):
            (certs / name).symlink_to(source)
        if crl is not None:  # the shipped optional crlfile line, on the CRL the test revokes into
            (certs / "crl.pem").symlink_to(crl)
        (self.data / "dynamic-security.json").write_text(render_config(devices, host_users=host_users))
        self.config_path.write_text(render_shipped(self.port, crl=crl is not None))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtts://{HOST}:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def connect(self, identity: str, client_id: str | None = None, **options: object) -> Connection:
        conn = Connection(
            self.url,
            client_id or f"test-{identity}",
            protocol="5",
            tls=self.pki.tls(identity),
            **options,  # type: ignore[arg-type]
        )
        try:
            return conn.start(wait=10.0)
        except BrokerError as err:
            raise AssertionError(f"{identity} could not connect: {err}\n{self.log()[-3000:]}") from err

    def start(self, timeout: float = 15.0) -> SecureBroker:
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [mosquitto_binary(), "-c", "mosquitto.conf"],  # its paths are relative to its directory
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self._process.returncode}:\n{self.log()}")
            probe = Connection(self.url, "probe", protocol="5", tls=self.pki.tls(CLI_IDENTITY))
            try:
                probe.start(wait=2.0)
                probe.stop()
                return self
            except BrokerError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the secure mosquitto did not come up:\n{self.log()}") from None
                time.sleep(0.1)

    def reload(self) -> None:
        """SIGHUP, as `systemctl reload mosquitto`; returns once the broker logged that it reloads (it finishes
        that before it accepts another connection)."""
        assert self._process is not None
        before = self.log().count("Reloading config.")
        self._process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15.0
        while self.log().count("Reloading config.") <= before:
            if time.monotonic() > deadline:
                raise AssertionError(f"mosquitto did not reload:\n{self.log()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> SecureBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
