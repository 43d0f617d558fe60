"""An ARM64 device end to end: the agent installed from the project's wheel in a Debian arm64 root, run under QEMU
user emulation (scripts/arm64-root), on the shipped secure Mosquitto configuration with its own certificate.

Given no --profile, it detects generic-arm64 from what the emulated CPU and the machine say, and its status says
why the Raspberry Pi and Jetson profiles do not fit; it takes a bundle the converter built on this host for
generic-arm64, verifies it, passes its golden set on ONNX Runtime's aarch64 kernels and commits; its Open Inference
Protocol answers match the x86 build's within the bundle's tolerance; it reports telemetry; a build whose outputs
leave its golden set is refused while it keeps serving, and a committed build that fails its health check is rolled
back. Emulated, every instruction is slow: timings here mean nothing, function and numerics do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgefleet.control.publish.publisher import deploy, publish_bundle
from edgefleet.control.rights.deploy import grant_deploy
from edgefleet.core.bundle.archive import describe_files, pack_bundle, unpack_bundle
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.quality.golden import compare
from edgefleet.core.quality.golden_set import GoldenSet
from edgefleet.core.tensors import Dataset
from edgefleet.core.topics import HOST_IDENTITY, Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.arm64 import Arm64Root, build_root
from support.fleet import AgentProcess, FleetWatcher, derive_bundle
from support.paths import DIGITS, REPO, TESTS
from support.rollouts.agents import less_accurate_bundle
from support.runtime import golden
from support.servers.brokers import free_port
from support.servers.secure_broker import SecureBroker, make_pki
from support.slots import slot_of

DEVICE = "arm64-1"
TOPICS = Topics()
EMULATED_S = 600.0  # an install, a golden check or a start-up under emulation, on a loaded 2-core machine
OIP_SAMPLES = 16
QUANTIZED_OPS = {
    "QLinearConv",
    "ConvInteger",
    "QLinearMatMul",
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "QuantizeLinear",
}


@pytest.fixture(scope="module")
def arm64() -> Arm64Root:
    root = build_root()
    print(root.build_log.strip())
    return root


@pytest.fixture(scope="module")
def arm_bundle(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> Path:
    """The digits CNN converted on this x86 host for generic-arm64 (judged here by proxy, as for any device)."""
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    (result,) = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("generic-arm64")], calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz", out=tmp_path_factory.mktemp("arm-bundles"), key=signing_key,
            name="digits-cnn", version="1", report=False,
        )
    )  # fmt: skip
    assert result.bundle, result.error
    return Path(result.bundle)


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    pki = make_pki(tmp_path / "pki", [DEVICE])
    with SecureBroker(pki, {DEVICE: []}) as broker:  # base rights: bundles are granted as `deploy` grants them
        yield broker


def _deploy(host: Connection, bundle: Path) -> str:
    """Publish, grant the device its rights to read it, set it desired: what `edgefleet deploy --device` does."""
    manifest, _ = publish_bundle(host, TOPICS, bundle)
    grant_deploy(host, TOPICS, manifest.bundle_id, devices=[DEVICE])
    deploy(host, TOPICS, manifest, devices=[DEVICE], groups=[])
    return manifest.bundle_id


def _outside_its_golden_set(source: Path, out: Path, key: SigningKey, trusted: TrustedKeys) -> Path:
    """A build whose classes 0-4 come out rotated (support/rollouts/agents.py) shipped with the source's golden set
    and floor: its outputs leave the golden set, as a broken build's do."""
    rotated = less_accurate_bundle(source, out, key, trusted, version="2")
    unpacked, original = out / "rotated-src", out / "original-src"
    manifest = unpack_bundle(rotated, unpacked, trusted)
    source_manifest = unpack_bundle(source, original, trusted)
    shutil.copyfile(original / source_manifest.golden.path, unpacked / manifest.golden.path)
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    updated = manifest.model_copy(update={
        "golden": source_manifest.golden, "bundle_id": f"{source_manifest.bundle_id}-outside-golden",
        "files": describe_files(sources),
    })  # fmt: skip
    path = out / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


def _oip_infer(port: int, model: str, sample: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "input", "shape": list(sample.shape), "datatype": "FP32",
                        "data": sample.ravel().tolist()}]}  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{model}/infer", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as answer:
        (output,) = json.load(answer)["outputs"]
    return np.array(output["data"], np.float32).reshape(output["shape"])


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the fixture builds a cold root (249 s here, at a load of 12); cached, it takes 42 s
def test_an_arm64_device_detects_its_profile_installs_serves_reports_and_rolls_back(
    arm64: Arm64Root, arm_bundle: Path, secure: SecureBroker, tmp_path: Path, keys: tuple[Path, Path],
    root_pub: Path, signing_key: SigningKey,
) -> None:  # fmt: skip
    trusted = TrustedKeys.load([keys[1]])
    device_dir = tmp_path / "device"  # bound into the root at the same path: the agent's state, keys, certificates
    device_dir.mkdir()
    trust = device_dir / "root.pub"
    shutil.copyfile(root_pub, trust)
    tls = secure.pki.tls(DEVICE)
    certs = {name: device_dir / Path(str(path)).name for name, path in (("ca", tls.ca), ("cert", tls.cert),
                                                                        ("key", tls.key))}  # fmt: skip
    for name, path in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)):
        shutil.copyfile(str(path), certs[name])

    # Which kernels ONNX Runtime runs here, and what the emulated CPU claims (QEMU's default CPU: dot product, i8mm).
    v1_dir = tmp_path / "v1"
    v1_manifest = unpack_bundle(arm_bundle, v1_dir, trusted)
    probe = arm64.run(
        [str(TESTS / "support" / "clients" / "arm64_kernels.py"), str(v1_dir / v1_manifest.model_path), str(tmp_path)],
        tmp_path, TESTS,
    )  # fmt: skip
    kernels = json.loads(probe.stdout.strip().splitlines()[-1])
    print(f"arm64 kernels ({v1_manifest.recipe.precision} build): {kernels}")
    assert kernels["machine"] == "aarch64" and {"asimd", "asimddp"} <= set(kernels["hwcaps"])
    assert kernels["ops"] and all(op.endswith("@CPUExecutionProvider") for op in kernels["ops"])
    if v1_manifest.recipe.precision.startswith("int8"):
        assert QUANTIZED_OPS & {op.split("@")[0] for op in kernels["ops"]}, kernels["ops"]

    # The profiles' int8_fast_with against what the CPU claims: a Cortex-A72 (ARMv8.0) has no dot product.
    a72 = arm64.run(["-m", "edgefleet", "profiles", "detect", "--json"], env={"QEMU_CPU": "cortex-a72"})
    verdicts = {v["profile"]: v for v in json.loads(a72.stdout)["verdicts"]}
    assert json.loads(a72.stdout)["best"] == "generic-arm64"
    assert "none of asimddp" in verdicts["generic-arm64"]["notes"][0], verdicts["generic-arm64"]

    host = secure.connect(HOST_IDENTITY)
    watcher = FleetWatcher(host, TOPICS)
    port = free_port()
    agent = AgentProcess(
        DEVICE, device_dir / "state", broker=secure.url, trust=trust, profile=None,
        python=arm64.python(device_dir, env={"PYTHONUNBUFFERED": "1"}),
        extra=("--ca", str(certs["ca"]), "--cert", str(certs["cert"]), "--key", str(certs["key"]),
               "--http-port", str(port), "--health-interval", "2"),
    ).start()  # fmt: skip
    try:
        status = watcher.wait_for(
            f"{DEVICE} online", lambda: s if (s := watcher.status.get(DEVICE)) and s.online else None, EMULATED_S
        )
        assert status.hardware is not None and status.hardware.arch == "aarch64"
        assert status.profile == "generic-arm64" and status.accepts_profiles == ["generic-arm64"]
        reasons = status.profile_detection
        assert reasons[0] == "generic-arm64 matches: arch aarch64|arm64, os linux", reasons
        assert "rpi5-arm64 does not: board 'unknown' is none of ['Raspberry Pi 5']" in reasons
        assert any(r.startswith("jetson-orin-nano does not: missing /etc/nv_tegra_release") for r in reasons)
        assert not any("INT8" in r for r in reasons), "the emulated CPU has the dot product generic-arm64's INT8 wants"

        v1 = _deploy(host, arm_bundle)
        status = watcher.serving(DEVICE, v1, timeout=EMULATED_S)
        assert slot_of(status).provider_in_use == "CPUExecutionProvider" and slot_of(status).verified
        # The commit's event is spooled after the slot serves (agent/install/commit_notice.py): it may follow the
        # status, most of all under emulation.
        watcher.event(DEVICE, "committed", bundle_id=v1, timeout=EMULATED_S)
        kinds = [e.kind for e in watcher.events if e.device_id == DEVICE and e.bundle_id == v1]
        assert {"verified", "installed", "committed"} <= set(kinds), kinds

        # OIP answers on the golden inputs, judged against the x86 build's outputs by the bundle's own rule.
        golden_set = golden(v1_dir, v1_manifest)
        (name,) = golden_set.expected
        samples = golden_set.inputs.inputs["input"][:OIP_SAMPLES]
        answers = np.stack([_oip_infer(port, v1_manifest.model_name, s) for s in samples])
        x86 = GoldenSet(
            Dataset({"input": samples}, None), {name: golden_set.reference[name][:OIP_SAMPLES]},
            {name: golden_set.expected[name][:OIP_SAMPLES]},
        )  # fmt: skip
        verdict = compare({name: answers}, x86, v1_manifest.golden)
        difference = float(np.max(np.abs(answers - x86.expected[name])))
        print(f"arm64 vs x86 on {OIP_SAMPLES} golden inputs: max |diff| {difference:.3g} "
              f"(tolerance {v1_manifest.golden.max_abs_error:.3g}), agreement {verdict.agreement:.3f}")  # fmt: skip
        assert verdict.passed, verdict
        assert np.array_equal(answers.argmax(-1), x86.expected[name].argmax(-1))

        report = watcher.wait_for(
            "telemetry covering the OIP requests",
            lambda: next((t for t in watcher.telemetry if t.device_id == DEVICE and t.latency.count >= 1), None),
            timeout=EMULATED_S,
        )  # fmt: skip
        assert report.provider == "CPUExecutionProvider" and report.golden_agreement == 1.0 and report.rss_mb > 0

        # A build whose outputs leave its golden set: refused on the device, which keeps serving v1.
        broken = _deploy(host, _outside_its_golden_set(arm_bundle, tmp_path / "broken", signing_key, trusted))
        refused = watcher.event(DEVICE, "refused", bundle_id=broken, timeout=EMULATED_S)
        assert "golden" in refused.detail, refused.detail
        assert slot_of(watcher.status[DEVICE]).active_bundle == v1 and agent.alive

        # A committed build whose files rot on the device's disk fails its health check and is rolled back to v1.
        v3 = _deploy(host, derive_bundle(arm_bundle, tmp_path, signing_key, trusted, model_version="3"))
        watcher.serving(DEVICE, v3, timeout=EMULATED_S)
        model_file = agent.state_dir / "bundles" / v3 / v1_manifest.model_path
        model_file.write_bytes(model_file.read_bytes()[:-10])
        watcher.event(DEVICE, "rolled-back", bundle_id=v3, timeout=EMULATED_S)
        watcher.serving(DEVICE, v1, timeout=EMULATED_S)
    except AssertionError:
        print(agent.log()[-6000:])
        raise
    finally:
        agent.stop()
        host.stop()


@pytest.mark.slow
def test_python_3_10_on_aarch64_gets_a_wheel_for_every_compiled_dependency(tmp_path: Path) -> None:
    """JetPack 6's Python is 3.10, and no aarch64 CPython 3.10 comes from the package registries this project reaches
    (Debian's arm64 root has 3.11; Ubuntu's ports archive, python-build-standalone and conda are not reachable), so
    the agent is not run on it here. What covers it: scripts/test-installed-agent runs the agent tests on Python 3.10
    (x86), the test above runs the agent on aarch64 (3.11), and this resolves the device install as pip on a Jetson
    resolves it, for (aarch64, CPython 3.10): every dependency with compiled code has a manylinux aarch64 wheel."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path), str(REPO)],
        check=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("edgefleet-*.whl")
    cert = ("--cert", os.environ["PIP_CERT"]) if os.environ.get("PIP_CERT") else ()
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", *cert, "--quiet", "--dry-run", "--ignore-installed",
         "--report", str(report), "--target", str(tmp_path / "target"), "--only-binary=:all:",
         "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64", "--python-version", "3.10",
         "--implementation", "cp", f"{wheel}[cpu]"],
        check=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    files = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["download_info"]["url"].rsplit("/", 1)[-1]
             for i in json.loads(report.read_text())["install"]}  # fmt: skip
    print("aarch64, CPython 3.10:", ", ".join(sorted(files.values())))
    assert {"onnxruntime", "numpy", "cryptography", "pydantic-core", "zstandard", "psutil"} <= set(files)
    compiled = {name: file for name, file in files.items() if not file.endswith("-none-any.whl")}
    for name, file in compiled.items():
        assert "aarch64" in file and ("-cp310-" in file or "-abi3-" in file), f"{name}: {file}"
