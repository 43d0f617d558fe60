"""The embedded default broker: amqtt (MQTT 3.1.1 only) in its own thread with its own event loop.

Used when no broker URL is given. amqtt keeps retained messages in memory only: they are lost when the
broker stops, and a restart starts empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from types import FrameType, TracebackType
from typing import Any

from edgefleet.core.errors import BrokerError

log = logging.getLogger(__name__)

# amqtt and its state machine library log every connection at INFO; keep them quiet.
_NOISY_LOGGERS = ("amqtt", "transitions")


class _DropMqtt5Refusals(logging.Filter):
    """Clients that try MQTT 5 and fall back to 3.1.1 are expected: drop amqtt's two warnings per try.

    "Invalid connection from ..." always precedes a "Failed to initialize client session: <why>" line.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        refused_v5 = "Invalid protocol from" in message and message.endswith(": 5")
        return not (refused_v5 or message.startswith("Invalid connection from"))


_DROP_MQTT5_REFUSALS = _DropMqtt5Refusals()


class EmbeddedBrokerError(BrokerError, RuntimeError):
    """The embedded broker could not start."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def broker_config(host: str, port: int) -> dict[str, Any]:
    """The amqtt 0.12 config: one TCP listener, anonymous clients, no $SYS topics, no packet logging.

    amqtt has no maximum message size (a packet's remaining length may reach the MQTT limit, 256 MiB),
    and it always keeps retained messages (in memory), so neither needs configuring.
    """
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 0}},
        # Giving "plugins" replaces amqtt's defaults (event/packet loggers, $SYS every 20 s).
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


class EmbeddedBroker:
    """An amqtt broker running on a daemon thread. `start()` returns once it accepts connections."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set()

    def start(self, timeout: float = 10.0) -> EmbeddedBroker:
        """Start the broker and block until it listens; raise `EmbeddedBrokerError` if it cannot."""
        if self._thread is not None:
            raise EmbeddedBrokerError("the embedded broker is already started")
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("amqtt.broker").addFilter(_DROP_MQTT5_REFUSALS)  # adding it twice is a no-op
        # amqtt would pass port 0 to the OS too, but would never tell us which port it got. Once chosen,
        # the port is kept: start() after stop() serves the same URL again.
        if not self._port:
            self._port = free_port(self.host)
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=f"amqtt-broker-{self._port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise EmbeddedBrokerError(
                f"the embedded MQTT broker did not start on {self.host}:{self._port} within {timeout:g} s"
            )
        if self._error is not None:
            error = self._error
            self._join()
            cause = error.__cause__ or error
            raise EmbeddedBrokerError(
                f"the embedded MQTT broker could not listen on {self.host}:{self._port}: {cause}"
            ) from error
        log.info("embedded MQTT broker listening on %s", self.url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Disconnect every client, close the listener and join the thread. Safe to call twice."""
        loop, stop_event = self._loop, self._stop_event
        if loop is not None and stop_event is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(stop_event.set)
        self._join(timeout)

    def _join(self, timeout: float = 10.0) -> None:
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the embedded MQTT broker thread did not stop within %g s", timeout)
        self._thread = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_quiet_dropped_connections)
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(), or logged if it happens later
            if self._ready.is_set():
                log.exception("the embedded MQTT broker failed")
            self._error = exc
        finally:
            self._ready.set()
            try:
                _cancel_remaining(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                self._loop = None
                self._stop_event = None
                asyncio.set_event_loop(None)
                loop.close()

    async def _serve(self) -> None:
        from amqtt.broker import Broker  # imported late: amqtt is a host-only dependency

        self._stop_event = asyncio.Event()
        broker = Broker(broker_config(self.host, self._port), loop=asyncio.get_running_loop())
        await broker.start()
        self._ready.set()
        await self._stop_event.wait()
        await broker.shutdown()

    def __enter__(self) -> EmbeddedBroker:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _quiet_dropped_connections(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """amqtt lets socket errors from clients that vanish mid-CONNECT escape to the loop: log them briefly."""
    exc = context.get("exception")
    if isinstance(exc, OSError):
        log.debug("amqtt dropped a client connection: %s", exc)
        return
    loop.default_exception_handler(context)


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what amqtt leaves running after shutdown (client handlers, plugin events) and let it finish."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def run_forever(host: str = "127.0.0.1", port: int = 1883) -> None:
    """Serve until SIGINT or SIGTERM, then stop cleanly (the `edgefleet broker` command)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping the broker", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with EmbeddedBroker(host, port) as broker:
            log.info("serving MQTT 3.1.1 on %s until Ctrl-C or SIGTERM", broker.url)
            while not stop.wait(0.5):
                if not broker.running:
                    raise EmbeddedBrokerError("the embedded MQTT broker stopped unexpectedly")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
