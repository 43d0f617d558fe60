"""`edgefleet desired list|set|clear|remove|schedule`: desired state in the store, per slot (a fleet-wide base, group
deployments, device overrides of each model a device runs); the control plane publishes it, signed, one retained
document per slot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_broker, add_json, print_json, print_table
from edgefleet.cli.control.common import add_store, open_from, publish_bundles

if TYPE_CHECKING:
    from edgefleet.control.store import Scope


def register(sub: argparse._SubParsersAction) -> None:
    _register_desired(sub)


# --- desired state
def _register_desired(sub: argparse._SubParsersAction) -> None:
    desired = sub.add_parser("desired", help="desired state: a fleet-wide base, group deployments, device overrides")
    verbs = desired.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every deployment, most specific first")
    add_store(listing)
    add_json(listing)
    listing.set_defaults(func=cmd_desired_list)
    put = verbs.add_parser("set", help="publish a bundle and make it desired for the fleet, a group or a device")
    put.add_argument("bundle", type=Path)
    scope = put.add_mutually_exclusive_group(required=True)
    scope.add_argument("--fleet", action="store_true", help="the base deployment for the bundle's profile")
    scope.add_argument("--group", help="a group's deployment")
    scope.add_argument("--device", help="a device override")
    put.add_argument("--rollback", action="store_true", help="allow devices to go back to an older version")
    put.add_argument("--slot", default="default", help="the slot (model) to set; other slots are left alone")
    add_broker(put)
    add_store(put)
    add_json(put)
    put.set_defaults(func=cmd_desired_set)
    clear = verbs.add_parser("clear", help="remove a deployment (the next less specific one applies)")
    scope = clear.add_mutually_exclusive_group(required=True)
    scope.add_argument("--fleet", action="store_true")
    scope.add_argument("--group")
    scope.add_argument("--device")
    clear.add_argument("--profile", help="only this profile's deployment")
    clear.add_argument("--slot", help="only this slot's deployment (default: every slot of the target)")
    add_store(clear)
    clear.set_defaults(func=cmd_desired_clear)
    remove = verbs.add_parser(
        "remove", help="a signed decision that devices stop serving a slot and unload it (`clear --slot` undoes it)"
    )
    scope = remove.add_mutually_exclusive_group(required=True)
    scope.add_argument("--fleet", action="store_true")
    scope.add_argument("--group")
    scope.add_argument("--device")
    remove.add_argument("--slot", required=True, help="the slot (model) to remove")
    add_store(remove)
    add_json(remove)
    remove.set_defaults(func=cmd_desired_remove)
    schedule = verbs.add_parser(
        "schedule",
        help="how devices schedule a slot: its class (real-time with a p95 objective, interactive, batch); "
        "published with the slot's desired state, kept across its rollouts",
    )
    scope = schedule.add_mutually_exclusive_group(required=True)
    scope.add_argument("--fleet", action="store_true")
    scope.add_argument("--group")
    scope.add_argument("--device")
    schedule.add_argument("--slot", required=True, help="the slot (model)")
    what = schedule.add_mutually_exclusive_group(required=True)
    what.add_argument("--class", dest="slot_class", choices=("real-time", "interactive", "batch"),
                      help="real-time: starts at once, others yield to it; interactive: yields between steps "
                      "(tokens) while real-time work waits; batch: runs in what is left")  # fmt: skip
    what.add_argument("--clear", action="store_true", help="withdraw this target's policy of the slot")
    schedule.add_argument("--objective-ms", type=float,
                          help="a real-time slot's p95 latency objective (the neighbour guardrail's bar)")  # fmt: skip
    add_store(schedule)
    add_json(schedule)
    schedule.set_defaults(func=cmd_desired_schedule)


def cmd_desired_list(args: argparse.Namespace) -> None:
    store = open_from(args)
    try:
        order = {"device": 0, "group": 1, "fleet": 2}
        rows = sorted(store.deployments(), key=lambda d: (order[d.scope], d.target, d.slot, d.profile))
        policies = sorted(store.slot_policies(), key=lambda p: (order[p.scope], p.target, p.slot))
    finally:
        store.close()
    if args.json:
        print_json({"deployments": rows, "slot_policies": policies})
        return
    print_table(
        "desired state (device overrides, then groups, then the fleet base)",
        ["scope", "target", "slot", "profile", "bundle", "version", "rollback", "source"],
        [(d.scope, d.target, d.slot, d.profile, "(removed)" if d.remove else d.bundle_id, d.model_version,
          "yes" if d.rollback else "", d.source)
         for d in rows],
    )  # fmt: skip
    if policies:
        print_table(
            "how slots are scheduled (a slot with no policy is interactive)",
            ["scope", "target", "slot", "class", "objective ms"],
            [(p.scope, p.target, p.slot, p.slot_class, "-" if p.latency_objective_ms is None
              else f"{p.latency_objective_ms:g}") for p in policies],
        )  # fmt: skip


def cmd_desired_set(args: argparse.Namespace) -> None:
    from edgefleet.control import operations as ops

    scope: Scope = "fleet" if args.fleet else "group" if args.group else "device"
    target = None if args.fleet else (args.group or args.device)
    store = open_from(args)
    try:
        (manifest,) = publish_bundles(args, store, [args.bundle])
        (record,) = ops.published_bundles(store, [manifest.bundle_id])
        deployment = ops.set_desired(store, ops.Operator.shell(), scope, target, record, args.rollback, args.slot)
    finally:
        store.close()
    if args.json:
        print_json(deployment)
    else:
        print(f"{manifest.bundle_id} desired in slot {deployment.slot} for {scope} {deployment.target} "
              f"({manifest.profile}); the control plane publishes it")  # fmt: skip


def cmd_desired_clear(args: argparse.Namespace) -> None:
    from edgefleet.control import operations as ops

    scope: Scope = "fleet" if args.fleet else "group" if args.group else "device"
    store = open_from(args)
    try:
        removed = ops.clear_desired(
            store, ops.Operator.shell(), scope, args.group or args.device, args.profile, args.slot
        )
    finally:
        store.close()
    print(f"removed {removed} deployment(s) of {scope} {args.group or args.device or 'fleet'}")


def cmd_desired_remove(args: argparse.Namespace) -> None:
    from edgefleet.control import operations as ops

    scope: Scope = "fleet" if args.fleet else "group" if args.group else "device"
    store = open_from(args)
    try:
        deployment = ops.remove_slot(store, ops.Operator.shell(), scope, args.group or args.device, args.slot)
    finally:
        store.close()
    if args.json:
        print_json(deployment)
    else:
        print(f"slot {deployment.slot} removed for {scope} {deployment.target}; the control plane publishes the "
              "signed removal")  # fmt: skip


def cmd_desired_schedule(args: argparse.Namespace) -> None:
    from edgefleet.control import operations as ops

    scope: Scope = "fleet" if args.fleet else "group" if args.group else "device"
    target = args.group or args.device
    store = open_from(args)
    try:
        if args.clear:
            ops.clear_slot_policy(store, ops.Operator.shell(), scope, target, args.slot)
            policy = None
        else:
            policy = ops.set_slot_policy(
                store, ops.Operator.shell(), scope, target, args.slot, args.slot_class, args.objective_ms
            )
    finally:
        store.close()
    if args.json:
        print_json({"slot_policy": policy})
    elif policy is None:
        print(f"slot {args.slot} of {scope} {target or 'fleet'}: policy withdrawn (the next less specific applies)")
    else:
        objective = f", p95 objective {policy.latency_objective_ms:g} ms" if policy.latency_objective_ms else ""
        print(f"slot {policy.slot} of {scope} {policy.target}: {policy.slot_class}{objective}; the control plane "
              "publishes it with the slot's desired state")  # fmt: skip
