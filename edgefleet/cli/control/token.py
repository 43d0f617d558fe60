"""`edgefleet control token`: issue, list and revoke the operator tokens the dashboard and its API require."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from edgefleet.cli.common import add_json, print_json, print_table
from edgefleet.cli.control.common import add_store, duration, open_from
from edgefleet.core.errors import UserInputError


def register_token(verbs: argparse._SubParsersAction) -> None:
    token = verbs.add_parser(
        "token", help="issue an operator token for the dashboard (only its sha256 is stored), or list/revoke them"
    )
    token.add_argument("--name", default="operator", help="who the token is for; the audit trail names them")
    token.add_argument("--ttl", type=duration, default=None, help="expire after this long (e.g. 12h, 90d)")
    token.add_argument("--list", action="store_true", help="list tokens (names and dates, never secrets)")
    token.add_argument("--revoke", metavar="NAME", help="revoke this name's token (its sessions end at once)")
    token.add_argument(
        "--login-url", metavar="URL", nargs="?", const="http://127.0.0.1:8780/",
        help="also print a link that logs a browser in under the new token (the dashboard's address, default "
        "http://127.0.0.1:8780/): the link holds a one-time code that ends at its first use or in 5 minutes, "
        "never the token, so it may be passed to a browser on its command line",
    )  # fmt: skip
    add_store(token)
    add_json(token)
    token.set_defaults(func=cmd_control_token)


def cmd_control_token(args: argparse.Namespace) -> None:
    from edgefleet.control.dashboard.auth import issue_token
    from edgefleet.control.operations import Operator, audited
    from edgefleet.control.store.url import redacted

    store = open_from(args)
    try:
        if args.list:
            rows: list[dict[str, Any]] = [
                {"name": t.name, "created_at": t.created_at, "expires_at": t.expires_at, "revoked_at": t.revoked_at,
                 "valid": t.valid(time.time())}
                for t in store.tokens()
            ]  # fmt: skip
            if args.json:
                print_json({"tokens": rows})
            else:
                print_table("dashboard tokens", ["name", "created", "expires", "state"], [
                    (r["name"], _when(r["created_at"]), _when(r["expires_at"]) or "never",
                     "valid" if r["valid"] else "revoked" if r["revoked_at"] else "expired")
                    for r in rows
                ])  # fmt: skip
            return
        who = Operator.shell()
        if args.revoke:
            with audited(store, who, "token.revoke", args.revoke):
                if not store.revoke_token(args.revoke, time.time()):
                    raise UserInputError(f"no live token named {args.revoke!r}")
            print_json({"revoked": args.revoke}) if args.json else print(f"token {args.revoke} revoked")
            return
        with audited(store, who, "token.issue", args.name, ttl_s=args.ttl):
            secret = issue_token(store, args.name, args.ttl)
        link = None
        if args.login_url:
            from urllib.parse import quote

            from edgefleet.control.dashboard.auth import new_login_link

            link = f"{args.login_url.rstrip('/')}/login?code={quote(new_login_link(store, secret))}"
    finally:
        store.close()
    if args.json:
        print_json(
            {"name": args.name, "token": secret, "store": redacted(args.store)} | ({"login_url": link} if link else {})
        )
    elif link:
        print(link)
        print(f"(a login link for {args.name!r}: it works once, within 5 minutes; the token itself is not shown)",
              file=sys.stderr)  # fmt: skip
    else:
        print(secret)
        print(
            f"(token for {args.name!r}, shown once; the store {redacted(args.store)} keeps only its sha256. Log in "
            "to the dashboard with it, or send it as 'Authorization: Bearer TOKEN'.)",
            file=sys.stderr,
        )


def _when(ts: float | None) -> str | None:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else None
