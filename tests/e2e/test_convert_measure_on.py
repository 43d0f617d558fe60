"""`edgefleet convert --measure-on`: real agent processes on a real Mosquitto measure each profile's candidates, and
the conversion chooses by their figures and records where and when they were measured."""

from __future__ import annotations

import json
import signal
import statistics
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgefleet.control.farm.service import FleetFarm
from edgefleet.converter import ConvertRequest, ProfileResult, convert
from edgefleet.core.bundle.archive import verify_bundle
from edgefleet.core.bundle.manifest import FarmReport, Manifest
from edgefleet.core.farm_messages import FarmAnswer
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import get_profile
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher
from support.paths import DIGITS
from support.servers.brokers import MosquittoBroker
from support.slots import slot_of

StartAgent = Callable[..., AgentProcess]


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the conversions here: the second one reuses the first one's builds."""
    return tmp_path_factory.mktemp("convert-cache")


def _convert(out: Path, key: SigningKey, cache: Path, profiles: Sequence[str], farm: FleetFarm) -> list[ProfileResult]:
    request = ConvertRequest(
        model=DIGITS / "digits_cnn.onnx", profiles=[get_profile(p) for p in profiles], calib=DIGITS / "calib.npz",
        eval=DIGITS / "eval.npz", out=out, key=key, name="digits-cnn", version="1", runtimes=("onnxruntime",),
        cache_dir=cache,
    )  # fmt: skip
    return convert(request, farm=farm)


def _online(watcher: FleetWatcher, *devices: str) -> None:
    for device in devices:
        watcher.wait_for(
            f"{device} online", lambda d=device: (s := watcher.status.get(d)) is not None and s.online, timeout=60
        )


def _manifest(result: ProfileResult, keys: tuple[Path, Path]) -> Manifest:
    assert result.bundle, result.error
    return verify_bundle(Path(result.bundle), TrustedKeys.load([keys[1]]))


@pytest.mark.slow
def test_each_profiles_recipe_is_chosen_by_what_its_own_devices_measured(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, tmp_path: Path,
    signing_key: SigningKey, keys: tuple[Path, Path], build_cache: Path,
) -> None:  # fmt: skip
    # Two VNNI devices that differ in threads, and a Raspberry Pi 5 (a profile this host cannot time), one group.
    start_agent("lab-vnni-1", groups=("lab",))  # --threads 1
    start_agent("lab-vnni-2", groups=("lab",), extra=("--threads", "2"))
    start_agent("lab-pi", groups=("lab",), profile="rpi5-arm64")
    _online(watcher, "lab-vnni-1", "lab-vnni-2", "lab-pi")
    started = datetime.now(timezone.utc) - timedelta(seconds=1)
    # A control plane that follows the statuses already (here the watcher, on the same connection) hands them over.
    farm = FleetFarm(host, topics, "lab", timeout_s=240, calls=20, rounds=3, statuses=lambda: dict(watcher.status))
    vnni, pi = _convert(tmp_path / "out", signing_key, build_cache, ["intel-x86-vnni", "rpi5-arm64"], farm)

    for result, devices in ((vnni, {"lab-vnni-1": 1, "lab-vnni-2": 2}), (pi, {"lab-pi": 1})):
        manifest = _manifest(result, keys)
        assert manifest.farm is not None and result.farm is not None, result.notes
        farm_report = FarmReport.model_validate(result.farm)
        assert farm_report == manifest.farm and not manifest.benchmark_only
        # Where and when: every device of the profile in the group, with its own threads and provider, just now.
        assert {d.device_id: d.threads for d in manifest.farm.devices} == devices
        for measured in manifest.farm.devices:
            assert measured.provider == "CPUExecutionProvider" and 0 < measured.cpu_share <= 0.5
            assert started <= measured.measured_at <= datetime.now(timezone.utc)
            assert measured.p50_ms is not None and measured.load_ms is not None
        # The choice is the fastest candidate by the devices' figures: the median over devices of their p50.
        figures = manifest.farm.latency_ms
        assert len(figures) >= 1 and result.recipe == min(figures, key=lambda name: figures[name])
        assert figures[result.recipe] == pytest.approx(statistics.median(d.p50_ms for d in manifest.farm.devices))  # type: ignore[misc]
        assert manifest.latency is not None and manifest.latency.median_ms == figures[result.recipe]
        assert manifest.latency.machine.startswith("devices ") and "lab-" in manifest.latency.machine
        assert manifest.search is not None and manifest.search.latency_ms[result.recipe] == figures[result.recipe]
        assert result.measured and any(n.startswith(f"devices: chose {result.recipe}") for n in result.notes)

    # The Pi's candidates went only to the Pi, the VNNI ones only to the VNNI devices (a Pi does not run them).
    assert any("lab-pi runs rpi5-arm64, not intel-x86-vnni: not asked" in n for n in vnni.notes)
    # This host cannot time the Pi's recipes: without the devices it would pick by the profile's order, unmeasured.
    assert any("latency not measured" in n for n in pi.notes)
    report = json.loads((tmp_path / "out" / "digits-cnn-1.report.json").read_text())
    assert [p["farm"]["devices"][0]["device_id"] for p in report["profiles"]][1] == "lab-pi"
    page = (tmp_path / "out" / "digits-cnn-1.report.html").read_text()
    assert "measured on the devices: median over the devices" in page and "<td>lab-vnni-2</td>" in page
    # Candidates are measured, never installed.
    for device in ("lab-vnni-1", "lab-vnni-2", "lab-pi"):
        assert slot_of(watcher.status[device]).active_bundle is None


class _SilencedFarm(FleetFarm):
    """The real farm, with its device stopped (SIGSTOP) just before it is asked: online on the broker, silent."""

    def __init__(self, agent: AgentProcess, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.agent = agent

    def measure(self, profile: str, bundles: Sequence[Path], progress: Callable[[str], None]) -> FarmAnswer:
        assert self.agent.proc is not None
        self.agent.proc.send_signal(signal.SIGSTOP)
        try:
            return super().measure(profile, bundles, progress)
        finally:
            self.agent.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def quiet_agent(start_agent: StartAgent) -> Iterator[AgentProcess]:
    agent = start_agent("lab-quiet")
    yield agent
    if agent.proc is not None and agent.proc.poll() is None:
        agent.proc.send_signal(signal.SIGCONT)


@pytest.mark.slow
def test_a_silent_device_leaves_the_profile_on_local_timing_and_is_named(
    quiet_agent: AgentProcess, mosquitto: MosquittoBroker, topics: Topics, watcher: FleetWatcher, tmp_path: Path,
    signing_key: SigningKey, keys: tuple[Path, Path], build_cache: Path,
) -> None:  # fmt: skip
    _online(watcher, "lab-quiet")
    # A connection of its own, as `edgefleet convert --measure-on` has: the farm follows the statuses itself.
    conn = Connection(mosquitto.url, "test-farm-quiet").start()
    try:
        farm = _SilencedFarm(quiet_agent, conn, topics, "lab-quiet", timeout_s=3, calls=5, rounds=1)
        (result,) = _convert(tmp_path / "out", signing_key, build_cache, ["generic-x86-64"], farm)
    finally:
        conn.stop()
    manifest = _manifest(result, keys)
    assert result.farm is None and manifest.farm is None
    assert "devices: no answer in time from lab-quiet" in result.notes
    assert any("no device answered in time" in n and "this host's timing" in n for n in result.notes)
    # The local choice stands, timed on this host.
    assert manifest.latency is not None and not manifest.latency.machine.startswith("devices")
    assert result.recipe == min(
        (c for c in result.candidates if not c.get("rejected")), key=lambda c: c["latency_ms"]
    )["name"]  # fmt: skip


@pytest.mark.slow
def test_an_unknown_device_or_group_fails_before_the_conversion_starts(
    mosquitto: MosquittoBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgefleet.cli.main import main

    data = ("--calib", str(DIGITS / "calib.npz"), "--eval", str(DIGITS / "eval.npz"))
    code = main(
        ["convert", str(DIGITS / "digits_cnn.onnx"), "--profile", "intel-x86-vnni", *data, "--out",
         str(tmp_path / "out"), "--measure-on", "no-such-lab", "--broker", mosquitto.url]
    )  # fmt: skip
    assert code == 1
    assert "--measure-on no-such-lab: no device has that id" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing was converted


@pytest.mark.slow
def test_a_control_plane_measures_on_a_group_of_its_registry(
    start_agent: StartAgent, mosquitto: MosquittoBroker, tmp_path: Path, signing_key: SigningKey,
    keys: tuple[Path, Path], build_cache: Path,
) -> None:  # fmt: skip
    from edgefleet.control.fleet.registry import enrolment_labels
    from edgefleet.control.store import GroupDef

    from support.rollouts.control_plane import control_plane, wait_until

    start_agent("reg-bench-1")  # no agent-side group: only the host registry puts it in "bench"
    start_agent("reg-other")
    with control_plane(mosquitto.url, tmp_path) as plane:
        store = plane.store
        wait_until("both agents in the store", lambda: {"reg-bench-1", "reg-other"} <= store.device_ids(), 60)
        store.set_labels("reg-bench-1", enrolment_labels("intel-x86-vnni", []))
        store.put_group(GroupDef("bench", devices=("reg-bench-1",)))
        farm = FleetFarm.of_control_plane(plane, "bench", timeout_s=120, calls=10, rounds=2)
        (result,) = _convert(tmp_path / "out", signing_key, build_cache, ["generic-x86-64"], farm)
    manifest = _manifest(result, keys)
    assert manifest.farm is not None, result.notes
    assert [d.device_id for d in manifest.farm.devices] == ["reg-bench-1"]  # the group's member, not the other one
    assert result.recipe == min(manifest.farm.latency_ms, key=lambda name: manifest.farm.latency_ms[name])  # type: ignore[union-attr]
