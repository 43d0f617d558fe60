"""A device's byte-rate cap holds within 10 % over 30 s: a real agent process, real Mosquitto, signed desired state.

The rate is what the agent itself counted (bundle bytes received, on its own monotonic clock, in telemetry), over
the longest stretch of the download its reports cover, at least 30 s of it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgefleet.control.credentials.keyring import HostKeys
from edgefleet.control.desired.signing import publish_desired
from edgefleet.control.publish.publisher import publish_bundle
from edgefleet.core.messages import Desired, Telemetry
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher, padded_bundle

CONFIG_CAP = 1_000_000  # the agent's own configuration
DESIRED_CAP = 300_000  # the signed desired state's: the smaller one is in force
SPAN_S = 30.0


def _capped_stretch(samples: list[Telemetry], total: int) -> tuple[Telemetry, Telemetry] | None:
    """The first report with bundle bytes counted and the last one before the download completed, if they span
    at least SPAN_S of the agent's clock (None: not yet)."""
    during = [t for t in samples if t.link and 0 < t.link.bulk_bytes < total]
    if len(during) < 2:
        return None
    first, last = during[0], during[-1]
    assert first.link is not None and last.link is not None
    return (first, last) if last.link.clock_s - first.link.clock_s >= SPAN_S else None


@pytest.mark.slow
@pytest.mark.serial  # a rate within 10 % of the cap: a starved agent would fall below it, not above
def test_a_devices_cap_from_signed_desired_state_holds_within_ten_percent_over_thirty_seconds(
    start_agent: Callable[..., AgentProcess], host: Connection, topics: Topics, watcher: FleetWatcher,
    demo_bundles: dict[str, Path], signing_key: SigningKey, keys: tuple[Path, Path], tmp_path: Path,
) -> None:  # fmt: skip
    agent = start_agent("dev-capped", extra=("--max-bytes-per-s", str(CONFIG_CAP)), telemetry_interval=1.0)
    watcher.wait_for("the agent online", lambda: watcher.status.get("dev-capped"), timeout=60)
    # 40 s of bytes at the cap: the download outlasts the 30 s measured.
    bundle = padded_bundle(demo_bundles["intel-x86-vnni"], tmp_path, signing_key, TrustedKeys.load([keys[1]]),
                           version="2", pad_bytes=int(DESIRED_CAP * (SPAN_S + 10)))  # fmt: skip
    manifest, offer = publish_bundle(host, topics, bundle, block_size=64 * 1024)
    desired = Desired(
        bundle_id=manifest.bundle_id, model_name=manifest.model_name, model_version=manifest.model_version,
        profile=manifest.profile, max_bytes_per_s=DESIRED_CAP,
    )  # fmt: skip
    publish_desired(host, topics, HostKeys.default(), desired, device="dev-capped", wait=30)

    total = offer.transfer.size
    device_reports = lambda: [t for t in watcher.telemetry if t.device_id == "dev-capped"]  # noqa: E731
    first, last = watcher.wait_for(
        "30 s of the capped download in the agent's reports",
        lambda: _capped_stretch(device_reports(), total),
        timeout=(SPAN_S + 10) * 4,  # a loaded machine may run the agent slower than the cap: it then fails below
    )
    assert first.link is not None and last.link is not None
    assert last.link.cap_bytes_per_s == DESIRED_CAP, "the smaller of configuration and desired state is in force"
    achieved = (last.link.bulk_bytes - first.link.bulk_bytes) / (last.link.clock_s - first.link.clock_s)
    assert abs(achieved - DESIRED_CAP) <= 0.10 * DESIRED_CAP, f"{achieved:.0f} B/s against a cap of {DESIRED_CAP}"
    # Reports kept flowing while the capped download used the link: they go first.
    between = [t for t in device_reports() if t.link and first.link.clock_s <= t.link.clock_s <= last.link.clock_s]
    assert len(between) >= SPAN_S / 2, f"only {len(between)} telemetry reports in {SPAN_S:g} s of download"
    watcher.serving("dev-capped", manifest.bundle_id, timeout=120)
    assert agent.alive
