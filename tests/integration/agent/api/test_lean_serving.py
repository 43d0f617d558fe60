"""A process that serves a model over HTTP loads only what serving needs: with the provider decision cached, the
MQTT client, TLS, the bundle's signature crypto, the telemetry spool's SQLite, the transfer room and the runtime
that was not chosen stay unimported (each is imported on first use by the daemon paths that need it). Real
processes, a real bundle, a real request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.runtime import unpack

REPO = Path(__file__).resolve().parents[4]
NOT_TO_SERVE = ("paho", "ssl", "cryptography", "sqlite3", "zstandard", "openvino", "edgefleet.agent.transfer",
                "edgefleet.agent.runtime.benchmark", "edgefleet.core.mqtt.connection",
                "edgefleet.agent.quality.monitor", "edgefleet.agent.telemetry.spool")  # fmt: skip

SERVE = """
import json, socket, sys
from pathlib import Path
from edgefleet.agent.api import InferenceService, ServiceConfig
from edgefleet.agent.runtime import LoadedModel, Policy
from edgefleet.core.bundle.archive import parse_manifest
d = Path(sys.argv[1]); m = parse_manifest((d / "manifest.json").read_text())
m = m.model_copy(update={"providers": ["CPUExecutionProvider", "openvino:CPU"]})
model = LoadedModel(d, m, 1, cache_dir=Path(sys.argv[2]), policy=Policy(measure_in_worker=True))
assert model.check_golden().passed
spec = m.inputs[0]
shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
count = 1
for d in shape:
    count *= d
with InferenceService([model], ServiceConfig(port=0)) as svc:
    body = json.dumps({"inputs": [{"name": spec.name, "datatype": "FP32", "shape": shape,
                                   "data": [0.0] * count}]}).encode()
    with socket.create_connection(("127.0.0.1", svc.port)) as sock:
        sock.sendall(b"POST /v2/models/digits-cnn/infer HTTP/1.1\\r\\nHost: [::1]\\r\\nConnection: close\\r\\n"
                     b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
print(json.dumps({"status": answer.split()[1].decode(), "provider": model.provider,
                  "modules": sorted(sys.modules)}))
"""


def _serve(bundle: Path, cache: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SERVE, str(bundle), str(cache)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_serving_with_a_cached_decision_imports_no_mqtt_tls_crypto_or_unchosen_runtime(
    demo_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, _ = unpack(demo_bundles["intel-x86-vnni"], keys[1], tmp_path / "bundle")
    cache = tmp_path / "cache"
    first = _serve(bundle, cache)  # cold: the measuring worker decides (OpenVINO is imported there, not here)
    assert first["status"] == "200"
    restarted = _serve(bundle, cache)  # an agent's restart: the decision is read from the cache
    assert restarted["status"] == "200" and restarted["provider"] == first["provider"]
    modules = restarted["modules"]
    assert isinstance(modules, list)
    loaded = [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_TO_SERVE)]
    if str(first["provider"]).startswith("openvino"):  # OpenVINO was chosen on this machine: it is needed
        loaded = [m for m in loaded if not m.startswith("openvino")]
    assert loaded == [], loaded


def test_the_names_imported_on_first_use_are_the_same_objects() -> None:
    from edgefleet.agent import api, quality, runtime, telemetry
    from edgefleet.agent.api.generation.mqtt import MqttGeneration
    from edgefleet.agent.api.mqtt import MqttInference
    from edgefleet.agent.quality.monitor import Quality
    from edgefleet.agent.runtime.benchmark import BenchmarkService
    from edgefleet.agent.telemetry.reporter import Reporter

    assert api.MqttInference is MqttInference and api.MqttGeneration is MqttGeneration
    assert quality.Quality is Quality and runtime.BenchmarkService is BenchmarkService
    assert telemetry.Reporter is Reporter
    with pytest.raises(AttributeError):
        api.NoSuchName  # noqa: B018
