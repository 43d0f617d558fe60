"""Shared fixtures: real brokers, keys, the demo model and its bundles, agent subprocesses."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefleet.control.embedded_broker import EmbeddedBroker
from edgefleet.core.mqtt import Connection
from edgefleet.core.signing import SigningKey, generate_keypair
from edgefleet.core.topics import Topics

from brokers import MosquittoBroker
from fleet_helpers import DIGITS, AgentProcess, FleetWatcher


@pytest.fixture(scope="session")
def mosquitto() -> Iterator[MosquittoBroker]:
    """A real Mosquitto on a free port. Fails (never skips) when mosquitto is not installed."""
    with MosquittoBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def embedded_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(private key, public key) used to sign every test bundle."""
    return generate_keypair(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="session")
def signing_key(keys: tuple[Path, Path]) -> SigningKey:
    return SigningKey.load(keys[0])


@pytest.fixture(scope="session")
def demo_bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """The digits CNN converted for both starting profiles, version 1."""
    from edgefleet.converter.build import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    out = tmp_path_factory.mktemp("bundles")
    results = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx",
            profiles=[get_profile("intel-x86-vnni"), get_profile("generic-x86-64")],
            calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz",
            out=out,
            key=signing_key,
            name="digits-cnn",
            version="1",
        )
    )
    return {r.profile: Path(r.bundle) for r in results if r.bundle}


@pytest.fixture
def host(mosquitto: MosquittoBroker) -> Iterator[Connection]:
    conn = Connection(mosquitto.url, f"test-host-{id(mosquitto)}-{Path.cwd().name}", protocol="auto").start()
    yield conn
    conn.stop()


@pytest.fixture
def topics() -> Topics:
    return Topics()


@pytest.fixture
def start_agent(
    tmp_path: Path, keys: tuple[Path, Path], mosquitto: MosquittoBroker
) -> Iterator[Callable[..., AgentProcess]]:
    """Start real agent subprocesses; every one still running is stopped at teardown."""
    started: list[AgentProcess] = []

    def start(device_id: str = "dev-1", **options: object) -> AgentProcess:
        options.setdefault("broker", mosquitto.url)
        options.setdefault("trust", keys[1])
        agent = AgentProcess(device_id, tmp_path / device_id, **options)  # type: ignore[arg-type]
        started.append(agent.start())
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
def watcher(host: Connection, topics: Topics) -> FleetWatcher:
    return FleetWatcher(host, topics)
