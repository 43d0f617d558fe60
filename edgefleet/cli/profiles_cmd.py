"""`edgefleet profiles list|show|detect|schema`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from edgefleet.cli.common import add_json, print_json, print_table
from edgefleet.core.profiles import (
    HostFacts,
    Profile,
    detect,
    get_profile,
    int8_notes,
    load_profiles,
    match_reasons,
    match_summary,
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("profiles", help="hardware profiles")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every profile")
    add_json(listing)
    listing.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="one profile in full")
    show.add_argument("name")
    add_json(show)
    show.set_defaults(func=cmd_show)
    found = verbs.add_parser("detect", help="which profiles match this machine, and why the others do not")
    add_json(found)
    found.set_defaults(func=cmd_detect)
    schema = verbs.add_parser("schema", help="the JSON schema of a profile file (for editors)")
    schema.set_defaults(func=lambda _a: print(json.dumps(Profile.model_json_schema(), indent=2)))


def cmd_list(args: argparse.Namespace) -> None:
    profiles = load_profiles()
    if args.json:
        print_json(list(profiles.values()))
        return
    print_table(
        "profiles",
        ["name", "runtimes", "precisions", "description"],
        [
            (
                p.name,
                ", ".join(t.runtime for t in p.targets),
                ", ".join(dict.fromkeys(x for t in p.targets for x in t.precisions)),
                p.description,
            )
            for p in profiles.values()
        ],
    )


def cmd_show(args: argparse.Namespace) -> None:
    profile = get_profile(args.name)
    if args.json:
        print_json(profile)
    else:
        print(profile.model_dump_json(indent=2))


def cmd_detect(args: argparse.Namespace) -> None:
    profiles = list(load_profiles().values())
    facts = HostFacts.probe(f for p in profiles for f in p.match.files)
    matching = detect(profiles, facts)
    others = sorted((p for p in profiles if p not in matching), key=lambda p: p.name)
    verdicts: list[dict[str, Any]] = [
        {"profile": p.name, "matches": True, "rank": rank, "why": match_summary(p), "why_not": [],
         "notes": int8_notes(p, facts)}
        for rank, p in enumerate(matching, 1)
    ] + [
        {"profile": p.name, "matches": False, "rank": None, "why": "", "why_not": match_reasons(p, facts),
         "notes": []}
        for p in others
    ]  # fmt: skip
    if args.json:
        print_json(
            {
                "best": matching[0].name if matching else None,
                "matching": [p.name for p in matching],
                "verdicts": verdicts,
                "facts": {"arch": facts.arch, "os": facts.os, "providers": sorted(facts.providers)},
            }
        )
        return
    print_table(
        f"profiles on this machine ({facts.arch}, {facts.os}), most specific first",
        ["profile", "matches", "why"],
        [
            (
                v["profile"],
                ("best" if v["rank"] == 1 else f"yes ({v['rank']})") if v["matches"] else "no",
                "; ".join([v["why"], *v["notes"]]) if v["why"] else "; ".join(v["why_not"]),
            )
            for v in verdicts
        ],
    )
