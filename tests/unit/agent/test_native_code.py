"""Every native library the agent hands a runtime is recorded: logged with its path, sha256 and bundle, and reported
in the device's status, whose `native_code` is left out while empty (control planes that predate it parse it)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from edgefleet.agent.runtime import native_code
from edgefleet.core.messages import DeviceStatus, decode


def test_a_native_library_handed_to_a_runtime_is_logged_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    library = tmp_path / "libops.so"
    library.write_bytes(b"\x7fELF not really")
    with caplog.at_level(logging.WARNING, logger="edgefleet.agent.runtime.native_code"):
        first = native_code.record(library, "custom-op library from the device's --custom-op-libs folders", "b-1")
        again = native_code.record(library, "custom-op library from the device's --custom-op-libs folders", "b-2")
    assert first.sha256 == hashlib.sha256(library.read_bytes()).hexdigest() and first.loads == 1
    assert again.loads == 2 and again.bundle_id == "b-2" and again.first_ts == first.first_ts
    assert again in native_code.loads()
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and all(str(library) in m and first.sha256 in m for m in logged)
    assert "for bundle b-1" in logged[0] and "for bundle b-2" in logged[1]


def test_the_status_reports_native_code_and_leaves_the_field_out_while_there_is_none(tmp_path: Path) -> None:
    plain = DeviceStatus(device_id="d", online=True, state="serving")
    assert "native_code" not in json.loads(plain.encode())  # what a control plane that predates the field reads
    library = tmp_path / "libother.so"
    library.write_bytes(b"code")
    entry = native_code.record(library, "custom-op library from the device's --custom-op-libs folders", "b-3")
    status = DeviceStatus(device_id="d", online=True, state="serving", native_code=[entry])
    parsed = decode(DeviceStatus, status.encode())
    assert parsed.native_code == [entry] and parsed.native_code[0].path == str(library.resolve())
