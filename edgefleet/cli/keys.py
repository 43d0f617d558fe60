"""`edgefleet keys ...`: the root key, the bundle and ops role keys and the root-signed key set that delegates
them (see control/credentials/keyring.py); plus the broker credentials (see credentials.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from edgefleet.cli import credentials
from edgefleet.cli.common import add_json, print_json
from edgefleet.core.home import keys_dir
from edgefleet.core.trust.signing import SigningKey, generate_keypair


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("keys", help="signing keys and roles, broker TLS certificates and the device ACL")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help_text: str, func: Any) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help_text)
        p.add_argument("--dir", type=Path, default=None, help="key directory (default $EDGEFLEET_HOME/keys)")
        add_json(p)
        p.set_defaults(func=func)
        return p

    init = verb("init", "root, bundle and ops keys (those missing) and a key set delegating both roles", cmd_init)
    init.add_argument("--days", type=float, default=365.0, help="key set lifetime")
    gen = verb("generate", "create one ed25519 key pair (e.g. --name bundle on a converter machine)", cmd_generate)
    gen.add_argument("--name", default="bundle", help="root, bundle or ops (or any name for a loose key)")
    dele = verb("delegate", "sign a new key set (version + 1) naming the current bundle and ops keys", cmd_delegate)
    dele.add_argument("--days", type=float, default=365.0, help="key set lifetime")
    rot = verb("rotate", "replace a role key; the new key set reaches devices in the next offer/desired", cmd_rotate)
    rot.add_argument("--role", choices=["bundle", "ops", "release"], required=True)
    rot.add_argument("--days", type=float, default=365.0, help="key set lifetime")
    rev = verb("revoke", "never trust a key id again (a current role key is rotated in the same step)", cmd_revoke)
    rev.add_argument("key_id")
    rev.add_argument("--days", type=float, default=365.0, help="key set lifetime")
    verb("show", "the key set: version, expiry, the key ids of each role, revoked ids", cmd_show)
    credentials.add_verbs(verbs)


def _dir(args: argparse.Namespace) -> Path:
    return args.dir or keys_dir()


def _report(args: argparse.Namespace, what: str, info: dict[str, Any]) -> None:
    if args.json:
        print_json(info)
        return
    roles = "; ".join(f"{role}: {', '.join(ids)}" for role, ids in info["roles"].items())
    print(f"{what}: key set version {info['keyset_version']} in {info['directory']} (root {info['root_key_id']})")
    print(f"  roles: {roles}")
    if info["revoked"]:
        print(f"  revoked: {', '.join(info['revoked'])}")
    print("  keep root.key offline; devices pin root.pub (`edgefleet agent --trust root.pub`)")


def cmd_init(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.keyring import init

    _report(args, "initialised", init(_dir(args), days=args.days))


def cmd_generate(args: argparse.Namespace) -> None:
    private, public = generate_keypair(_dir(args), args.name)
    key_id = SigningKey.load(private).key_id
    if args.json:
        print_json({"private_key": str(private), "public_key": str(public), "key_id": key_id})
    else:
        print(f"wrote {private} (keep it secret, mode 0600) and {public}; key id {key_id}")


def cmd_delegate(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.keyring import delegate

    _report(args, "delegated", delegate(_dir(args), days=args.days))


def cmd_rotate(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.keyring import rotate

    _report(args, f"rotated the {args.role} key", rotate(_dir(args), args.role, days=args.days))


def cmd_revoke(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.keyring import revoke

    _report(args, f"revoked {args.key_id}", revoke(_dir(args), args.key_id, days=args.days))


def cmd_show(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.keyring import show

    _report(args, "key set", show(_dir(args)))
