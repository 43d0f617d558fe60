"""Several models on one device, one per slot, on real agent processes and a real Mosquitto (agent/daemon/slots.py):
each slot installs, checks, commits or refuses on its own while the others keep answering; tritonclient lists and
calls every slot's model; MQTT inference is addressed by slot; a slot that does not fit the memory budget is refused
before any block is fetched; a signed removal unloads a slot; a single-model agent's state dir keeps serving.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.core.bundle.archive import (
    describe_files,
    pack_bundle,
    parse_manifest,
    read_signed_manifest,
    unpack_bundle,
)
from edgefleet.core.messages import DeviceStatus, InferResponse
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, deploy_to, derive_bundle, padded_bundle
from support.models.generative import TinylmBundles
from support.publishing.desired import deploy_slot
from support.servers.brokers import free_port
from support.slots import slot_of

pytestmark = pytest.mark.slow

StartAgent = Callable[..., AgentProcess]
SAMPLE = {"input": np.zeros((1, 1, 8, 8), np.float32)}


def wrong_golden_bundle(source: Path, out: Path, key: SigningKey, trusted: TrustedKeys, version: str) -> Path:
    """A re-signed copy of `source` whose golden set no longer matches its model: it fails the check on a device."""
    unpacked = out / f"wrong-golden-src-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    golden = unpacked / manifest.golden.path
    with np.load(golden) as data:
        arrays = {k: (v + 3.0 if v.dtype.kind == "f" else v) for k, v in data.items()}
    np.savez(golden, **arrays)  # type: ignore[arg-type]
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    updated = manifest.model_copy(update={
        "model_version": version, "bundle_id": f"{manifest.bundle_id}-wrong-golden", "files": describe_files(sources),
    })  # fmt: skip
    path = out / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


def infer_mqtt(host: Connection, topics: Topics, device: str, slot: str | None) -> InferResponse:
    remote = RemoteModel(host, topics, device, slot=slot)
    try:
        (answer,) = remote.infer_many([SAMPLE], timeout=30)
        return answer
    finally:
        remote.close()


class Hammer:
    """Keeps calling one model over OIP (tritonclient) on a thread; counts answers and errors."""

    def __init__(self, url: str, model: str) -> None:
        self.client, self.model = triton.InferenceServerClient(url), model
        self.answers = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        feed = triton.InferInput("input", [1, 1, 8, 8], "FP32")
        feed.set_data_from_numpy(SAMPLE["input"])
        while not self._stop.is_set():
            try:
                result = self.client.infer(self.model, [feed])
                assert result.as_numpy("logits").shape == (1, 10)
                self.answers += 1
            except Exception as err:  # every failure is a disturbance this test looks for
                self.errors.append(f"{type(err).__name__}: {err}")
            time.sleep(0.01)

    def __enter__(self) -> Hammer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_two_slots_serve_side_by_side_and_a_failing_install_in_one_never_disturbs_the_other(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    device, port = "dev-slots", free_port()
    agent = start_agent(device, extra=("--http-port", str(port), "--probe-rate", "0"))
    digits = demo_bundles["intel-x86-vnni"]
    reader = derive_bundle(digits, tmp_path, signing_key, trusted, model_name="digits-reader")
    a = deploy_to(host, topics, digits, devices=(device,), slot="detector", slot_class="real-time")
    b = deploy_to(host, topics, reader, devices=(device,), slot="reader")
    watcher.serving(device, a, slot="detector", timeout=90)
    status = watcher.serving(device, b, slot="reader", timeout=90)
    assert [s.slot for s in status.slots] == ["detector", "reader"] and status.state == "serving"
    assert (
        slot_of(status, "detector").slot_class == "real-time" and slot_of(status, "reader").slot_class == "interactive"
    )
    # A new class for a served slot needs no new bundle: the agent re-assigns its model and its status says so.
    reader_manifest = parse_manifest(read_signed_manifest(reader).manifest_json)
    deploy_slot(host, topics, reader_manifest, slot="reader", devices=(device,), slot_class="batch")
    status = watcher.wait_for(
        "the reader's new class in the status",
        lambda: slot_of(watcher.status.get(device), "reader").slot_class == "batch" and watcher.status[device],
    )
    assert slot_of(status, "reader").active_bundle == b and slot_of(status, "detector").slot_class == "real-time"
    second = slot_of(status, "reader")
    assert status.memory_free_mb is not None and second.memory_mb is not None and second.memory_mb >= 0
    assert second.placement is not None and second.placement.threads == 1  # the agent's --threads 1

    url = f"127.0.0.1:{port}"
    client = triton.InferenceServerClient(url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["digits-cnn"]["state"] == "READY" and index["digits-reader"]["state"] == "READY"
    assert index["digits-cnn"]["slot"] == "detector" and index["digits-reader"]["slot"] == "reader"
    for name in ("digits-cnn", "digits-reader", "detector", "reader"):  # a slot's model name, or the slot's own
        assert client.is_model_ready(name), name

    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    assert 'model="digits-cnn",provider="CPUExecutionProvider",slot="detector"' in metrics
    assert 'model="digits-reader",provider="CPUExecutionProvider",slot="reader"' in metrics

    several = infer_mqtt(host, topics, device, None)
    assert not several.ok and "several slots (detector, reader)" in (several.error or "")
    answered = infer_mqtt(host, topics, device, "reader")
    assert answered.ok and answered.bundle_id == b

    broken = wrong_golden_bundle(reader, tmp_path, signing_key, trusted, version="9")
    with Hammer(url, "digits-cnn") as hammer:
        bad = deploy_to(host, topics, broken, devices=(device,), slot="reader")
        refused = watcher.event(device, "refused", bundle_id=bad, timeout=90)
        answers_during = hammer.answers
        deadline = time.monotonic() + 30
        while hammer.answers < answers_during + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert refused.slot == "reader" and "golden" in refused.detail, refused.detail
    assert hammer.errors == [] and hammer.answers >= answers_during + 20  # slot detector never missed a request
    # The scheduler ran every request as a step of the detector's slot and accounts queue and compute time for it.
    timed = watcher.wait_for(
        "the detector's scheduling figures",
        lambda: next((t for t in watcher.telemetry if t.device_id == device and t.slot == "detector" and t.scheduling
                      and t.scheduling.compute_ms and t.scheduling.compute_ms.count > 0), None),
    )  # fmt: skip
    assert timed.scheduling is not None and timed.scheduling.queue_ms is not None
    assert timed.scheduling.compute_ms is not None and timed.scheduling.compute_ms.count <= timed.requests + 64
    status = watcher.serving(device, b, slot="reader")  # the refused install left the slot on what it ran
    assert slot_of(status, "detector").active_bundle == a and slot_of(status, "reader").last_error
    assert agent.alive

    deploy_slot(host, topics, None, slot="reader", devices=(device,), remove=True)
    removed = watcher.event(device, "removed", timeout=30)
    assert removed.slot == "reader" and b in removed.detail
    watcher.wait_for("the reader slot gone", lambda: [s.slot for s in watcher.status[device].slots] == ["detector"])
    assert not client.is_model_ready("digits-reader") and client.is_model_ready("digits-cnn")
    assert not (agent.state_dir / "bundles" / b).exists() and (agent.state_dir / "bundles" / a).exists()
    alone = infer_mqtt(host, topics, device, None)  # one slot left: a request naming none goes to it
    assert alone.ok and alone.bundle_id == a


def _placed(watcher: FleetWatcher, device: str, threads: int) -> DeviceStatus | None:
    """The device's status once its detector slot runs with `threads` intra-op threads."""
    status = watcher.status.get(device)
    placement = slot_of(status, "detector").placement
    return status if placement is not None and placement.threads == threads else None


def test_a_slot_that_arrives_takes_its_share_of_the_cores_and_the_loaded_one_reloads_without_an_error(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    device, port = "dev-share", free_port()
    agent = start_agent(device, extra=("--http-port", str(port), "--probe-rate", "0", "--threads", "0"))
    share = max(1, (os.cpu_count() or 1) // 2)  # two slots share this machine's cores
    digits = demo_bundles["intel-x86-vnni"]
    a = deploy_to(host, topics, digits, devices=(device,), slot="detector")
    alone = slot_of(watcher.serving(device, a, slot="detector", timeout=90), "detector")
    assert alone.placement is not None and alone.placement.threads == 0, "alone: the runtime's default"
    # The status can arrive before the install's own `committed` event (another topic): wait for that event, so that
    # what follows the marker is the reload's alone (a full run once saw the install's event after it).
    watcher.event(device, "committed", bundle_id=a, timeout=30)
    marker = len(watcher.events)

    reader = derive_bundle(digits, tmp_path, signing_key, trusted, model_name="digits-reader")
    with Hammer(f"127.0.0.1:{port}", "digits-cnn") as hammer:
        b = deploy_to(host, topics, reader, devices=(device,), slot="reader")
        watcher.serving(device, b, slot="reader", timeout=90)
        shared = watcher.wait_for("the detector reloaded with its share", lambda: _placed(watcher, device, share))
        time.sleep(0.5)  # calls on the reloaded session too
    assert hammer.errors == [] and hammer.answers > 10, (hammer.errors[:3], hammer.answers)
    detector = slot_of(shared, "detector")
    assert detector.active_bundle == a and detector.verified and "2 slots share them" in detector.placement.summary
    assert slot_of(shared, "reader").placement.threads == share
    assert [e.kind for e in watcher.events[marker:] if e.slot == "detector"] == [], "a reload, not an install"
    assert agent.alive


def test_an_over_budget_slot_is_refused_before_any_block_and_the_others_keep_serving(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys,
) -> None:  # fmt: skip
    device, port = "dev-budget", free_port()
    start_agent(device, extra=("--http-port", str(port), "--probe-rate", "0", "--memory-budget-mb", "15"))
    digits = demo_bundles["intel-x86-vnni"]
    a = deploy_to(host, topics, digits, devices=(device,), slot="detector")
    watcher.serving(device, a, slot="detector", timeout=90)

    def bundle_bytes(after: float) -> int | None:
        """The bundle bytes the device received since it started, as its first report after `after` says."""
        reports = [t for t in watcher.telemetry if t.device_id == device and t.ts > after and t.link is not None]
        return reports[0].link.bulk_bytes if reports and reports[0].link is not None else None

    installed = time.time()
    before = watcher.wait_for("a report after the detector's install", lambda: bundle_bytes(installed))
    big = padded_bundle(digits, tmp_path, signing_key, trusted, version="5", pad_bytes=2_000_000)
    big = derive_bundle(big, tmp_path, signing_key, trusted, model_name="assistant")
    b = deploy_to(host, topics, big, devices=(device,), slot="assistant")
    refused = watcher.event(device, "refused", bundle_id=b, timeout=60)
    assert refused.slot == "assistant"
    # The demo bundle records its measured peak (Manifest.resources, about 11 MB), and so does its padded copy: the
    # detector fits a 15 MB budget, the assistant does not beside it (the files-x2 fallback: test_memory_budget.py).
    assert "assistant needs 1" in refused.detail and "MB free after detector" in refused.detail, refused.detail
    assert "budget 15 MB" in refused.detail
    kinds = [e.kind for e in watcher.events if e.device_id == device and e.bundle_id == b]
    assert "download-started" not in kinds and "downloaded" not in kinds, kinds  # not one block asked for
    after = watcher.wait_for("a report after the refusal", lambda: bundle_bytes(refused.ts + 0.5))
    assert after == before, f"{after - before} bundle bytes fetched for a refused slot"
    downloads = tmp_path / device / "slots" / "assistant" / "downloads"
    assert not any(downloads.iterdir()) and not (tmp_path / device / "bundles" / b).exists()
    status = watcher.wait_for(
        "the refusal in the status",
        lambda: slot_of(watcher.status.get(device), "assistant").refused and watcher.status[device],
    )
    assert slot_of(status, "detector").active_bundle == a and slot_of(status, "detector").state == "serving"
    index = {e["name"]: e for e in triton.InferenceServerClient(f"127.0.0.1:{port}").get_model_repository_index()}
    assert index["assistant"]["state"] == "UNAVAILABLE" and "assistant needs 1" in index["assistant"]["reason"]
    assert index["digits-cnn"]["state"] == "READY"


def test_a_single_model_agents_state_dir_keeps_serving_in_the_default_slot_without_a_download(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
) -> None:  # fmt: skip
    device = "dev-upgrade"
    agent = start_agent(device)
    bundle = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=(device,))
    watcher.serving(device, bundle)
    agent.stop()
    # The layout a single-model agent wrote (agent/install/store.py before slots): the slot's files at the top, the
    # desired document at trust/desired/device.json, counters keyed by target alone.
    root = agent.state_dir
    slot_dir = root / "slots" / "default"
    for name in ("state.json", "floor.json", "floor_holders.json"):
        os.replace(slot_dir / name, root / name)
    (slot_dir / "current").unlink()
    os.symlink(Path("bundles") / bundle, root / "current")
    shutil.rmtree(root / "slots")
    os.replace(root / "trust" / "desired" / "default" / "device.json", root / "trust" / "desired" / "device.json")
    (root / "trust" / "desired" / "default").rmdir()
    counters = json.loads((root / "trust" / "counters.json").read_text())
    (root / "trust" / "counters.json").write_text(json.dumps({k.split("@")[0]: v for k, v in counters.items()}))
    floor = json.loads((root / "floor.json").read_text())
    seen = len(watcher.events)

    agent.start()  # the upgraded agent on the old directory
    status = watcher.wait_for(
        "the upgraded agent serving",
        lambda: (st := watcher.status.get(device)) and st.online and slot_of(st).active_bundle == bundle and st,
        timeout=60,
    )
    assert [s.slot for s in status.slots] == ["default"] and slot_of(status).verified
    time.sleep(2)  # long enough for a reconcile after the retained document arrives again
    later = [e.kind for e in watcher.events[seen:] if e.device_id == device]
    assert not {"desired", "download-started", "refused"} & set(later), later
    assert json.loads((root / "slots" / "default" / "floor.json").read_text()) == floor
    assert not (root / "state.json").exists() and (root / "slots" / "default" / "current").resolve().name == bundle


@pytest.fixture(scope="module")
def encoder_bundle(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> Path:
    """The small sentence encoder (tests/support/models/encoder.py) converted for this host, FP32 on ONNX Runtime."""
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    from support.host_cpu import as_this_host
    from support.models import encoder

    root = tmp_path_factory.mktemp("encoder")
    model = encoder.export(root / "encoder.onnx")
    np.savez(root / "calib.npz", **encoder.sentences(16, seed=1))
    np.savez(root / "eval.npz", **encoder.sentences(16, seed=2))
    profile = as_this_host(get_profile("intel-x86-vnni"))
    targets = [t.model_copy(update={"precisions": ["fp32"]}) for t in profile.targets if t.runtime == "onnxruntime"]
    (result,) = convert(
        ConvertRequest(
            model=model, profiles=[profile.model_copy(update={"targets": targets})], calib=root / "calib.npz",
            eval=root / "eval.npz", out=root, key=signing_key, name="sentence-encoder", version="1", threads=2,
            runtimes=("onnxruntime",),
        )
    )  # fmt: skip
    assert result.bundle, result.error
    return Path(str(result.bundle))


@pytest.mark.timeout(900)  # the session's tinylm and encoder conversions come first
def test_tritonclient_and_the_openai_client_work_unchanged_against_a_device_serving_three_models(
    start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    encoder_bundle: Path, tinylm_bundles: TinylmBundles,
) -> None:  # fmt: skip
    import openai

    from support.models import encoder

    device, port = "dev-three", free_port()
    start_agent(device, extra=("--http-port", str(port), "--probe-rate", "0", "--generation-concurrency", "1"))
    detector = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=(device,), slot="detector")
    embedder = deploy_to(host, topics, encoder_bundle, devices=(device,), slot="embedder")
    assistant = deploy_to(host, topics, tinylm_bundles["generic-x86-64"], devices=(device,), slot="assistant")
    for slot, bundle in (("detector", detector), ("embedder", embedder), ("assistant", assistant)):
        status = watcher.serving(device, bundle, slot=slot, timeout=180)
    assert [s.slot for s in status.slots] == ["assistant", "detector", "embedder"]

    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    index = {e["name"]: e["state"] for e in client.get_model_repository_index()}
    assert index == {"digits-cnn": "READY", "sentence-encoder": "READY", "tinylm": "READY"}
    digits = triton.InferInput("input", [1, 1, 8, 8], "FP32")
    digits.set_data_from_numpy(SAMPLE["input"])
    assert client.infer("digits-cnn", [digits]).as_numpy("logits").shape == (1, 10)
    sentence = {k: v[0] for k, v in encoder.sentences(1, seed=5).items()}
    feeds = []
    for name, value in sentence.items():
        feeds.append(triton.InferInput(name, list(value.shape), "INT64"))
        feeds[-1].set_data_from_numpy(value)
    embedding = client.infer("embedder", feeds).as_numpy("sentence_embedding")  # by slot name
    assert embedding.shape == (1, encoder.HIDDEN) and abs(float(np.linalg.norm(embedding)) - 1.0) < 1e-3

    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in api.models.list()] == ["tinylm"]  # the generative slot
    pieces = [c.choices[0].text for c in api.completions.create(model="tinylm", prompt="import os\n", max_tokens=12,
                                                                  stream=True)]  # fmt: skip
    assert len(pieces) >= 2 and "".join(pieces)
    assert client.infer("digits-cnn", [digits]).as_numpy("logits").shape == (1, 10)  # still answering

    def per_slot() -> set[str] | None:
        slots = {t.slot for t in watcher.telemetry if t.device_id == device and t.bundle_id}
        return slots if slots >= {"assistant", "detector", "embedder"} else None

    watcher.wait_for("one telemetry report per slot", per_slot, timeout=30)
