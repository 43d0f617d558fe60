"""The sd_notify client, against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.agent.daemon import watchdog


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: AF_UNIX paths must fit in 108 bytes, which pytest's tmp_path may exceed."""
    with tempfile.TemporaryDirectory(prefix="ef-sd-", dir="/tmp") as name:
        yield Path(name)


@pytest.fixture
def systemd(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A bound datagram socket at a path, announced in NOTIFY_SOCKET."""
    path = short_dir / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2.0)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def _received(sock: socket.socket) -> bytes:
    return sock.recv(4096)


def _nothing_queued(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.recv(4096)
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(2.0)
    return False


def test_no_notify_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert watchdog.ready("up") is False
    assert watchdog.ping() is False
    assert watchdog.status("x") is False
    assert watchdog.stopping() is False


def test_messages_arrive_as_datagrams(systemd: socket.socket) -> None:
    assert watchdog.ready("serving b-1 on CPUExecutionProvider") is True
    assert _received(systemd) == b"READY=1\nSTATUS=serving b-1 on CPUExecutionProvider"
    assert watchdog.ping() is True
    assert _received(systemd) == b"WATCHDOG=1"
    assert watchdog.status("downloading\nb-2  (3/10)") is True
    assert _received(systemd) == b"STATUS=downloading b-2 (3/10)"  # one line, whatever it was given
    assert watchdog.stopping() is True
    assert _received(systemd) == b"STOPPING=1"
    assert watchdog.extend_timeout(90) is True
    assert _received(systemd) == b"EXTEND_TIMEOUT_USEC=90000000"
    assert watchdog.ready() is True
    assert _received(systemd) == b"READY=1"
    assert _nothing_queued(systemd)


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"edgefleet-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2.0)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert watchdog.ping() is True
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_unreachable_socket_is_reported_not_raised(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_dir / "nobody-listens"))
    assert watchdog.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    assert watchdog.ping() is False


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert watchdog.watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog.watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert watchdog.watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_PID")
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    assert watchdog.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "0")
    assert watchdog.watchdog_interval() is None
