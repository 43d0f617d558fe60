"""One MQTT connection for host commands and the agent alike (paho-mqtt, callback API v2).

- Subscriptions are remembered and re-made in `on_connect`, so a reconnect restores them.
- A retained last value (`publish_latest`, a device's status) is never left stale by paho's replay of an older
  one after a reconnect (edgefleet/core/mqtt/last_value.py).
- The first connection is retried too (`connect_async` + `loop_start`), with back-off.
- Protocol "auto" uses MQTT 5 when the broker accepts it and MQTT 3.1.1 otherwise (amqtt, AWS IoT Core):
  a v5 CONNECT to a 3.1.1-only broker gets CONNACK "Unsupported protocol version" within milliseconds.
- A handler that raises is logged and the connection goes on: one bad message never stops a daemon.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal
from typing import Protocol as Interface

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edgefleet.core.errors import BrokerError
from edgefleet.core.mqtt.last_value import LastValues
from edgefleet.core.mqtt.setup import BrokerAddress, TlsFiles, Will, negotiate_protocol, new_client, no_delay
from edgefleet.core.mqtt.suback import SubackWaiters

log = logging.getLogger(__name__)

Protocol = Literal["auto", "3.1.1", "5"]
Handler = Callable[[str, bytes, bool], None]  # (topic, payload, retained)
Ack = Callable[[], None]
AckedHandler = Callable[[str, bytes, bool, Ack], None]  # (topic, payload, retained, ack once it is safe)


class PublishObserver(Interface):
    """Told of every publish on a connection (the agent's link pacing: reports go before bundle chunks)."""

    def queued(self, mid: int, nbytes: int) -> None: ...

    def acknowledged(self, mid: int) -> None: ...


def _matches(pattern: str, topic: str) -> bool:
    if pattern.startswith("$share/"):  # a shared subscription delivers the topic without its share prefix
        pattern = pattern.split("/", 2)[2] if pattern.count("/") >= 2 else pattern
    return bool(paho.topic_matches_sub(pattern, topic))


class Connection:
    """A long-lived client. Call `start()`, then subscribe/publish from any thread, then `stop()`."""

    def __init__(
        self,
        url: str,
        client_id: str,
        *,
        protocol: Protocol = "auto",
        will: Will | None = None,
        tls: TlsFiles | None = None,
        keepalive: int = 30,
        on_connected: Callable[[], None] | None = None,
        session_expiry_s: int = 0,
        manual_ack: bool = False,
        receive_maximum: int | None = None,
        observer: PublishObserver | None = None,
    ) -> None:
        """`session_expiry_s` > 0 asks the broker to keep this client's subscriptions and queue its QoS 1
        messages while it is away (a persistent session), so a subscriber that reconnects misses nothing.

        `manual_ack`: a QoS 1 message is acknowledged (PUBACK) only when its handler says so (handlers given to
        `subscribe_acked` call the `ack` they get, e.g. once the message is stored; plain handlers are
        acknowledged when they return). Unacknowledged messages stay the broker's: it re-delivers them after a
        reconnect, and stops sending once `receive_maximum` (MQTT 5; the broker's `max_inflight_messages` on
        3.1.1) are unacknowledged, which is the back-pressure."""
        self.address = BrokerAddress.parse(url)
        self.client_id = client_id
        self._protocol_choice, self._tls, self._will, self._keepalive = protocol, tls, will, keepalive
        self._on_connected = on_connected
        self._session_expiry_s = session_expiry_s
        self._subscriptions: dict[str, tuple[int, Handler | None, AckedHandler | None]] = {}
        self._patterns: set[str] = set()  # the subscriptions with wildcards; the rest route by one dict lookup
        self._manual_ack, self._receive_maximum = manual_ack, receive_maximum
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._client: paho.Client | None = None
        self.protocol: paho.MQTTProtocolVersion = paho.MQTTv311
        self.connects = 0
        self._stopping = False
        self._refused_publishes: dict[int, str] = {}  # mid -> reason, from MQTT 5 PUBACK reason codes
        self._observer = observer
        self._subacks = SubackWaiters()
        self._refusal: str | None = None  # the broker's reason for refusing the last CONNECT
        self.last_values = LastValues(lambda topic, payload, qos: self.publish_latest(topic, payload, qos=qos))

    # --- lifecycle
    def start(self, wait: float | None = 10.0) -> Connection:
        """Connect in the background. With `wait`, block until connected or raise BrokerError."""
        if self._protocol_choice == "5":
            self.protocol = paho.MQTTv5
        elif self._protocol_choice == "auto":
            self.protocol = negotiate_protocol(self.address, self._tls)
        persistent = self._session_expiry_s > 0
        client = new_client(self.client_id, self.protocol, self._tls, self.address, persistent)
        client.manual_ack_set(self._manual_ack)
        connect_options: dict[str, Any] = {}
        if self.protocol == paho.MQTTv5:
            properties = Properties(PacketTypes.CONNECT)
            if persistent:
                properties.SessionExpiryInterval = self._session_expiry_s
            if self._receive_maximum is not None:
                properties.ReceiveMaximum = self._receive_maximum
            connect_options = {"clean_start": not persistent, "properties": properties}
        if self._will is not None:
            client.will_set(self._will.topic, self._will.payload, self._will.qos, self._will.retain)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_unrouted
        client.on_publish = self._handle_publish
        client.on_subscribe = lambda _c, _u, mid, _codes, _p: self._subacks.acknowledged(mid)
        self._client = client
        try:
            if wait is None:  # a daemon: keep retrying in the background, even the first connection
                client.connect_async(self.address.host, self.address.port, keepalive=self._keepalive, **connect_options)
            else:  # a command: a refused or unresolvable broker is an immediate, clear error
                client.connect(self.address.host, self.address.port, keepalive=self._keepalive, **connect_options)
        except (OSError, ValueError) as err:
            raise BrokerError(f"cannot connect to the MQTT broker at {self.address}: {err}") from err
        client.loop_start()
        if wait is not None and not self._connected.wait(wait):
            self.stop()
            if self._refusal:
                raise BrokerError(
                    f"the MQTT broker at {self.address} refused the connection ({self._refusal})"
                    + (": it does not know this certificate's identity (CN), or gives it no rights; enroll it with "
                       "`edgefleet keys enroll CN` (--host for a control-plane identity)" if self._tls else "")
                )  # fmt: skip
            hint = (
                "check the certificate files (the broker logs why it closed the connection)"
                if self.address.tls
                else "if it is a TLS listener (8883 usually is), dial mqtts:// with a CA (--ca)"
            )
            raise BrokerError(f"no connection to the MQTT broker at {self.address} within {wait:g} s: {hint}")
        return self

    def stop(self, graceful: bool = True) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        self._stopping = True
        if graceful and self._connected.is_set():
            # DISCONNECT goes out after everything queued before it; stopping the network thread before the
            # broker closed the socket could drop those packets (seen: a lost UNSUBSCRIBE). Wait, bounded.
            client.disconnect()
            deadline = time.monotonic() + 2.0
            while self._connected.is_set() and time.monotonic() < deadline:
                time.sleep(0.005)
        elif graceful:
            client.disconnect()
        client.loop_stop()
        self._connected.clear()

    @property
    def tls(self) -> TlsFiles | None:
        return self._tls

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    # --- subscriptions
    def subscribe(self, topic: str, handler: Handler, qos: int = 1) -> None:
        with self._lock:
            self._subscriptions[topic] = (qos, handler, None)
            self._note_pattern(topic)
        self._subscribe_now(topic, qos)

    def subscribe_acked(self, topic: str, handler: AckedHandler, qos: int = 1) -> None:
        """Like `subscribe`, but on a `manual_ack` connection the message is acknowledged only when the handler
        calls the `ack` it is given (from any thread, once). Elsewhere `ack` does nothing."""
        with self._lock:
            self._subscriptions[topic] = (qos, None, handler)
            self._note_pattern(topic)
        self._subscribe_now(topic, qos)

    def _note_pattern(self, topic: str) -> None:
        if "+" in topic or "#" in topic or topic.startswith("$share/"):
            self._patterns.add(topic)

    def _subscribe_now(self, topic: str, qos: int) -> None:
        """Subscribe now if connected. A connection that comes up concurrently has `_connected` set in the same
        locked step as its snapshot of the subscriptions (`_handle_connect`): one registered after the snapshot
        sees it set and subscribes here, so no subscription falls between the two."""
        client = self._client
        if client is not None and self.connected:
            client.subscribe(topic, qos)

    def unsubscribe(self, topic: str) -> None:
        self.unsubscribe_many([topic])

    def subscribe_many(self, topics: list[str], handler: Handler, qos: int = 1, *, wait: float | None = None) -> bool:
        """Several topics, one handler, one SUBSCRIBE packet (a window of block topics). With `wait`, block until
        the broker acknowledged the subscription (SUBACK), across a reconnect, and return whether it did in time:
        only then is what this connection publishes next sure to find the subscription in place (amqtt, unlike
        Mosquitto, may route a PUBLISH before a SUBSCRIBE that came ahead of it). Without `wait`, a connection that
        is down makes the subscription when it is back (as `subscribe` does)."""
        if not topics:
            return True
        with self._lock:
            for topic in topics:
                self._subscriptions[topic] = (qos, handler, None)
                self._note_pattern(topic)
        deadline = time.monotonic() + (wait or 0.0)
        while True:
            client = self._client
            if client is not None and self.connected:
                rc, mid = client.subscribe([(topic, qos) for topic in topics])
                if wait is None:
                    return True
                remaining = deadline - time.monotonic()
                if rc == paho.MQTT_ERR_SUCCESS and mid is not None and self._subacks.wait(mid, remaining):
                    return True
            elif wait is None:
                return True  # made by _handle_connect when the connection is back
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.wait_connected(remaining):
                return False
            time.sleep(min(0.05, remaining))  # not sent or not acknowledged while connected: do not spin

    def unsubscribe_many(self, topics: list[str]) -> None:
        """One UNSUBSCRIBE packet for all of `topics`."""
        if not topics:
            return
        with self._lock:
            for topic in topics:
                self._subscriptions.pop(topic, None)
                self._patterns.discard(topic)
        client = self._client
        if client is not None and self.connected:
            client.unsubscribe(list(topics))

    # --- publishing
    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False, wait: float | None = None
    ) -> paho.MQTTMessageInfo:
        return self._finish_publish(topic, len(payload), self._send(topic, payload, qos, retain), wait)

    def _send(self, topic: str, payload: bytes, qos: int, retain: bool) -> paho.MQTTMessageInfo:
        client = self._client
        if client is None:
            raise BrokerError("the MQTT connection is not started")
        info = client.publish(topic, payload, qos=qos, retain=retain)
        if info.rc == paho.MQTT_ERR_PAYLOAD_SIZE:
            raise BrokerError(f"payload of {len(payload)} bytes is too large for {topic}")
        return info

    def _finish_publish(
        self, topic: str, nbytes: int, info: paho.MQTTMessageInfo, wait: float | None
    ) -> paho.MQTTMessageInfo:
        if self._observer is not None:
            self._observer.queued(info.mid, nbytes)
        if wait is not None:
            try:
                info.wait_for_publish(wait)
            except (RuntimeError, ValueError) as err:
                raise BrokerError(f"publish to {topic} failed: {err}") from err
            if not info.is_published():
                raise BrokerError(f"publish to {topic} not acknowledged within {wait:g} s")
            refusal = self._refused_publishes.pop(info.mid, None)
            if refusal is not None:
                raise BrokerError(f"the broker refused the publish to {topic}: {refusal}")
        return info

    def publish_latest(
        self, topic: str, payload: bytes, *, qos: int = 1, wait: float | None = None
    ) -> paho.MQTTMessageInfo:
        """Publish a retained last value: whatever paho replays after a reconnect, the broker ends up holding the
        newest one published here (it is published again if an older one is applied after it)."""
        info = self._send(topic, payload, qos, True)
        if qos > 0:
            self.last_values.published(topic, payload, qos, info)
        return self._finish_publish(topic, len(payload), info, wait)

    # --- paho callbacks (network thread)
    def _handle_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Any) -> None:
        if reason.is_failure:
            self._refusal = reason.getName()
            log.warning("broker %s refused the connection: %s", self.address, self._refusal)
            return
        self.connects += 1
        no_delay(client)
        with self._lock:  # with `_subscribe_now`: a subscription is in this snapshot or made by its caller
            subscriptions = list(self._subscriptions.items())
            self._connected.set()
        for topic, (qos, _, _) in subscriptions:
            client.subscribe(topic, qos)
        log.info("connected to %s (MQTT %s)", self.address, "5" if self.protocol == paho.MQTTv5 else "3.1.1")
        if self._on_connected is not None:
            try:
                self._on_connected()
            except Exception:
                log.exception("on_connected hook failed")

    def _handle_publish(self, client: paho.Client, userdata: Any, mid: int, reason: ReasonCode, props: Any) -> None:
        if self._observer is not None:
            self._observer.acknowledged(mid)
        self.last_values.acknowledged(mid)
        # MQTT 5 brokers say why they refused a QoS 1 publish (e.g. 0x87 Not authorized by an ACL).
        if reason.is_failure:
            if len(self._refused_publishes) > 10_000:
                self._refused_publishes.clear()
            self._refused_publishes[mid] = reason.getName()
            log.warning("broker refused message %d: %s", mid, reason.getName())

    def _handle_disconnect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Any
    ) -> None:
        if self._connected.is_set() and not self._stopping:
            log.warning("disconnected from %s: %s; reconnecting", self.address, reason.getName())
        self._connected.clear()
        self._subacks.abandon()  # a SUBACK for a SUBSCRIBE of the lost connection will never come

    def _acker(self, mid: int, qos: int) -> Ack:
        """Acknowledge `mid` on the connection it arrived on. After a reconnect the broker re-delivers what was
        not acknowledged (a new copy, acknowledged on its own), and may reuse the old packet id for another
        message: an acknowledgement from a previous connection must not go out on this one."""
        generation = self.connects

        def ack() -> None:
            client = self._client
            if client is not None and self.connects == generation and self.connected:
                client.ack(mid, qos)

        return ack

    def _handle_unrouted(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        with self._lock:
            # A window of block topics can hold hundreds of exact subscriptions: route those by lookup.
            exact = self._subscriptions.get(message.topic)
            matched = [(exact[1], exact[2])] if exact is not None else []
            for pattern in self._patterns:
                if _matches(pattern, message.topic):
                    _, h, a = self._subscriptions[pattern]
                    matched.append((h, a))
        manual = self._manual_ack and message.qos > 0
        ack = self._acker(message.mid, message.qos) if manual else _no_ack
        deferred = False
        payload, retained = bytes(message.payload), bool(message.retain)
        for handler, acked_handler in matched:
            try:
                if acked_handler is not None:
                    deferred = True
                    acked_handler(message.topic, payload, retained, ack)
                elif handler is not None:
                    handler(message.topic, payload, retained)
            except Exception:
                log.exception("handler for %s failed; message dropped", message.topic)
                deferred = deferred and acked_handler is None  # it will never ack: free the broker's slot
        if manual and not deferred:
            ack()


def _no_ack() -> None:
    """Acknowledgement is paho's (automatic) on connections without `manual_ack`."""
