"""Shared fixtures: real brokers, keys, the demo model and its bundles, agent subprocesses."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefleet.control.broker.embedded import EmbeddedBroker
from edgefleet.control.credentials import keyring
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import Profile
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher
from support.host_cpu import as_this_host, hide_cpu_flags_from_env
from support.paths import DIGITS
from support.run_once import once_per_run
from support.servers.brokers import MosquittoBroker
from support.servers.pg_server import PostgresServer

# Fixtures that live beside their helpers: the attack ledger (and its end-of-session table), the local API's
# loaded models, the quality tests' bundles, the generative (tinylm) bundles, the rollout tests' bundles; and how the
# suite runs in parallel (xdist groups, the serial pass); docs/getting-started.md's fleet, run once a session.
pytest_plugins = [
    "support.parallel_runs",
    "support.doc_pages",
    "support.attacks.ledger",
    "support.local_api",
    "support.models.quality_bundles",
    "support.models.generative",
    "support.rollouts.fleet",
]

hide_cpu_flags_from_env()  # EDGEFLEET_TEST_CPU_WITHOUT: profile matching as on a CPU without those flags


@pytest.fixture(scope="session")
def mosquitto() -> Iterator[MosquittoBroker]:
    """A real Mosquitto on a free port. Fails (never skips) when mosquitto is not installed."""
    with MosquittoBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (initdb + pg_ctl) on a free port. Fails (never skips) when it is not installed."""
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def embedded_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="session", autouse=True)
def host_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[keyring.HostKeys]:
    """The session's key directory, as `edgefleet keys init` makes it: root (agents pin root.pub), the bundle
    and ops role keys and the root-signed key set. EDGEFLEET_HOME points at it for the whole session (autouse: a
    test that starts `control serve` or a CLI subprocess gets the keys whatever ran before it), so host code
    (publish, deploy, the control plane) and CLI subprocesses sign with these keys."""
    home = tmp_path_factory.mktemp("edgefleet-home")
    # one set of keys for the run, so that what once_per_run makes (signed bundles) is trusted on every xdist worker
    shutil.copytree(once_per_run(tmp_path_factory, "keys", _initialized), home / "keys")
    previous = os.environ.get("EDGEFLEET_HOME")
    os.environ["EDGEFLEET_HOME"] = str(home)
    yield keyring.HostKeys(home / "keys")
    if previous is None:
        os.environ.pop("EDGEFLEET_HOME", None)
    else:
        os.environ["EDGEFLEET_HOME"] = previous


def _initialized(directory: Path) -> Path:
    keyring.init(directory)
    return directory


@pytest.fixture(scope="session", autouse=True)
def _session_keys(host_keys: keyring.HostKeys) -> keyring.HostKeys:
    return host_keys


@pytest.fixture(scope="session")
def keys(host_keys: keyring.HostKeys) -> tuple[Path, Path]:
    """(private key, public key) of the bundle role, which signs every test bundle."""
    return host_keys.directory / "bundle.key", host_keys.directory / "bundle.pub"


@pytest.fixture(scope="session")
def root_pub(host_keys: keyring.HostKeys) -> Path:
    """The root public key agents pin (`--trust`)."""
    return host_keys.root_public()


@pytest.fixture
def trusted(keys: tuple[Path, Path]) -> TrustedKeys:
    """The keys a device trusts: the session's bundle public key."""
    return TrustedKeys.load([keys[1]])


@pytest.fixture(scope="session")
def signing_key(keys: tuple[Path, Path]) -> SigningKey:
    return SigningKey.load(keys[0])


@pytest.fixture(scope="session")
def demo_bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """The digits CNN converted for both starting profiles, version 1 (once per run: support/parallel_runs.py)."""
    return once_per_run(tmp_path_factory, "bundles", lambda out: _demo_bundles(out, signing_key))


def _demo_bundles(out: Path, signing_key: SigningKey) -> dict[str, Path]:
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    results = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx",
            profiles=[_demo_profile(get_profile(name)) for name in ("intel-x86-vnni", "generic-x86-64")],
            calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz",
            out=out,
            key=signing_key,
            name="digits-cnn",
            version="1",
            # ONNX files, so tests can edit the model; FP32 or INT8 is still the converter's choice by speed on the
            # machine that runs the tests, and the tests hold for either.
            runtimes=("onnxruntime",),
        )
    )
    return {r.profile: Path(r.bundle) for r in results if r.bundle}


def _demo_profile(profile: Profile) -> Profile:
    """The profile with this host as its hardware (tests/support/host_cpu.py): the agents the tests start run on
    this CPU whatever profile they claim, so the bundle is judged and timed on it too. (An intel-x86-vnni INT8 bundle
    judged as a VNNI CPU computes it is rightly refused by a device whose CPU lacks VNNI: its fused kernels
    saturate.)

    EDGEFLEET_TEST_DEMO_PRECISION=int8-static (or fp32) restricts the demo profiles to that recipe, to run the
    suite here under the recipe another CPU picks (CI's has picked INT8 where this one picked FP32)."""
    profile = as_this_host(profile)
    forced = os.environ.get("EDGEFLEET_TEST_DEMO_PRECISION")
    if not forced:
        return profile
    targets = [t.model_copy(update={"precisions": [forced]}) for t in profile.targets]
    return profile.model_copy(update={"targets": targets})


@pytest.fixture
def host(mosquitto: MosquittoBroker) -> Iterator[Connection]:
    conn = Connection(mosquitto.url, f"test-host-{id(mosquitto)}-{Path.cwd().name}", protocol="auto").start()
    yield conn
    conn.stop()


@pytest.fixture
def topics() -> Topics:
    return Topics()


@pytest.fixture
def start_agent(tmp_path: Path, root_pub: Path, mosquitto: MosquittoBroker) -> Iterator[Callable[..., AgentProcess]]:
    """Start real agent subprocesses; every one still running is stopped at teardown."""
    started: list[AgentProcess] = []

    def start(device_id: str = "dev-1", **options: object) -> AgentProcess:
        options.setdefault("broker", mosquitto.url)
        options.setdefault("trust", root_pub)
        agent = AgentProcess(device_id, tmp_path / device_id, **options)  # type: ignore[arg-type]
        started.append(agent.start())
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
def watcher(host: Connection, topics: Topics) -> FleetWatcher:
    return FleetWatcher(host, topics)
