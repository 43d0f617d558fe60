"""`edgefleet convert MODEL --profile P… --calib D --eval D --out DIR`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from edgefleet.cli.common import add_json, default_key, fmt, print_json, print_table
from edgefleet.core.errors import ConversionError
from edgefleet.core.profiles import get_profile, load_profiles
from edgefleet.core.signing import SigningKey


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("convert", help="build one signed bundle per hardware profile")
    parser.add_argument("model", type=Path)
    parser.add_argument("--profile", action="append", required=True, help="repeat for several; 'all' for every one")
    parser.add_argument("--calib", type=Path, required=True, help=".npz calibration data (one key per input)")
    parser.add_argument("--eval", type=Path, required=True, help=".npz evaluation data, optional 'labels'")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--key", type=Path, default=None, help="signing key (default $EDGEFLEET_HOME/keys/signing.key)")
    parser.add_argument("--name", default=None, help="model name (default: from the file name)")
    parser.add_argument("--model-version", dest="model_version", default="1", help="dotted integers, e.g. 3 or 1.2.0")
    parser.add_argument("--max-drop", type=float, default=None, help="accuracy budget override for every profile")
    parser.add_argument("--threads", type=int, default=1, help="inference threads while measuring latency")
    add_json(parser)
    parser.set_defaults(func=cmd_convert)


def model_name_from(path: Path) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower()).strip("-._")[:64] or "model"


def cmd_convert(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from edgefleet.converter.build import ConvertRequest, convert

    names = list(load_profiles()) if "all" in args.profile else args.profile
    request = ConvertRequest(
        model=args.model,
        profiles=[get_profile(n) for n in names],
        calib=args.calib,
        eval=args.eval,
        out=args.out,
        key=SigningKey.load(args.key or default_key()),
        name=args.name or model_name_from(args.model),
        version=args.model_version,
        max_drop=args.max_drop,
        threads=args.threads,
    )
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("converting", total=None)
        results = convert(request, progress=lambda msg: bar.update(task, description=msg))
    if args.json:
        print_json({"model": str(args.model), "profiles": results})
    else:
        print_table(
            f"{request.name} {request.version}",
            ["profile", "recipe", "accuracy", "FP32", "median ms", "size KB", "bundle / error"],
            [
                (
                    r.profile,
                    r.recipe,
                    fmt(r.accuracy, 4),
                    fmt(r.reference_accuracy, 4),
                    fmt(r.latency_ms, 4),
                    fmt(r.size_bytes / 1e3 if r.size_bytes else None, 1),
                    r.bundle or r.error,
                )
                for r in results
            ],
        )
        for r in results:
            for c in r.candidates:
                if c.get("rejected"):
                    print(f"  {r.profile}: rejected {c['name']}: {c['rejected']}")
    if not any(r.bundle for r in results):
        raise ConversionError("no profile produced a bundle: " + "; ".join(f"{r.profile}: {r.error}" for r in results))
    return 0
