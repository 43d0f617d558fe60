"""The command line: data as tables or --json, and bad input as one line, a non-zero exit, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from support.cli import PROGRESS, assert_one_line_error, edgefleet
from support.paths import DIGITS


def test_profiles_list_as_json() -> None:
    result = edgefleet("profiles", "list", "--json")
    assert result.returncode == 0
    assert {"intel-x86-vnni", "generic-x86-64"} <= {p["name"] for p in json.loads(result.stdout)}


def test_profiles_detect_picks_this_machine() -> None:
    result = edgefleet("profiles", "detect", "--json")
    report = json.loads(result.stdout)
    assert report["best"] in ("intel-x86-vnni", "generic-x86-64")


def test_an_unknown_profile_names_the_valid_ones() -> None:
    assert_one_line_error(edgefleet("profiles", "show", "jetson-nope"), "unknown profile", "intel-x86-vnni")


@pytest.mark.slow
def test_keys_then_convert_then_verify(tmp_path: Path) -> None:
    assert edgefleet("keys", "generate", home=tmp_path).returncode == 0
    out = tmp_path / "out"
    result = edgefleet(
        "convert", str(DIGITS / "digits_cnn.onnx"), "--profile", "generic-x86-64", "--calib",
        str(DIGITS / "calib.npz"), "--eval", str(DIGITS / "eval.npz"), "--out", str(out), "--json", home=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (profile,) = json.loads(result.stdout)["profiles"]
    assert profile["accuracy"] >= 0.95 and profile["latency_ms"] > 0
    # stderr is no terminal here: the progress is lines as it goes, never a bar that prints only at the end
    progress = [line for line in result.stderr.splitlines() if PROGRESS.match(line)]
    assert any("generic-x86-64" in line for line in progress), result.stderr
    assert all(c["rejected"] for c in profile["candidates"] if c["name"] != profile["recipe"])
    verified = edgefleet("bundle", "verify", profile["bundle"], "--json", home=tmp_path)
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True
    shown = edgefleet("bundle", "show", profile["bundle"], "--json")
    assert json.loads(shown.stdout)["manifest"]["profile"] == "generic-x86-64"


def test_convert_refuses_a_file_that_is_not_onnx(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    bogus = tmp_path / "notes.onnx"
    bogus.write_text("these are my notes, not a model")
    result = edgefleet(
        "convert", str(bogus), "--profile", "generic-x86-64", "--calib", str(DIGITS / "calib.npz"),
        "--eval", str(DIGITS / "eval.npz"), "--out", str(tmp_path / "out"), "--key", str(keys[0]),
    )  # fmt: skip
    assert_one_line_error(result, "is not an ONNX model")
    assert not (tmp_path / "out").exists()


def test_convert_refuses_calibration_data_without_the_model_input(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, image=np.zeros((3, 1, 1, 8, 8), np.float32))
    result = edgefleet(
        "convert", str(DIGITS / "digits_cnn.onnx"), "--profile", "generic-x86-64", "--calib", str(calib),
        "--eval", str(DIGITS / "eval.npz"), "--out", str(tmp_path / "out"), "--key", str(keys[0]),
    )  # fmt: skip
    assert_one_line_error(result, "lacks model input(s) ['input']")


def test_convert_refuses_an_unknown_profile(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    result = edgefleet(
        "convert", str(DIGITS / "digits_cnn.onnx"), "--profile", "tpu-9000", "--calib", str(DIGITS / "calib.npz"),
        "--eval", str(DIGITS / "eval.npz"), "--out", str(tmp_path / "out"), "--key", str(keys[0]),
    )  # fmt: skip
    assert_one_line_error(result, "unknown profile 'tpu-9000'", "generic-x86-64")


def test_a_bundle_signed_by_another_key_fails_verification(tmp_path: Path, demo_bundles: dict[str, Path]) -> None:
    assert edgefleet("keys", "generate", "--dir", str(tmp_path), "--name", "stranger").returncode == 0
    result = edgefleet("bundle", "verify", str(demo_bundles["generic-x86-64"]), "--trust", str(tmp_path))
    assert_one_line_error(result, "untrusted key")


@pytest.mark.parametrize("command", [["fleet", "status"], ["publish", "x.bundle"]])
def test_an_unreachable_broker_is_one_clear_line(command: list[str], tmp_path: Path) -> None:
    from support.servers.brokers import free_port

    bundle = tmp_path / "x.bundle"
    bundle.write_bytes(b"")
    args = [a if a != "x.bundle" else str(bundle) for a in command]
    result = edgefleet(*args, "--broker", f"mqtt://127.0.0.1:{free_port()}")
    assert_one_line_error(result)
