"""Simulated agents: real MQTT clients speaking the agent's protocol, hundreds per process on one thread.

`SimFleet` drives N `SimDevice`s (simulate_device.py), each its own paho client (own connection, client id
and last will), from one `selectors` loop (`loop_read`/`loop_write`/`loop_misc`, no thread per client), and
ticks each device's telemetry every interval. With `resend` (a `ResendPolicy`, spool.py) each device spools its
reports until the control plane says they are stored and re-sends the gaps, as the agent does; each tick also
flushes the spool (the agent's flush thread wakes at least once a second: keep `telemetry_interval` at 1 s or less
for its re-send timing). What the devices do is set by the scenario
(simulate_scenario.py: `Behavior`, `synthetic_bundle`; simulate_quality.py: quality figures).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import queue
import random
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import paho.mqtt.client as paho

from edgefleet.core.messages import Hardware
from edgefleet.core.mqtt.connection import BrokerAddress
from edgefleet.core.topics import Topics

from support.simulate.device import SimDevice, SimSettings, SimStats
from support.simulate.scenario import Behavior, BundleBehavior, Neighbour, synthetic_bundle
from support.simulate.spool import ResendPolicy

log = logging.getLogger(__name__)


class SimFleet:
    """N simulated devices on one thread. Start, let it run, read `stats`, stop."""

    def __init__(
        self,
        broker: str,
        device_ids: Sequence[str],
        *,
        profile: str = "generic-x86-64",
        groups: Sequence[str] = (),
        prefix: str = "edgefleet/v1",
        telemetry_interval: float = 1.0,
        protocol: str = "3.1.1",
        behavior: Behavior | None = None,
        block_window: int = 16,
        connect_per_tick: int = 50,
        resend: ResendPolicy | None = None,
    ) -> None:
        self.address = BrokerAddress.parse(broker)
        self.settings = SimSettings(
            topics=Topics(prefix),
            protocol=paho.MQTTv5 if protocol == "5" else paho.MQTTv311,
            hardware=Hardware(arch="x86_64", os="linux", cpu_count=4, memory_mb=4096, hostname=socket.gethostname()),
            block_window=block_window,
            raw_prefix="bench/raw/",
            resend=resend,
        )
        self.telemetry_interval = telemetry_interval
        self.behavior = behavior or Behavior()
        self.connect_per_tick = connect_per_tick
        self.stats = SimStats()
        self.commits: list[tuple[str, str, float]] = []
        self.stopping = False
        self.quiet = False  # no more telemetry (stopping: waiting for the last acknowledgements)
        self._selector = selectors.DefaultSelector()
        self._writers: set[paho.Client] = set()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = 0
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[Any]]] = queue.SimpleQueue()
        self.devices = {d: SimDevice(self, d, profile, groups) for d in device_ids}
        self._to_connect = list(self.devices.values())
        self._thread = threading.Thread(target=self._loop, name="sim-fleet", daemon=True)
        self._stopped = threading.Event()

    # --- control from other threads
    def start(self) -> SimFleet:
        self._thread.start()
        return self

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run `fn` on the loop thread (paho clients are not thread-safe) and return its result. On the loop
        thread itself (inside another `call`) it runs `fn` at once."""
        if threading.current_thread() is self._thread:
            return fn()
        box: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._calls.put((fn, box))
        ok, value = box.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def wait_connected(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(d.connected for d in self.devices.values()):
                return True
            time.sleep(0.05)
        return False

    def snapshot(self) -> dict[str, Any]:
        return dict(self.call(self.stats.as_dict))

    def kill(self, device_id: str) -> None:
        """Drop a device's connection without DISCONNECT: the broker publishes its last will. The device is dead
        for good: what it had queued is never written and it never reconnects."""

        def drop() -> None:
            device = self.devices.pop(device_id)
            sock = device.die()
            # A packet it queued (a report a tick sent just before) would be written to the closed socket: paho
            # would report a lost connection and the device would reconnect, online again, after its will.
            self._writers.discard(device.client)
            if sock is not None:
                self._forget(sock)
                sock.close()

        self.call(drop)

    def raw_subscribe(self, tag: str, device_ids: Sequence[str] | None = None) -> None:
        """Subscribe devices to a plain topic whose bytes are only counted (a raw bandwidth baseline)."""

        def sub() -> None:
            for device_id in device_ids if device_ids is not None else list(self.devices):
                if device_id in self.devices:
                    self.devices[device_id].client.subscribe(self.settings.raw_prefix + tag, 1)

        self.call(sub)

    def in_flight(self) -> int:
        return int(self.call(lambda: sum(len(d.pending_acks) for d in self.devices.values())))

    def spooled(self) -> dict[str, int]:
        """What the devices' spools hold now: reports (`depth`), of them never taken by the broker (`unsent`),
        telemetry reports (`telemetry`), and reports their spools dropped so far (`dropped`)."""

        def count() -> dict[str, int]:
            spools = [d.spool for d in self.devices.values() if d.spool is not None]
            return {
                "depth": sum(s.depth() for s in spools),
                "unsent": sum(len(s.unsent()) for s in spools),
                "telemetry": sum(len(s.spooled("telemetry")) for s in spools),
                "dropped": sum(s.dropped for s in spools),
            }

        return dict(self.call(count))

    def spooled_telemetry(self) -> dict[str, list[int]]:
        """device id → seqs of the telemetry reports still in its spool (not yet acknowledged as stored)."""
        return dict(self.call(lambda: {d.device_id: d.spool.spooled("telemetry") for d in self.devices.values()
                                       if d.spool is not None}))  # fmt: skip

    def quiet_down(self) -> None:
        """No more new reports; the spools keep re-sending until the control plane stored what they hold."""
        self.call(lambda: setattr(self, "quiet", True))

    def acked_telemetry(self) -> dict[str, list[int]]:
        """device id → seqs of the reports the broker acknowledged (what must reach the store)."""
        return dict(self.call(lambda: {d.device_id: list(d.acked_telemetry) for d in self.devices.values()}))

    def stop(self, graceful: bool = True, drain_s: float = 5.0) -> None:
        """Stop sending telemetry, wait for the broker to acknowledge what is in flight, then disconnect
        (graceful: with an offline status first; otherwise the last will says it)."""
        if not self._thread.is_alive():
            return
        self.call(lambda: setattr(self, "quiet", True))
        deadline = time.monotonic() + drain_s
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.02)

        def halt() -> None:
            self.stopping = True
            if graceful:
                for device in self.devices.values():
                    device.say_offline()

        if self._thread.is_alive():
            self.call(halt)
            self._stopped.wait(10)

    # --- what a device sees of the fleet (SimHost)
    def schedule(self, due: float, fn: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (due, self._timer_seq, fn))

    def watch(self, client: paho.Client) -> None:
        client.on_socket_open = self._socket_open
        client.on_socket_close = self._socket_close
        client.on_socket_register_write = self._want_write
        client.on_socket_unregister_write = self._done_writing

    def committed(self, device_id: str, bundle_id: str) -> None:
        self.commits.append((device_id, bundle_id, time.time()))

    # --- the loop

    def _socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._forget(sock)
        self._writers.discard(client)

    def _forget(self, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _want_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._writers.add(client)

    def _done_writing(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._writers.discard(client)

    def _connect_some(self) -> None:
        for _ in range(min(self.connect_per_tick, len(self._to_connect))):
            device = self._to_connect.pop(0)
            try:
                device.client.connect(self.address.host, self.address.port, keepalive=60)
            except OSError as err:
                log.warning("sim %s cannot connect: %s; retrying", device.device_id, err)
                self.schedule(time.monotonic() + 1.0, functools.partial(self._to_connect.append, device))
                continue
            phase = random.random() * self.telemetry_interval
            self.schedule(time.monotonic() + self.telemetry_interval + phase, functools.partial(self._tick, device))

    def _tick(self, device: SimDevice) -> None:
        if self.stopping or device.device_id not in self.devices:
            return
        device.telemetry(self.telemetry_interval)
        if self.quiet:
            device.flush()  # no new report to wake the spool: its re-sends go on (the agent's 1 s wake-up)
        self.schedule(time.monotonic() + self.telemetry_interval, functools.partial(self._tick, device))

    def _loop(self) -> None:
        last_misc = time.monotonic()
        stop_at: float | None = None
        try:
            while True:
                while not self._calls.empty():
                    fn, box = self._calls.get()
                    try:
                        box.put((True, fn()))
                    except Exception as err:
                        box.put((False, err))
                if self.stopping and stop_at is None:
                    stop_at = time.monotonic() + 2.0
                if stop_at is not None and (time.monotonic() > stop_at or not self._selector.get_map()):
                    break
                if self._to_connect and not self.stopping:
                    self._connect_some()
                for client in list(self._writers):
                    client.loop_write()
                for key, _ in self._selector.select(timeout=0.01):
                    key.data.loop_read()
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, fn = heapq.heappop(self._timers)
                    fn()
                if now - last_misc >= 1.0:
                    last_misc = now
                    for device in list(self.devices.values()):
                        device.client.loop_misc()
        except Exception:
            log.exception("simulated fleet loop failed")
        finally:
            for key in list(self._selector.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()
            self._stopped.set()


__all__ = ["Behavior", "BundleBehavior", "Neighbour", "SimFleet", "synthetic_bundle"]
