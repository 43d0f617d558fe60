"""`LastValues`, the bookkeeping behind `Connection.publish_latest` (edgefleet/core/mqtt/last_value.py), driven by
the acknowledgement orders a broker can produce. The real replay is tests/integration/core/test_mqtt_last_value.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgefleet.core.mqtt.last_value import LastValues


@dataclass
class Info:
    """What LastValues reads of paho's MQTTMessageInfo."""

    mid: int
    acked: bool = False

    def is_published(self) -> bool:
        return self.acked


@dataclass
class Wire:
    """Publishes handed back to LastValues as paho would: a new mid each, acknowledged by `ack`."""

    values: LastValues = field(init=False)
    sent: list[tuple[int, bytes]] = field(default_factory=list)
    infos: dict[int, Info] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.values = LastValues(lambda topic, payload, qos: self.publish(topic, payload))

    def publish(self, topic: str, payload: bytes) -> int:
        mid = len(self.sent) + 1
        self.sent.append((mid, payload))
        self.infos[mid] = Info(mid)
        self.values.published(topic, payload, 1, self.infos[mid])  # type: ignore[arg-type]
        return mid

    def ack(self, mid: int) -> None:
        """As paho does: `on_publish` first, then the message is marked published."""
        self.values.acknowledged(mid)
        self.infos[mid].acked = True


def test_acknowledged_in_order_nothing_is_sent_again_and_nothing_is_held() -> None:
    wire = Wire()
    for value in (b"idle", b"downloading", b"serving"):
        wire.ack(wire.publish("s", value))
    assert [p for _, p in wire.sent] == [b"idle", b"downloading", b"serving"]
    assert wire.values.settled() and wire.values.held() == 0


def test_an_old_value_applied_after_the_newest_is_followed_by_the_newest_again() -> None:
    wire = Wire()
    installing = wire.publish("s", b"installing")  # the connection drops before its PUBACK
    serving = wire.publish("s", b"serving")  # published on reconnect, ahead of paho's replay
    wire.ack(serving)
    wire.ack(installing)  # the replay: applied after "serving"
    assert wire.sent[-1][1] == b"serving" and len(wire.sent) == 3
    wire.ack(wire.sent[-1][0])
    assert wire.values.replays_superseded == 1
    assert wire.values.settled() and wire.values.held() == 0


def test_an_old_value_applied_before_the_newest_needs_nothing() -> None:
    wire = Wire()
    installing = wire.publish("s", b"installing")
    serving = wire.publish("s", b"serving")
    wire.ack(installing)
    wire.ack(serving)
    assert len(wire.sent) == 2 and wire.values.replays_superseded == 0 and wire.values.held() == 0


def test_topics_are_independent() -> None:
    wire = Wire()
    a_old = wire.publish("a", b"a1")
    b_new = wire.publish("b", b"b1")
    a_new = wire.publish("a", b"a2")
    wire.ack(b_new)
    wire.ack(a_new)
    wire.ack(a_old)
    assert [p for _, p in wire.sent] == [b"a1", b"b1", b"a2", b"a2"]


def test_a_newest_value_acknowledged_before_it_is_recorded_still_counts_as_applied() -> None:
    wire = Wire()
    installing = wire.publish("s", b"installing")
    serving = Info(99)
    wire.values.acknowledged(99)  # its PUBACK overtook the caller's `published`
    serving.acked = True
    wire.values.published("s", b"serving", 1, serving)  # type: ignore[arg-type]
    wire.ack(installing)  # the replay, applied after "serving"
    assert wire.sent[-1][1] == b"serving" and wire.values.replays_superseded == 1
