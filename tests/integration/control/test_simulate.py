"""The simulated fleet itself, where a test relies on it: a killed device is dead for good."""

from __future__ import annotations

import threading
import time
import uuid

from edgefleet.core.messages import DeviceStatus, decode
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.rollouts.control_plane import sim_fleet, wait_until
from support.servers.brokers import MosquittoBroker
from support.simulate.device import RECONNECT_S


def test_a_killed_device_stays_dead_even_with_a_report_queued_when_it_died(
    mosquitto: MosquittoBroker, host: Connection
) -> None:
    device_id = f"sim-killed-{uuid.uuid4().hex[:8]}"  # a fresh one: no retained status from an earlier run
    seen: list[bool] = []  # its statuses as the broker delivers them: online or not
    host.subscribe(Topics().status(device_id), lambda _t, data, _r: seen.append(decode(DeviceStatus, data).online))
    with sim_fleet(mosquitto.url, [device_id]) as sims:
        wait_until("its online status", lambda: seen == [True])
        device = sims.devices[device_id]
        # One step of the fleet's loop: a telemetry tick queues a report, and the device dies before it is written.
        sims.call(lambda: (device.telemetry(0.25), sims.kill(device_id)))
        wait_until("its last will", lambda: seen == [True, False])
        past_reconnect = threading.Event()  # the loop's own clock: past the time a lost connection is retried
        sims.call(lambda: sims.schedule(time.monotonic() + RECONNECT_S[1] + 1.0, past_reconnect.set))
        assert past_reconnect.wait(30), "the fleet's loop stopped"
        stats = sims.snapshot()
        assert (stats["connects"], stats["disconnects"]) == (1, 0), "it never saw a lost connection to retry"
        assert seen == [True, False], "nothing after its last will"
