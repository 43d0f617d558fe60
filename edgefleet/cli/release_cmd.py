"""`edgefleet release build|show|verify|publish`: the agent's own releases (core/release/, docs/agent.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgefleet.cli.common import add_broker, add_json, connect, print_json
from edgefleet.core.home import keys_dir


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("release", help="agent releases: the agent's wheel set, signed by the release key")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    build = verbs.add_parser("build", help="pin and sign a wheel set (edgefleet and its dependencies) into a release")
    build.add_argument("--wheels", type=Path, required=True, help="folder of wheels: edgefleet VERSION and its deps")
    build.add_argument("--version", required=True, help="the edgefleet version the release installs")
    build.add_argument("--requirement", default="edgefleet[cpu]", help="what pip installs (default edgefleet[cpu])")
    build.add_argument("--python", default=None, help="major.minor the wheels are for (default: this Python)")
    build.add_argument("--platform", default=None, help="sys.platform-machine (default: this machine's)")
    build.add_argument("--key", type=Path, default=None, help="release key (default $EDGEFLEET_HOME/keys/release.key)")
    build.add_argument("--out", type=Path, required=True, help="the release file to write")
    add_json(build)
    build.set_defaults(func=cmd_build)

    show = verbs.add_parser("show", help="a release's manifest (not verified)")
    show.add_argument("release", type=Path)
    add_json(show)
    show.set_defaults(func=cmd_show)

    verify = verbs.add_parser("verify", help="check a release against the key set's release keys, and every pin")
    verify.add_argument("release", type=Path)
    verify.add_argument("--dir", type=Path, default=None, help="key directory (default $EDGEFLEET_HOME/keys)")
    add_json(verify)
    verify.set_defaults(func=cmd_verify)

    publish = verbs.add_parser("publish", help="publish a release's chunks and its signed offer (retained)")
    publish.add_argument("release", type=Path)
    add_broker(publish)
    add_json(publish)
    publish.set_defaults(func=cmd_publish)


def cmd_build(args: argparse.Namespace) -> None:
    from edgefleet.core.release import build_release
    from edgefleet.core.trust.signing import SigningKey

    key = SigningKey.load(args.key or keys_dir() / "release.key")
    manifest = build_release(args.wheels, args.version, key, args.out, requirement=args.requirement,
                             python=args.python, platform_tag=args.platform)  # fmt: skip
    if args.json:
        print_json({"release_id": manifest.release_id, "out": str(args.out), "files": len(manifest.files)})
    else:
        print(f"wrote {args.out}: {manifest.release_id}, {len(manifest.files)} wheels, signed by {key.key_id}")


def cmd_show(args: argparse.Namespace) -> None:
    from edgefleet.core.release import parse_release_manifest, read_release

    signed = read_release(args.release)
    manifest = parse_release_manifest(signed.manifest_json)
    if args.json:
        print_json({**manifest.model_dump(), "key_id": signed.key_id})
        return
    print(f"{manifest.release_id}: edgefleet {manifest.version} ({manifest.install_spec}) for Python "
          f"{manifest.python} on {manifest.platform}, signed by {signed.key_id}")  # fmt: skip
    for entry in manifest.files:
        print(f"  {entry.name}  {entry.size} bytes  sha256 {entry.sha256[:16]}")


def cmd_verify(args: argparse.Namespace) -> None:
    from edgefleet.control.credentials.keyring import HostKeys
    from edgefleet.control.publish.release import verify_with_keyset

    manifest = verify_with_keyset(args.release, HostKeys(args.dir or keys_dir()))
    if args.json:
        print_json({"release_id": manifest.release_id, "verified": True})
    else:
        print(f"{manifest.release_id}: signature by a delegated release key and all {len(manifest.files)} pins ok")


def cmd_publish(args: argparse.Namespace) -> None:
    from edgefleet.control.publish.release import publish_release

    conn, topics = connect(args, "release publish")
    try:
        manifest, offer, published = publish_release(conn, topics, args.release)
    finally:
        conn.stop()
    chunks = offer.transfer.chunk_count or len(offer.transfer.chunks)
    if args.json:
        print_json({"release_id": manifest.release_id, "bytes": offer.transfer.size, "chunks": chunks,
                    "published": published})  # fmt: skip
    else:
        print(f"published {manifest.release_id}: {offer.transfer.size} bytes in {chunks} chunks "
              f"({published} new on the broker)")  # fmt: skip
