"""Test helper: a real Mosquitto broker on a free loopback port, started and stopped by the tests.

Tests that need Mosquitto must fail, never skip, when it is missing: CI installs it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
_SEARCH_DIRS = ("/usr/sbin", "/usr/local/sbin", "/opt/homebrew/sbin")


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def mqtt_handshake(host: str, port: int, timeout: float = 1.0) -> None:
    """CONNECT, expect CONNACK "accepted", DISCONNECT, all in MQTT 3.1.1; OSError if that fails.

    A bare TCP connect is not enough: it proves only that something listens on the port.
    """
    client_id = b"edgefleet-probe"
    variable_header = b"\x00\x04MQTT\x04\x02\x00\x05"  # protocol 3.1.1, clean session, keepalive 5 s
    body = variable_header + len(client_id).to_bytes(2, "big") + client_id
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(bytes([0x10, len(body)]) + body)
        connack = b""
        while len(connack) < 4:
            chunk = sock.recv(4 - len(connack))
            if not chunk:
                raise ConnectionError(f"{host}:{port} closed the connection before its CONNACK")
            connack += chunk
        if connack != b"\x20\x02\x00\x00":
            raise ConnectionError(f"{host}:{port} answered CONNECT with {connack.hex()}, not with 20020000")
        sock.sendall(b"\xe0\x00")


def mosquitto_binary() -> str:
    """The path of the `mosquitto` executable; a RuntimeError when it is not installed."""
    found = shutil.which("mosquitto")
    if found:
        return found
    for directory in _SEARCH_DIRS:
        candidate = Path(directory, "mosquitto")
        if candidate.is_file():
            return str(candidate)
    raise RuntimeError("mosquitto is not installed: apt-get install -y mosquitto")


def mosquitto_version() -> str:
    """E.g. "2.0.11", from the first line of `mosquitto -h`."""
    result = subprocess.run([mosquitto_binary(), "-h"], capture_output=True, text=True, timeout=10)
    first_line = (result.stdout or result.stderr).splitlines()[0]
    return first_line.rsplit(" ", 1)[-1]


class MosquittoBroker:
    """`mosquitto -c CONF` on 127.0.0.1: anonymous, no packet size limit, persistence only if asked.

    `restart()` keeps the port, so clients can reconnect to the same URL (fault injection).
    """

    def __init__(
        self,
        port: int = 0,
        persistence_dir: str | Path | None = None,
        host: str = HOST,
        extra_config: Sequence[str] = (),
    ) -> None:
        """`extra_config`: lines appended to the generated configuration, e.g. a second `listener` with its TLS
        settings, or `acl_file`. The plain anonymous listener on `port` stays: it is how `start()` knows the
        broker is up (an `acl_file` leaves anonymous clients nothing to read or write)."""
        self.binary = mosquitto_binary()
        self.host = host
        self.port = port or free_port(host)
        self.persistence_dir = Path(persistence_dir) if persistence_dir is not None else None
        self.extra_config = list(extra_config)
        self._tmp = tempfile.TemporaryDirectory(prefix="edgefleet-mosquitto-")
        self.config_path = Path(self._tmp.name, "mosquitto.conf")
        self.log_path = Path(self._tmp.name, "mosquitto.log")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _write_config(self) -> None:
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            # As root mosquitto would switch to user "mosquitto", who may not reach our files; a non-root
            # user is never switched, whatever this says.
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_timestamp_format %H:%M:%S",
        ]
        if self.persistence_dir is None:
            lines.append("persistence false")
        else:
            self.persistence_dir.mkdir(parents=True, exist_ok=True)
            lines += ["persistence true", f"persistence_location {self.persistence_dir}/"]
        lines += self.extra_config
        self.config_path.write_text("\n".join(lines) + "\n")

    def stderr(self) -> str:
        """What mosquitto has logged so far (all of its runs)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, timeout: float = 10.0) -> MosquittoBroker:
        """Start mosquitto and wait until it answers an MQTT CONNECT on its port."""
        if self.running:
            raise RuntimeError(f"mosquitto is already running on {self.url}")
        self._write_config()
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [self.binary, "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise RuntimeError(f"mosquitto exited with code {code} on {self.url}:\n{self.stderr()}")
            try:
                mqtt_handshake(self.host, self.port, timeout=0.5)
                return self
            except OSError as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"mosquitto did not accept connections on {self.url} within {timeout:g} s:\n{self.stderr()}"
                    ) from exc
                time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (mosquitto saves its persistence file then), SIGKILL if it lingers. Safe to call twice."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing saved."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(5.0)

    def pause(self) -> None:
        """SIGSTOP: the broker holds its connections but reads, applies and acknowledges nothing."""
        assert self._process is not None and self._process.poll() is None, "mosquitto is not running"
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        assert self._process is not None and self._process.poll() is None, "mosquitto is not running"
        self._process.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> MosquittoBroker:
        """Stop and start again on the same port."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop and delete the temporary config and log."""
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> MosquittoBroker:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
