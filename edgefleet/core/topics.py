"""Every MQTT topic edgefleet uses, built in one place (see the contract in the README)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "edgefleet/v1"
# The MQTT identity (certificate CN / ACL user) of the control plane.
HOST_IDENTITY = "edgefleet-host"
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


# A slot names one model a device runs (`detector`, `asr`, `assistant`): the unit of desired state, install, golden
# check, rollback, telemetry and rollout (DESIGN.md, "Several models per device"). A device with one model runs it in
# the default slot; there is no second code path for it.
DEFAULT_SLOT = "default"
_SLOT = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


def check_slot(value: str) -> str:
    """A slot name is a topic level, a directory on the device and a label: 1-32 lowercase letters, digits or '-'."""
    if not isinstance(value, str) or not _SLOT.match(value):
        raise ValueError(f"invalid slot {value!r}: use 1-32 lowercase letters, digits or '-', starting with a letter")
    return value


def check_segment(kind: str, value: str) -> str:
    """Device ids, group names and bundle ids become topic levels: no wildcards, slashes or spaces."""
    if not _SEGMENT.match(value):
        raise ValueError(
            f"invalid {kind} {value!r}: use 1-128 letters, digits, '.', '_', ':' or '-', starting alphanumeric"
        )
    return value


@dataclass(frozen=True)
class Topics:
    prefix: str = DEFAULT_PREFIX

    # --- device -> host
    def status(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/status"

    def telemetry(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/telemetry"

    def events(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/events"

    # --- host -> device
    def device_desired(self, device_id: str, slot: str) -> str:
        """Retained: the signed desired state of one slot of one device (a device override)."""
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/desired/{check_slot(slot)}"

    def device_desired_slots(self, device_id: str) -> str:
        """Every slot's desired state of one device (the device subscribes to this)."""
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/desired/+"

    def legacy_device_desired(self, device_id: str) -> str:
        """Where a single-model control plane kept a device's desired state; only migration reads or clears it."""
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/desired"

    def stored(self, device_id: str) -> str:
        """Retained, by the control plane: how far this device's reports are in the store (`StoredUpTo`); the
        device keeps every report in its spool until this covers it."""
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/stored"

    def group_desired(self, group: str, slot: str) -> str:
        """Retained: the signed desired state of one slot for every device of a group."""
        return f"{self.prefix}/groups/{check_segment('group', group)}/desired/{check_slot(slot)}"

    def group_desired_slots(self, group: str) -> str:
        """Every slot's desired state of one group (devices subscribe to this; broker rights grant it)."""
        return f"{self.prefix}/groups/{check_segment('group', group)}/desired/+"

    def legacy_group_desired(self, group: str) -> str:
        """Where a single-model control plane kept a group's desired state; only migration reads or clears it."""
        return f"{self.prefix}/groups/{check_segment('group', group)}/desired"

    def desired_slot_of(self, topic: str) -> str | None:
        """The slot of a `.../desired/{slot}` topic, or None (the legacy topic, or another topic)."""
        head, sep, slot = topic.rpartition("/desired/")
        if not sep or not head.startswith(self.prefix + "/"):
            return None
        try:
            return check_slot(slot)
        except ValueError:
            return None

    def bundle_offer(self, bundle_id: str) -> str:
        """Retained: the signed manifest plus the transfer descriptor (size, hashes, block layout)."""
        return f"{self.prefix}/bundles/{check_segment('bundle id', bundle_id)}/manifest"

    def bundle_block(self, bundle_id: str, index: int) -> str:
        """Retained: one block of the bundle file."""
        return f"{self.prefix}/bundles/{check_segment('bundle id', bundle_id)}/blocks/{index}"

    def bundle_blocks(self, bundle_id: str) -> str:
        """Every block of a bundle (for ACLs; devices subscribe block by block)."""
        return f"{self.prefix}/bundles/{check_segment('bundle id', bundle_id)}/blocks/+"

    def agent_release_offer(self, release_id: str) -> str:
        """Retained: an agent release's signed manifest and transfer layout (its files travel as chunks)."""
        return f"{self.prefix}/agent-releases/{check_segment('release id', release_id)}/offer"

    def agent_release_offers(self) -> str:
        """Every agent release offer (a device's base right: releases are signed, public artifacts)."""
        return f"{self.prefix}/agent-releases/+/offer"

    def chunk(self, sha256: str) -> str:
        """Retained: one content-addressed chunk, shared by every bundle that holds it (core/transfer/chunks.py)."""
        if len(sha256) != 64 or sha256.strip("0123456789abcdef"):
            raise ValueError(f"invalid chunk name {sha256!r}: a chunk is named by its sha256 in hex")
        return f"{self.prefix}/chunks/{sha256}"

    def all_chunks(self) -> str:
        """Every chunk topic (for broker rights: a device may subscribe to a chunk it can name, never to this)."""
        return f"{self.prefix}/chunks/+"

    def chunk_of(self, topic: str) -> str | None:
        head = f"{self.prefix}/chunks/"
        return topic[len(head) :] if topic.startswith(head) else None

    # --- request/response inference (remote calls into a device's model)
    def infer_request(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/infer/request"

    def infer_response(self, device_id: str, client_id: str) -> str:
        return (
            f"{self.prefix}/devices/{check_segment('device id', device_id)}"
            f"/infer/response/{check_segment('client id', client_id)}"
        )

    def infer_feedback(self, device_id: str) -> str:
        """Clients tell the device the true labels of earlier requests (InferFeedback)."""
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/infer/feedback"

    def infer_responses(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/infer/response/+"

    # --- request/response generation (edgefleet/core/generation_messages.py): the answer streams as chunks
    def generate_request(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/generate/request"

    def generate_response(self, device_id: str, client_id: str) -> str:
        return (
            f"{self.prefix}/devices/{check_segment('device id', device_id)}"
            f"/generate/response/{check_segment('client id', client_id)}"
        )

    def generate_responses(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/generate/response/+"

    # --- the fleet as the benchmark farm (edgefleet/core/farm_messages.py)
    def benchmark_request(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/benchmark/request"

    def benchmark_result(self, device_id: str, client_id: str) -> str:
        return (
            f"{self.prefix}/devices/{check_segment('device id', device_id)}"
            f"/benchmark/result/{check_segment('client id', client_id)}"
        )

    def benchmark_results(self, device_id: str) -> str:
        return f"{self.prefix}/devices/{check_segment('device id', device_id)}/benchmark/result/+"

    # --- wildcards for the host
    def all_status(self) -> str:
        return f"{self.prefix}/devices/+/status"

    def all_telemetry(self) -> str:
        return f"{self.prefix}/devices/+/telemetry"

    def all_events(self) -> str:
        return f"{self.prefix}/devices/+/events"

    def device_id_of(self, topic: str) -> str | None:
        """The device id in a `{prefix}/devices/{id}/...` topic, or None."""
        head = f"{self.prefix}/devices/"
        if not topic.startswith(head):
            return None
        rest = topic[len(head) :].split("/", 1)
        return rest[0] if rest and rest[0] else None

    def block_index_of(self, topic: str) -> int | None:
        _, sep, tail = topic.rpartition("/blocks/")
        if not sep or not tail.isdigit():
            return None
        return int(tail)
