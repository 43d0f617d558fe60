"""`edgefleet bundle show|verify FILE`."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgefleet.cli.common import add_json, edgefleet_home, print_json
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest, verify_bundle
from edgefleet.core.trust.signing import TrustedKeys


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bundle", help="inspect and verify bundles")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    show = verbs.add_parser("show", help="print the manifest (not verified)")
    show.add_argument("file", type=Path)
    add_json(show)
    show.set_defaults(func=cmd_show)
    verify = verbs.add_parser("verify", help="check the signature and every file's hash")
    verify.add_argument("file", type=Path)
    verify.add_argument(
        "--trust",
        type=Path,
        action="append",
        default=None,
        help="public key file or directory of *.pub (default $EDGEFLEET_HOME/keys)",
    )
    add_json(verify)
    verify.set_defaults(func=cmd_verify)


def cmd_show(args: argparse.Namespace) -> None:
    signed = read_signed_manifest(args.file)
    manifest = parse_manifest(signed.manifest_json)
    if args.json:
        print_json({"manifest": manifest, "key_id": signed.key_id})
        return
    acc = manifest.accuracy
    print(
        f"bundle    {manifest.bundle_id}\nmodel     {manifest.model_name} {manifest.model_version}\n"
        f"profile   {manifest.profile} ({manifest.format}, providers {', '.join(manifest.providers)})\n"
        f"recipe    {manifest.recipe.name} [{', '.join(p.name for p in manifest.recipe.passes)}]\n"
        f"accuracy  {acc.metric} {acc.value:.4f} (FP32 {acc.reference:.4f}, budget -{acc.budget:.4f}, "
        f"{acc.samples} samples)"
    )
    if manifest.golden_hold:
        print(f"golden    {manifest.golden_hold.summary()} ({manifest.golden_hold.runtime})")
    if manifest.latency:
        print(f"latency   {manifest.latency.median_ms:.4f} ms median on {manifest.latency.machine}")
    if manifest.resources:
        print(f"needs     {manifest.resources.summary()}")
    print(f"signed by {signed.key_id}\nfiles")
    for entry in manifest.files:
        print(f"  {entry.path:24} {entry.size:>10} B  {entry.sha256[:16]}…")


def cmd_verify(args: argparse.Namespace) -> None:
    trusted = TrustedKeys.load(args.trust or [edgefleet_home() / "keys"])
    manifest = verify_bundle(args.file, trusted)
    if args.json:
        print_json({"ok": True, "bundle_id": manifest.bundle_id, "files": len(manifest.files)})
    else:
        print(f"ok: {manifest.bundle_id} is signed by a trusted key and all {len(manifest.files)} files match")
