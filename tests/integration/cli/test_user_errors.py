"""Every error a user can cause is one line, `edgefleet: error: …`, that says what to do; never a traceback.

The sweep: the bad inputs users make (missing files, wrong paths, weights outside the model's folder, a file that
is not ONNX, data with the wrong keys, an unreachable broker, TLS files that do not fit, a missing key, unknown
names), for inspect, convert, bundle, keys, publish, deploy, rollout, init and context. It runs the real CLI
entry point in this process (one import for all cases), so any exception other than a clean exit fails the case
with its traceback, which is the defect this test exists to catch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgefleet.cli.main import main

from support.cli import said
from support.paths import REPO
from support.servers.brokers import free_port, mosquitto_binary

DEMO = REPO / "edgefleet" / "demo_assets"
MODEL, CALIB, EVAL = str(DEMO / "digits_cnn.onnx"), str(DEMO / "calib.npz"), str(DEMO / "eval.npz")


def _external_data_model(folder: Path) -> None:
    """model.onnx whose weights are ../elsewhere/w.bin (outside its folder), and one whose data file is gone."""
    (folder / "m").mkdir()
    (folder / "elsewhere").mkdir()
    weight = numpy_helper.from_array(np.ones((8, 8), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(folder / "m" / "tmp.onnx"), save_as_external_data=True, location="w.bin",
                    size_threshold=0)  # fmt: skip
    shutil.move(folder / "m" / "w.bin", folder / "elsewhere" / "w.bin")
    proto = onnx.load(str(folder / "m" / "tmp.onnx"), load_external_data=False)
    for location, name in (("../elsewhere/w.bin", "outside.onnx"), ("gone.bin", "no-data.onnx")):
        for entry in proto.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save_model(proto, str(folder / "m" / name))
    (folder / "m" / "tmp.onnx").unlink()


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    """Keys, bad files, and a secure broker `edgefleet init` wrote, running (for the TLS mistakes)."""
    with tempfile.TemporaryDirectory(prefix="edgefleet-user-errors-") as name:
        folder = Path(name)
        os.chmod(folder, 0o755)  # the broker user must pass it
        (folder / "not-onnx.onnx").write_text("this is not a model")
        _external_data_model(folder)
        np.savez(folder / "wrong-keys.npz", image=np.zeros((4, 1, 8, 8), np.float32))
        np.save(folder / "one-array.npy", np.zeros((4, 1, 8, 8), np.float32))
        port = free_port()
        env = {"EDGEFLEET_HOME": str(folder / "home"), "EDGEFLEET_CONFIG": str(folder / "none.toml")}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            assert main(["init", str(folder / "fleet"), "--port", str(port), "--no-context"]) == 0
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        broker = subprocess.Popen(
            [mosquitto_binary(), "-c", "mosquitto.conf"], cwd=folder / "fleet",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        (folder / "port").write_text(str(port))
        try:
            yield folder
        finally:
            broker.terminate()
            broker.wait(10)


def _pki(folder: Path, name: str) -> str:
    return str(folder / "fleet" / "pki" / name)


# (case id, argv with {w} for the workspace, {port} for the secure broker's, fragments the one line must hold)
CASES = [
    ("inspect: a missing file", ["inspect", "{w}/nothere.onnx"], ["not found"]),
    ("inspect: not ONNX", ["inspect", "{w}/not-onnx.onnx"], ["is not an ONNX model"]),
    ("inspect: weights outside the model's folder", ["inspect", "{w}/m/outside.onnx"],
     ["external data", "points outside", "model's folder"]),
    ("inspect: weights whose file is gone", ["inspect", "{w}/m/no-data.onnx"], ["external data", "gone.bin"]),
    ("inspect: an unknown profile", ["inspect", MODEL, "--profile", "nope"], ["unknown profile 'nope'", "valid:"]),
    ("convert: no bundle key", ["convert", MODEL, "--profile", "generic-x86-64", "--calib", CALIB, "--eval", EVAL,
                                "--out", "{w}/out", "--key", "{w}/nokey.key"], ["keys init", "--key"]),
    ("convert: weights outside the model's folder", ["convert", "{w}/m/outside.onnx", "--profile", "generic-x86-64",
     "--calib", CALIB, "--eval", EVAL, "--out", "{w}/out", "--key", "{w}/fleet/keys/bundle.key"], ["external data"]),
    ("convert: data with the wrong keys", ["convert", MODEL, "--profile", "generic-x86-64", "--calib",
     "{w}/wrong-keys.npz", "--eval", EVAL, "--out", "{w}/out", "--key", "{w}/fleet/keys/bundle.key"],
     ["lacks model input(s) ['input']", "it has ['image']"]),
    ("convert: one .npy array, not an .npz", ["convert", MODEL, "--profile", "generic-x86-64", "--calib",
     "{w}/one-array.npy", "--eval", EVAL, "--out", "{w}/out", "--key", "{w}/fleet/keys/bundle.key"],
     ["one array (.npy)", "np.savez(FILE, input=...)"]),
    ("convert: data that is no .npz at all", ["convert", MODEL, "--profile", "generic-x86-64", "--calib",
     "{w}/not-onnx.onnx", "--eval", EVAL, "--out", "{w}/out", "--key", "{w}/fleet/keys/bundle.key"],
     ["not a readable .npz"]),
    ("convert: a missing data file", ["convert", MODEL, "--profile", "generic-x86-64", "--calib", "{w}/no.npz",
     "--eval", EVAL, "--out", "{w}/out", "--key", "{w}/fleet/keys/bundle.key"], ["calibration file", "not found"]),
    ("convert: an output folder that cannot be made", ["convert", MODEL, "--profile", "generic-x86-64", "--calib",
     CALIB, "--eval", EVAL, "--out", "{w}/not-onnx.onnx/out", "--key", "{w}/fleet/keys/bundle.key"],
     ["not-onnx.onnx/out", "check the path"]),
    ("bundle show: a missing file", ["bundle", "show", "{w}/nothere.bundle"], ["not found"]),
    ("bundle verify: not a bundle", ["bundle", "verify", "{w}/not-onnx.onnx", "--trust", "{w}/fleet/keys"],
     ["not a readable bundle"]),
    ("bundle verify: no trusted key", ["bundle", "verify", "{w}/not-onnx.onnx", "--trust", "{w}/none.pub"],
     ["no trusted key", "--trust"]),
    ("keys show: no keys", ["keys", "show", "--dir", "{w}/empty-keys"], ["no keys in", "keys init"]),
    ("keys rotate: no key to rotate", ["keys", "rotate", "--role", "bundle", "--dir", "{w}/empty-keys"],
     ["no bundle key"]),
    ("keys server: no CA", ["keys", "server", "--dir", "{w}/no-ca", "--host", "broker"], ["no CA", "keys ca"]),
    ("keys enroll: an unreachable broker", ["keys", "enroll", "dev-9", "--broker", "mqtt://127.0.0.1:{free}"],
     ["cannot connect to the MQTT broker"]),
    ("publish: a missing bundle", ["publish", "{w}/nothere.bundle"], ["nothere.bundle not found"]),
    ("deploy: no target", ["deploy", "{w}/nothere.bundle"], ["--device or --group"]),
    ("deploy: not a bundle", ["deploy", "{w}/not-onnx.onnx", "--group", "lab"], ["not a readable bundle"]),
    ("fleet status: an unreachable broker", ["fleet", "status", "--broker", "mqtt://127.0.0.1:{free}"],
     ["cannot connect to the MQTT broker at mqtt://127.0.0.1:"]),
    ("fleet status: a broker URL that is not MQTT", ["fleet", "status", "--broker", "http://x"],
     ["invalid broker URL", "mqtts://"]),
    ("fleet status: TLS without a CA", ["fleet", "status", "--broker", "mqtts://127.0.0.1:{port}"],
     ["no CA certificate", "--ca"]),
    ("fleet status: a CA file that is not there", ["fleet", "status", "--broker", "mqtts://127.0.0.1:{port}",
     "--ca", "{w}/nothere.crt"], ["--ca", "no such file"]),
    ("fleet status: a key that is not the certificate's", ["fleet", "status", "--broker",
     "mqtts://127.0.0.1:{port}", "--ca", "{ca}", "--cert", "{cli_crt}", "--key", "{host_key}"],
     ["cannot use the TLS files", "KEY_VALUES_MISMATCH"]),
    ("fleet status: a certificate without its key", ["fleet", "status", "--broker", "mqtts://127.0.0.1:{port}",
     "--ca", "{ca}", "--cert", "{cli_crt}"], ["--cert and --key go together"]),
    ("fleet status: plain MQTT to the TLS listener", ["fleet", "status", "--broker", "mqtt://127.0.0.1:{port}"],
     ["within 10 s", "mqtts://"]),
    ("rollout start: not a bundle", ["rollout", "start", "{w}/not-onnx.onnx", "--group", "lab", "--store",
     "sqlite:///{w}/store.sqlite"], ["not a readable bundle"]),
    ("rollout abort: an unknown rollout", ["rollout", "abort", "nope", "--store", "sqlite:///{w}/store.sqlite"],
     ["unknown rollout 'nope'"]),
    ("context use: an unknown context", ["context", "use", "nope"], ["unknown context 'nope'"]),
    ("--context: an unknown context", ["--context", "nope", "fleet", "status"], ["unknown context 'nope'"]),
    ("init: a directory with files in it", ["init", "{w}/m"], ["already exists and is not empty"]),
    ("init: a device id that is no topic level", ["init", "{w}/new", "--device", "a/b"], ["device id"]),
    ("a missing argument", ["convert", MODEL], ["the following arguments are required", "--help"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_user_error_is_one_line_that_says_what_to_do(
    argv: list[str], fragments: list[str], workspace: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for name in [k for k in os.environ if k.startswith("EDGEFLEET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EDGEFLEET_HOME", str(workspace / "home"))
    monkeypatch.setenv("EDGEFLEET_CONFIG", str(workspace / "none.toml"))
    values = {
        "w": str(workspace), "port": (workspace / "port").read_text(), "free": str(free_port()),
        "ca": _pki(workspace, "ca.crt"), "cli_crt": _pki(workspace, "edgefleet-cli.crt"),
        "host_key": _pki(workspace, "edgefleet-host.key"),
    }  # fmt: skip
    capsys.readouterr()
    try:
        code = main([arg.format(**values) for arg in argv])
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    err = capsys.readouterr().err
    lines = said(err)  # the progress lines a conversion printed before it failed are not the error
    assert code not in (0, None), err
    assert len(lines) == 1 and lines[0].startswith("edgefleet: error: "), err
    for fragment in fragments:
        assert fragment.format(**values) in lines[0], lines[0]
