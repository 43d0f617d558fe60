"""`edgefleet control audit`: the store's audit trail, newest first (who did what, from the dashboard or a shell)."""

from __future__ import annotations

import argparse
import dataclasses
import time

from edgefleet.cli.common import add_json, print_json, print_table
from edgefleet.cli.control.common import add_store, duration, open_from


def register_audit(verbs: argparse._SubParsersAction) -> None:
    audit = verbs.add_parser("audit", help="the audit trail: every action and refusal, with who and from where")
    audit.add_argument("--limit", type=int, default=50, help="newest entries to show")
    audit.add_argument("--actor", help="only this actor (token:NAME, cli:USER@HOST, anonymous)")
    audit.add_argument("--since", type=duration, default=None, help="only the last DURATION (e.g. 1h)")
    add_store(audit)
    add_json(audit)
    audit.set_defaults(func=cmd_control_audit)


def cmd_control_audit(args: argparse.Namespace) -> None:
    store = open_from(args)
    try:
        since = time.time() - args.since if args.since else 0.0
        entries = store.audit(limit=max(1, args.limit), actor=args.actor, since=since)
    finally:
        store.close()
    if args.json:
        print_json({"entries": [dataclasses.asdict(e) | {"detail": dict(e.detail)} for e in entries]})
        return
    print_table(
        f"audit trail ({len(entries)} newest)",
        ["time", "who", "via", "from", "action", "target", "outcome"],
        [(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.ts)), e.actor, e.via, e.remote, e.action, e.target,
          e.outcome) for e in entries],
    )  # fmt: skip
