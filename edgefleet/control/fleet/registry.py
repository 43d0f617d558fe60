"""The device registry's pure logic: labels, selectors, group membership and desired-state resolution.

Where things come from:
- a device's facts come from its retained status: `arch`, `os`, `agent-version`, `online`;
- its profile and groups are the host registry's: what the operator enrolled with `edgefleet devices enroll ID
  --profile P --group G` (kept as the host-side labels `registry.profile` and `registry.groups`). What an
  enrolled device reports about itself never changes them; a difference is a warning (`registry_warnings`),
  shown by `devices list|show` and the dashboard. A device that was never enrolled is taken at its word
  (profile, and `--group` names the host does not define), with the warning "not enrolled", so open and demo
  fleets keep working;
- operator labels live in the store and are edited with `edgefleet devices label ID key=value`;
- host-side groups (`edgefleet groups set NAME --device D --selector S --priority N`) are a static list of
  devices, a label selector, or both (their union). A group name with no definition means the agent-side
  group of that name, so `--group line-1` works for agents started with `--group line-1`.

Selectors are comma-separated terms, all of which must hold: `key=value`, `key!=value`, `key` (present),
`!key` (absent), `key in (a|b)`.

Desired state: deployments at three scopes, per profile; for each device the most specific wins:
a device deployment, else the deployment of the highest-priority group the device belongs to (ties: the
group name), else the fleet-wide base deployment for the device's profile.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from edgefleet.control.store import ANY_PROFILE, FLEET_TARGET, Deployment, DeviceRecord, GroupDef, SlotPolicy
from edgefleet.core.errors import UserInputError
from edgefleet.core.profiles import profile_lineage
from edgefleet.core.topics import DEFAULT_SLOT, check_segment

_KEY = r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}"
_VALUE = r"[A-Za-z0-9._:@/-]{0,128}"
_TERM = re.compile(
    rf"^\s*(?:(?P<neg>!)\s*(?P<absent>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>!=|=)\s*(?P<value>{_VALUE})|\s+in\s*\((?P<set>[^)]*)\))?)\s*$"
)
BUILTIN_KEYS = ("profile", "arch", "os", "agent-version", "online", "group")
REGISTRY_PROFILE = "registry.profile"  # host-side labels written by `devices enroll`, never by a device
REGISTRY_GROUPS = "registry.groups"
REGISTRY_REVOKED = "registry.revoked"  # when its broker identity was revoked (`keys revoke-device`)
REGISTRY_LINK_CAP = "registry.max_bytes_per_s"  # the device's paid-link byte-rate cap, sent in its desired state
REGISTRY_KEYS = (REGISTRY_PROFILE, REGISTRY_GROUPS, REGISTRY_REVOKED, REGISTRY_LINK_CAP)


class SelectorError(UserInputError):
    """A label selector that does not parse."""


class EmptyGroupError(UserInputError):
    """A group with no devices in it."""


@dataclass(frozen=True)
class Term:
    key: str
    op: str  # "=", "!=", "exists", "absent", "in"
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, frozenset[str]]) -> bool:
        have = labels.get(self.key, frozenset())
        if self.op == "exists":
            return bool(have)
        if self.op == "absent":
            return not have
        if self.op == "!=":
            return self.values[0] not in have
        return any(v in have for v in self.values)  # "=" and "in"


@dataclass(frozen=True)
class Selector:
    text: str
    terms: tuple[Term, ...]

    @classmethod
    def parse(cls, text: str) -> Selector:
        terms = []
        for raw in _split_terms(text):
            match = _TERM.match(raw)
            if not match:
                raise SelectorError(
                    f"cannot parse selector term {raw.strip()!r} in {text!r}; use key=value, key!=value, key, !key "
                    "or key in (a|b), separated by commas"
                )
            if match["absent"]:
                terms.append(Term(match["absent"], "absent"))
            elif match["op"]:
                terms.append(Term(match["key"], match["op"], (match["value"],)))
            elif match["set"] is not None:
                values = tuple(v.strip() for v in match["set"].split("|") if v.strip())
                if not values:
                    raise SelectorError(f"empty set in selector term {raw.strip()!r}")
                terms.append(Term(match["key"], "in", values))
            else:
                terms.append(Term(match["key"], "exists"))
        if not terms:
            raise SelectorError("an empty selector would match every device; name at least one term")
        return cls(text, tuple(terms))

    def matches(self, device: DeviceRecord) -> bool:
        labels = device_labels(device)
        return all(term.holds(labels) for term in self.terms)


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def device_labels(device: DeviceRecord) -> dict[str, frozenset[str]]:
    """Operator labels plus the facts from the device's status (which win on a clash); profile and groups are the
    host registry's (`host_view`)."""
    device = host_view(device)
    labels = {key: frozenset([value]) for key, value in device.labels.items() if key not in REGISTRY_KEYS}
    facts = {
        "profile": device.profile,
        "arch": device.arch,
        "os": device.os,
        "agent-version": device.agent_version or None,
        "online": "true" if device.online else "false",
    }
    labels.update({key: frozenset([value]) for key, value in facts.items() if value})
    if device.groups:
        labels["group"] = frozenset(device.groups)
    return labels


def parse_labels(pairs: Iterable[str]) -> dict[str, str]:
    """`key=value` pairs from the command line; builtin keys are facts and cannot be set."""
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(_KEY, key) or not re.fullmatch(_VALUE, value):
            raise UserInputError(f"invalid label {pair!r}: use key=value (letters, digits, '.', '_', '-', '/')")
        if key in REGISTRY_KEYS:
            raise UserInputError(f"label {key!r} is the host registry's: set it with `edgefleet devices enroll`")
        if key in BUILTIN_KEYS:
            raise UserInputError(
                f"label {key!r} comes from the device's status; builtin keys: {', '.join(BUILTIN_KEYS)}"
            )
        labels[key] = value
    return labels


def link_cap(device: DeviceRecord) -> int | None:
    """The byte-rate cap the registry gives the device's link (None: no cap), as `devices enroll` set it."""
    value = device.labels.get(REGISTRY_LINK_CAP)
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def enrolled(device: DeviceRecord) -> bool:
    return REGISTRY_PROFILE in device.labels or REGISTRY_GROUPS in device.labels


def revoked(device: DeviceRecord) -> str | None:
    """When the device's broker identity was revoked (it is in no group, grant or rollout since), or None."""
    return device.labels.get(REGISTRY_REVOKED) or None


def registered_groups(device: DeviceRecord) -> tuple[str, ...]:
    raw = device.labels.get(REGISTRY_GROUPS, "")
    return tuple(sorted({g for g in raw.split(",") if g}))


def host_view(device: DeviceRecord) -> DeviceRecord:
    """`device` with the profile and groups of the host registry (an unenrolled device: its own report)."""
    if not enrolled(device):
        return device
    profile = device.labels.get(REGISTRY_PROFILE) or None
    return replace(device, profile=profile, groups=registered_groups(device))


def registry_warnings(device: DeviceRecord) -> list[str]:
    """What an operator should know about the difference between a device's report and the host registry."""
    if revoked(device):
        return [f"revoked at {revoked(device)}: its certificate has no rights on the broker; in no group or rollout"]
    if not enrolled(device):
        return [
            "not enrolled: its profile and groups are its own report, and a broker with managed rights grants it "
            "no bundle (`edgefleet devices enroll`)"
        ]
    view = host_view(device)
    warnings = []
    if device.profile is not None and device.profile != view.profile:
        warnings.append(f"reports profile {device.profile}, the registry says {view.profile or '(none)'}")
    if set(device.groups) != set(view.groups):
        warnings.append(
            f"reports groups {','.join(sorted(device.groups)) or '(none)'}, "
            f"the registry says {','.join(view.groups) or '(none)'}"
        )
    return warnings


def enrolment_labels(profile: str | None, groups: Iterable[str]) -> dict[str, str]:
    """The host-side labels that enrol a device (`devices enroll`)."""
    try:
        labels = {REGISTRY_GROUPS: ",".join(sorted({check_segment("group", g) for g in groups}))}
        if profile:
            check_segment("profile", profile)
    except ValueError as err:
        raise UserInputError(str(err)) from err
    if profile:
        labels[REGISTRY_PROFILE] = profile
    return labels


def group_members(name: str, groups: Mapping[str, GroupDef], devices: Sequence[DeviceRecord]) -> list[DeviceRecord]:
    """The devices of a host-side group (static list ∪ selector), or of the agent-side group of that name."""
    devices = [host_view(d) for d in devices if not revoked(d)]
    definition = groups.get(name)
    if definition is None:
        # An agent-side group. Once the registry enrols a device into it, it is the registry's: a device that
        # only claims it (its own report) is not a member.
        registered = any(enrolled(d) and name in d.groups for d in devices)
        return [d for d in devices if name in d.groups and (enrolled(d) or not registered)]
    selector = Selector.parse(definition.selector) if definition.selector else None
    static = set(definition.devices)
    return [
        d
        for d in devices
        if d.device_id in static
        or (selector is not None and selector.matches(d))
        or (enrolled(d) and name in d.groups)  # enrolled into it (`devices enroll --group`)
    ]


def require_members(name: str, groups: Mapping[str, GroupDef], devices: Sequence[DeviceRecord]) -> list[DeviceRecord]:
    members = group_members(name, groups, devices)
    if members:
        return members
    known = sorted(set(groups) | {g for d in devices for g in host_view(d).groups})
    where = "its definition matches" if name in groups else "no host-side group or agent --group has that name, and"
    raise EmptyGroupError(
        f"group {name!r} has no devices ({where} no device the control plane knows); "
        f"groups: {', '.join(known) or '(none)'}"
    )


def memberships(
    groups: Mapping[str, GroupDef], devices: Sequence[DeviceRecord], names: Iterable[str] = ()
) -> dict[str, set[str]]:
    """device id → the group names it belongs to, for every defined group plus the extra `names`."""
    devices = [host_view(d) for d in devices]
    # An unenrolled device's own report counts only for names the host neither defines nor enrols devices into
    # (agent-side groups of an open fleet).
    hosts = set(groups) | {g for d in devices if enrolled(d) and not revoked(d) for g in d.groups}
    result: dict[str, set[str]] = {
        d.device_id: set() if revoked(d) else set(d.groups) if enrolled(d) else set(d.groups) - hosts for d in devices
    }
    for name in set(groups) | set(names):
        for member in group_members(name, groups, devices):
            result[member.device_id].add(name)
    return result


def resolve_desired(
    device: DeviceRecord,
    deployments: Sequence[Deployment],
    groups: Mapping[str, GroupDef],
    member_of: Iterable[str],
    slot: str = DEFAULT_SLOT,
) -> Deployment | None:
    """The deployment that applies to one slot of `device`: device override > highest-priority group > fleet
    base, among the deployments of that slot only (another slot's never decides it). At each level the bundle for
    the device's own profile wins over one for a profile it refines (intel-x86-vnni over generic-x86-64), so the
    most specific bundle available is the one deployed; a slot removal (`ANY_PROFILE`) counts as the least
    specific at its level. The profile is the host registry's (`host_view`)."""
    device = host_view(device)
    if device.profile is None:
        return None
    chain = [*profile_lineage(device.profile), ANY_PROFILE]
    mine = sorted(
        (d for d in deployments if d.slot == slot and d.profile in chain), key=lambda d: chain.index(d.profile)
    )
    for deployment in mine:
        if deployment.scope == "device" and deployment.target == device.device_id:
            return deployment
    member = set(member_of)
    candidates = [d for d in mine if d.scope == "group" and d.target in member]
    if candidates:

        def rank(d: Deployment) -> tuple[int, str, int]:
            group = groups.get(d.target)
            return (-(group.priority if group else 0), d.target, chain.index(d.profile))

        return min(candidates, key=rank)
    for deployment in mine:
        if deployment.scope == "fleet" and deployment.target == FLEET_TARGET:
            return deployment
    return None


def resolve_slot_policy(
    device: DeviceRecord,
    policies: Sequence[SlotPolicy],
    groups: Mapping[str, GroupDef],
    member_of: Iterable[str],
    slot: str = DEFAULT_SLOT,
) -> SlotPolicy | None:
    """How one slot of `device` is scheduled: the device's own policy > its highest-priority group's > the
    fleet's, in the order of `resolve_desired` (a policy has no profile). None: the slot's default class."""
    mine = [p for p in policies if p.slot == slot]
    for policy in mine:
        if policy.scope == "device" and policy.target == device.device_id:
            return policy
    member = set(member_of)
    candidates = [p for p in mine if p.scope == "group" and p.target in member]
    if candidates:
        return min(candidates, key=lambda p: (-(groups[p.target].priority if p.target in groups else 0), p.target))
    return next((p for p in mine if p.scope == "fleet" and p.target == FLEET_TARGET), None)


__all__ = [
    "BUILTIN_KEYS",
    "EmptyGroupError",
    "Selector",
    "SelectorError",
    "device_labels",
    "enrolled",
    "enrolment_labels",
    "group_members",
    "host_view",
    "memberships",
    "parse_labels",
    "registry_warnings",
    "require_members",
    "resolve_desired",
    "resolve_slot_policy",
    "revoked",
]
