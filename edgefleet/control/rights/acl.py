"""Render the Mosquitto ACL file that confines each device to its own topics.

Mosquitto runs with `use_identity_as_username true`, so the user name in each `user` block is the CN of the client
certificate: the device id for a device (see `edgefleet.control.credentials.pki`), `edgefleet-host` for the control
plane. Every topic comes from `edgefleet.core.topics.Topics`; a device may

- write its `status`, `telemetry`, `events`, `infer/response/+` and `generate/response/+`;
- read its own `desired/+` (every slot's document) and `stored`, the `desired/+` of each of its groups, its
  `infer/request`, `infer/feedback` and `generate/request`, and the `manifest` and `blocks/+` of the bundles
  assigned to it and the chunks their offers list (by name), and nothing else.

Host users read and write everything under the prefix. Lines outside a `user` block would apply to every
client, anonymous ones included, so there are none. Assigning a bundle to a device means rendering the file
again and reloading Mosquitto (`kill -HUP`, or `systemctl reload mosquitto`); a device asked to install a
bundle it may not read sees no offer and reports a transfer timeout.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import DEFAULT_PREFIX, HOST_IDENTITY, Topics, check_segment

"""The user name (certificate CN) of the control plane."""

ACL_FILE_MODE = 0o644  # Mosquitto drops root before reading it; it holds no secret


@dataclass(frozen=True)
class DeviceRules:
    """The topics one device may read and write."""

    user: str
    read: tuple[str, ...]
    write: tuple[str, ...]


def check_prefix(prefix: str) -> str:
    """A topic prefix is one or more valid levels joined by '/': no wildcards, no empty or leading '$' level."""
    if not prefix:
        raise UserInputError("the topic prefix must not be empty")
    for level in prefix.split("/"):
        _check("prefix level", level)
    return prefix


def device_rules(
    topics: Topics,
    device_id: str,
    groups: Iterable[str] = (),
    bundles: Iterable[str] = (),
    chunks: Mapping[str, Sequence[str]] | None = None,
) -> DeviceRules:
    """The read and write topics of one device, from `topics` (never hand-built)."""
    _check("device id", device_id)
    group_list = _unique(_check("group", g) for g in groups)
    bundle_list = _unique(_check("bundle id", b) for b in bundles)
    write = (
        topics.status(device_id),
        topics.telemetry(device_id),
        topics.events(device_id),
        _any_last_level(topics.infer_response(device_id, "x")),
        _any_last_level(topics.generate_response(device_id, "x")),
        _any_last_level(topics.benchmark_result(device_id, "x")),
    )
    read = [topics.device_desired_slots(device_id)]  # every slot's document (`.../desired/+`)
    read += [topics.group_desired_slots(g) for g in group_list]
    read += [topics.infer_request(device_id), topics.infer_feedback(device_id), topics.benchmark_request(device_id)]
    read += [topics.generate_request(device_id)]  # a language model's streamed answers (core/generation_messages.py)
    read += [topics.stored(device_id)]  # what the control plane stored of its reports (its spool prunes to it)
    for bundle_id in bundle_list:
        read += [topics.bundle_offer(bundle_id), _any_last_level(topics.bundle_block(bundle_id, 0))]
        # An acl_file cannot refuse a wildcard it would allow by name, so each chunk is listed (dynsec: by name).
        read += [topics.chunk(sha) for sha in sorted(set((chunks or {}).get(bundle_id, ())))]
    return DeviceRules(user=device_id, read=tuple(read), write=write)


def render_acl(
    devices: Mapping[str, Sequence[str]],
    assignments: Mapping[str, Sequence[str]] | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    host_users: Sequence[str] = (HOST_IDENTITY,),
    chunks: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The text of a Mosquitto `acl_file`. `chunks` maps a bundle id to the chunk names its signed offer lists
    (a device assigned the bundle may read each; without them a chunked bundle cannot be fetched through this ACL).

    `devices` maps each device id to its groups; `assignments` maps a device id to the bundle ids it may
    download (typically what it runs, what it is being moved to and what it could roll back to). Output is
    deterministic (sorted), so regenerating an unchanged fleet gives the same file.
    """
    topics = Topics(check_prefix(prefix))
    assignments = assignments or {}
    unknown = sorted(set(assignments) - set(devices))
    if unknown:
        raise UserInputError(f"bundles assigned to unknown devices: {', '.join(unknown)}; list them as devices too")
    hosts = _unique(_check("host user", h) for h in host_users)
    clash = sorted(set(hosts) & set(devices))
    if clash:
        raise UserInputError(f"{', '.join(clash)} cannot be both a host user and a device")
    everything = f"{topics.prefix}/#"
    out = [
        "# Mosquitto ACL generated by `edgefleet keys acl`; do not edit by hand, regenerate it.",
        "# The user name is the client certificate's CN (use_identity_as_username true).",
        f"# Prefix {topics.prefix}: {len(hosts)} host user(s) with all of it, {len(devices)} device(s) with their own.",
        "",
    ]
    for host in sorted(hosts):
        out += [f"user {host}", f"topic readwrite {everything}", ""]
    for device_id in sorted(devices):
        rules = device_rules(
            topics, device_id, sorted(devices[device_id]), sorted(assignments.get(device_id, ())), chunks
        )
        out.append(f"user {rules.user}")
        out += [f"topic write {topic}" for topic in rules.write]
        out += [f"topic read {topic}" for topic in rules.read]
        out.append("")
    return "\n".join(out)


def write_acl(path: Path, text: str) -> Path:
    """Replace `path` atomically (temporary file in the same directory, fsync, rename): a broker reloading
    at any moment reads either the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), ACL_FILE_MODE)
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


# --- internals


def _check(kind: str, value: str) -> str:
    try:
        return check_segment(kind, value)
    except ValueError as err:
        raise UserInputError(str(err)) from err


def _any_last_level(topic: str) -> str:
    """`a/b/c` -> `a/b/+`: the wildcard over the last level of a topic that `Topics` built."""
    head, _, _ = topic.rpartition("/")
    return f"{head}/+"


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
