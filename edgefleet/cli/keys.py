"""`edgefleet keys generate` (bundle signing) and the broker credentials (see credentials.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgefleet.cli import credentials
from edgefleet.cli.common import add_json, edgefleet_home, print_json
from edgefleet.core.signing import SigningKey, generate_keypair


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("keys", help="signing keys, broker TLS certificates and the device ACL")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    gen = verbs.add_parser("generate", help="create an ed25519 signing key pair")
    gen.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to write NAME.key and NAME.pub (default $EDGEFLEET_HOME/keys, i.e. ~/.edgefleet/keys)",
    )
    gen.add_argument("--name", default="signing")
    add_json(gen)
    gen.set_defaults(func=cmd_generate)
    credentials.add_verbs(verbs)


def cmd_generate(args: argparse.Namespace) -> None:
    private, public = generate_keypair(args.dir or edgefleet_home() / "keys", args.name)
    key_id = SigningKey.load(private).key_id
    if args.json:
        print_json({"private_key": str(private), "public_key": str(public), "key_id": key_id})
    else:
        print(f"wrote {private} (keep it secret) and {public} (give it to devices); key id {key_id}")
