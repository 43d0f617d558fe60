"""Hostile strings from a compromised device reach neither the operator's terminal nor the dashboard as anything but
inert, capped text. The device publishes a status (its own, retained) and an event whose OS name, last error,
state-adjacent fields and detail hold rich markup that crashed `fleet status` (`[/x]`), terminal escape sequences
(clear screen, set the window title, OSC 8 links), bidi overrides, and 20,000 characters. Then `fleet status`,
`fleet watch`, `devices list`, `devices show` (real subprocesses) and the dashboard's JSON API show them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from edgefleet.control.dashboard.app import DASHBOARD_TEXT_LIMIT
from edgefleet.control.dashboard.auth import issue_token
from edgefleet.core.messages import DeviceStatus, Event, Hardware, SlotStatus
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.untrusted import MAX_SHOWN, safe_text

from support.attacks.ledger import AttackLedger
from support.rollouts.control_plane import control_plane, wait_until
from support.servers.brokers import MosquittoBroker

DEVICE = "dev-hostile"
TOPICS = Topics()
ESC = "\x1b"
HOSTILE = (
    "[/x] [bold red]owned[/] \x1b[2J\x1b]0;pwned\x07 \x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\ "
    "\u202eevil\u202c \r\x00overwrite" + "A" * 20_000
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "edgefleet", *args], capture_output=True, text=True, timeout=120, env=env
    )


def _inert(text: str) -> list[str]:
    """What is wrong with `text` as operator output: escape or control characters, bidi overrides, long lines."""
    problems = []
    if ESC in text or "\x07" in text or "\x00" in text or "\r" in text:
        problems.append("control characters")
    if "\u202e" in text:
        problems.append("bidi override")
    if "A" * (DASHBOARD_TEXT_LIMIT + 1) in text:  # the CLI caps at MAX_SHOWN (200), the dashboard at 500
        problems.append("uncapped string")
    return problems


@pytest.mark.slow
def test_hostile_device_strings_are_inert_in_the_cli_and_dashboard(
    mosquitto: MosquittoBroker, tmp_path: Path, attack_ledger: AttackLedger
) -> None:
    device = Connection(mosquitto.url, DEVICE, protocol="5").start()
    # An identifier that breaks its grammar (a hostname) refuses the whole status at ingest (admission.py); free
    # text is stored, cut, and must be inert wherever it is shown.
    refused = Hardware(arch="x86_64", os="Linux", cpu_count=2, memory_mb=1024, hostname=HOSTILE)
    hardware = refused.model_copy(update={"hostname": "hostile-host", "os": HOSTILE})
    # The slot's free text too (its last error shorter, so the status stays under ingest's 64 KiB a message).
    status = DeviceStatus(
        device_id=DEVICE, online=True, state="serving", profile="generic-x86-64", hardware=hardware,
        last_error=HOSTILE,
        slots=[SlotStatus(slot="default", state="serving", last_error=HOSTILE[:1000], provider_summary=HOSTILE,
                          active_model=HOSTILE[:300])],
    )  # fmt: skip
    try:
        with control_plane(mosquitto.url, tmp_path, http_port=0) as plane:
            assert plane.ingestor is not None
            bad = status.model_copy(update={"hardware": refused})
            device.publish(TOPICS.status(DEVICE), bad.encode(), qos=1, retain=True, wait=10)
            wait_until("the hostile hostname refused", lambda: plane.ingestor.stats.counts["invalid"] >= 1)
            assert plane.store.device(DEVICE) is None
            device.publish(TOPICS.status(DEVICE), status.encode(), qos=1, retain=True, wait=10)
            wait_until("the hostile status stored", lambda: plane.store.device(DEVICE))
            store = f"sqlite://{tmp_path}/control.sqlite"
            watch = subprocess.Popen(
                [sys.executable, "-m", "edgefleet", "fleet", "watch", "--broker", mosquitto.url, "--count", "2",
                 "--interval", "3"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"},
            )  # fmt: skip
            event = Event(device_id=DEVICE, kind="error", detail=HOSTILE).encode()
            deadline = time.monotonic() + 120
            while watch.poll() is None and time.monotonic() < deadline:  # events are live: repeat until it listens
                device.publish(TOPICS.events(DEVICE), event, qos=1, wait=10)
                time.sleep(0.3)
            watched_out, watched_err = watch.communicate(timeout=30)
            results = {
                "fleet status": _cli("fleet", "status", "--broker", mosquitto.url, "--wait", "1"),
                "devices list": _cli("devices", "list", "--store", store),
                "devices show": _cli("devices", "show", DEVICE, "--store", store),
                "fleet watch": subprocess.CompletedProcess([], watch.returncode, watched_out, watched_err),
            }
            assert plane.dashboard_url is not None
            token = issue_token(plane.store, "attack-test")  # the dashboard's API needs a token
            request = urllib.request.Request(
                plane.dashboard_url + "api/fleet", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                api = response.read().decode()
    finally:
        device.publish(TOPICS.status(DEVICE), b"", qos=1, retain=True, wait=10)
        device.stop()

    problems = {}
    for name, result in results.items():
        if result.returncode != 0 or "Traceback" in result.stderr:
            problems[name] = f"exit {result.returncode}: {result.stderr[-500:]}"
        elif _inert(result.stdout):
            problems[name] = ", ".join(_inert(result.stdout))
        elif "[/x]" not in result.stdout and name != "devices list":
            problems[name] = "the markup was not shown literally"
    row = next(d for d in json.loads(api)["devices"] if d["device_id"] == DEVICE)
    if _inert(json.dumps(row, ensure_ascii=False)) or len(row["last_error"]) > 500:
        problems["dashboard API"] = ", ".join(_inert(json.dumps(row, ensure_ascii=False))) or "uncapped"
    assert f"{DEVICE} error" in results["fleet watch"].stdout, results["fleet watch"].stdout[-2000:]
    assert not attack_ledger.record(
        "hostile device strings (rich markup, escape sequences, bidi, 20k chars) in the CLI and dashboard",
        bool(problems),
        f"{', '.join(results)} and the dashboard API: "
        + ("; ".join(f"{k}: {v}" for k, v in problems.items()) if problems else "all exit 0, inert, capped"),
    )


def test_safe_text_is_one_capped_printable_line() -> None:
    shown = safe_text(HOSTILE)
    assert len(shown) == MAX_SHOWN and shown.endswith("…")
    assert not _inert(shown) and "[/x]" in shown
    assert safe_text(None) == "" and safe_text(3.5) == "3.5" and safe_text("ok") == "ok"
    assert safe_text("a\tb\nc") == "a\ufffdb\ufffdc"
