"""`edgefleet convert MODEL --profile P… --calib D --eval D --out DIR`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.cli.common import add_json, default_key, edgefleet_home, fmt, print_json, print_table
from edgefleet.cli.convert.farm import add_farm_options, farm_from, print_farm
from edgefleet.core.bundle.manifest import GoldenHold, ResourceNeeds
from edgefleet.core.errors import ConversionError, UserInputError
from edgefleet.core.profiles import get_profile, load_profiles
from edgefleet.core.trust.signing import SigningKey

if TYPE_CHECKING:
    from edgefleet.converter import ProfileResult

DEFAULT_TIME_BUDGET_S = 60.0  # --time-budget when none is given, for an ONNX model (0: no limit)
DEFAULT_LM_TIME_BUDGET_S = 900.0  # ... for a language model (converter/generative/conversion.py: how it is spent)

# The language-model defaults, for the help only (the converter applies its own, converter/generative/bars.py; the
# CLI imports no converter module until it converts: tests/unit/converter/generative/test_generative_cli.py keeps
# the two equal).
DEFAULT_MAX_PERPLEXITY_RATIO = 1.05
DEFAULT_MIN_NEXT_TOKEN_AGREEMENT = 0.80
DEFAULT_PROMPT_TOKENS = 64
DEFAULT_OUTPUT_TOKENS = 32


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("convert", help="build one signed bundle per hardware profile")
    parser.add_argument(
        "model", type=Path, help="an ONNX file, or a language model: a Hugging Face model directory (or a GenAI export)"
    )
    parser.add_argument("--profile", action="append", required=True, help="repeat for several; 'all' for every one")
    parser.add_argument(
        "--calib", type=Path, required=True, help=".npz calibration data (one key per input); a language model: text"
    )
    parser.add_argument(
        "--eval",
        type=Path,
        required=True,
        help=".npz evaluation data (optional 'labels'); language model: text",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--key", type=Path, default=None, help="bundle key (default $EDGEFLEET_HOME/keys/bundle.key)")
    parser.add_argument("--name", default=None, help="model name (default: from the file name)")
    parser.add_argument("--model-version", dest="model_version", default="1", help="dotted integers, e.g. 3 or 1.2.0")
    parser.add_argument("--max-drop", type=float, default=None, help="accuracy budget override for every profile")
    parser.add_argument("--threads", type=int, default=1, help="inference threads while measuring latency")
    parser.add_argument(
        "--metric",
        default=None,
        help="task metric: top1, argmax-agreement, topK, per-position-agreement, ctc-char-accuracy@BLANK, mask-iou@T, "
        "mask-iou-mae@T, mask-f1@T, mask-f1-mae@T, cosine, sqnr-db, prob-mae, relative-error, detection-f1, or "
        "path.py:function(reference_outputs, candidate_outputs, labels) -> score (default: by the output's kind)",
    )
    parser.add_argument("--min-score", type=float, default=None, help="absolute bar on the metric (else --max-drop)")
    parser.add_argument(
        "--time-budget", type=float, default=None, metavar="SECONDS",
        help=f"the conversion's wall time: builds stop so that it ends within about this (default "
        f"{DEFAULT_TIME_BUDGET_S:g} s, {DEFAULT_LM_TIME_BUDGET_S:g} s for a language model; 0: no limit); an ONNX "
        "model's FP32 is always built, the report names what was not tried",
    )  # fmt: skip
    parser.add_argument(
        "--no-prune", dest="prune", action="store_false",
        help="build, score and time every candidate, even those that cannot win (slower; a fuller report)",
    )  # fmt: skip
    parser.add_argument("--min-sqnr", type=float, default=None, help="SQNR floor (dB) override for non-classifiers")
    parser.add_argument(
        "--pin", action="append", default=[], metavar="INPUT=VALUE", help="declare an input constant, e.g. sr=16000"
    )
    parser.add_argument("--fix-dim", action="append", default=[], metavar="DIM=N", help="fix a symbolic dimension")
    parser.add_argument(
        "--input-shape", action="append", default=[], metavar="INPUT=D1,D2,..", help="fix an input's whole shape"
    )
    parser.add_argument("--runtime", action="append", default=None, help="only targets of this runtime (repeat)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="build cache (default $EDGEFLEET_HOME/cache)")
    parser.add_argument("--no-cache", action="store_true", help="build every candidate afresh")
    parser.add_argument(
        "--custom-ops",
        choices=["decompose", "host", "keep"],
        default="decompose",
        help="custom operators: standard-op decompositions where known (default), keep them on runtimes that load "
        "them (host), or never decompose (keep)",
    )
    parser.add_argument(
        "--torch-model",
        type=Path,
        default=None,
        help="CoreML targets: your torch model (.pt2 torch.export or .pt TorchScript) instead of onnx2torch",
    )
    language = parser.add_argument_group("language models (a model directory; --calib and --eval are text files)")
    language.add_argument(
        "--max-perplexity-ratio", type=float, default=None, metavar="R",
        help=f"candidate perplexity / FP32's on the held-out text at most R (default {DEFAULT_MAX_PERPLEXITY_RATIO})",
    )  # fmt: skip
    language.add_argument(
        "--min-next-token-agreement", type=float, default=None, metavar="A",
        help="share of positions whose most likely next token is FP32's, at least A "
        f"(default {DEFAULT_MIN_NEXT_TOKEN_AGREEMENT})",
    )  # fmt: skip
    language.add_argument(
        "--prompt-tokens", type=int, default=None, metavar="N",
        help=f"time to first token is timed for an N-token prompt (default {DEFAULT_PROMPT_TOKENS})",
    )  # fmt: skip
    language.add_argument(
        "--output-tokens", type=int, default=None, metavar="N",
        help=f"time per output token is timed over N generated tokens (default {DEFAULT_OUTPUT_TOKENS})",
    )  # fmt: skip
    add_farm_options(parser)
    add_json(parser)
    parser.set_defaults(func=cmd_convert)


def golden_cell(golden: dict[str, object] | None) -> str:
    """The golden agreement the rollout will hold, against its floor ("0.984 ≥ 0.980")."""
    if not golden:
        return "-"
    held = GoldenHold.model_validate(golden)
    return f"{held.agreement:.3f} {'≥' if held.passed else '<'} {held.floor:.3f}"


def _print_generative(results: list[ProfileResult]) -> None:
    """Language models: every candidate's quality, token latency and share of the bandwidth limit (the reasons
    for the others follow, as for any model)."""
    for r in results:
        rows = [c for c in r.candidates if "perplexity_ratio" in c]
        if rows:
            print_table(
                f"{r.profile}: language-model candidates",
                ["candidate", "ppl ratio", "next-token", "TTFT ms", "TPOT ms", "size KB", "% of limit", ""],
                [_generative_row(c) for c in rows],
            )


def _generative_row(row: dict[str, object]) -> tuple[object, ...]:
    def number(key: str, digits: int, scale: float = 1.0) -> str | None:
        value = row.get(key)
        return fmt(float(value) * scale, digits) if isinstance(value, int | float) else None

    return (
        row["name"], number("perplexity_ratio", 4), number("next_token_agreement", 4), number("ttft_ms", 3),
        number("tpot_ms", 4), number("size_bytes", 1, 1e-3), number("limit_pct", 1), "chosen" if row["chosen"] else "",
    )  # fmt: skip


def model_name_from(path: Path) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower()).strip("-._")[:64] or "model"


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UserInputError(f"{what} {item!r}: write NAME=VALUE")
        pairs[name] = value
    return pairs


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as err:
        raise UserInputError(f"{what} {text!r}: not integers") from err


def cmd_convert(args: argparse.Namespace) -> int:
    from edgefleet.cli.convert.progress import convert_progress
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.converter.generative.source import is_generative

    names = list(load_profiles()) if "all" in args.profile else args.profile
    budget = args.time_budget
    if budget is None:
        budget = DEFAULT_LM_TIME_BUDGET_S if is_generative(args.model) else DEFAULT_TIME_BUDGET_S
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
        min_sqnr_db=args.min_sqnr,
        pins=_pairs(args.pin, "--pin"),
        fix_dims={k: _ints(v, "--fix-dim")[0] for k, v in _pairs(args.fix_dim, "--fix-dim").items()},
        input_shapes={k: _ints(v, "--input-shape") for k, v in _pairs(args.input_shape, "--input-shape").items()},
        runtimes=tuple(args.runtime) if args.runtime else None,
        cache_dir=None if args.no_cache else (args.cache_dir or edgefleet_home() / "cache" / "convert"),
        custom_ops=args.custom_ops,
        torch_model=args.torch_model,
        metric=args.metric,
        min_score=args.min_score,
        time_budget_s=budget or None,
        prune=args.prune,
        max_perplexity_ratio=args.max_perplexity_ratio,
        min_next_token_agreement=args.min_next_token_agreement,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
    )
    with farm_from(args) as farm, convert_progress() as progress:
        results = convert(request, progress=progress, farm=farm)
    if args.json:
        print_json({"model": str(args.model), "profiles": results})
    else:
        print_table(
            f"{request.name} {request.version}",
            ["profile", "recipe", "accuracy", "FP32", "golden ≥ floor", "median ms", "size KB", "bundle / error"],
            [
                (
                    r.profile,
                    r.recipe,
                    fmt(r.accuracy, 4),
                    fmt(r.reference_accuracy, 4),
                    golden_cell(r.golden),
                    fmt(r.latency_ms, 4),
                    fmt(r.size_bytes / 1e3 if r.size_bytes else None, 1),
                    r.bundle or r.error,
                )
                for r in results
            ],
        )
        for r in results:
            if r.golden:
                print(f"  {r.profile}: {GoldenHold.model_validate(r.golden).summary()}")
            if r.resources:
                print(f"  {r.profile}: {ResourceNeeds.model_validate(r.resources).summary()}")
            for note in r.notes:
                print(f"  {r.profile}: {note}")
        for r in results:  # what --time-budget cut (converter.deadline), also in the report
            cuts = r.time_budget.get("cut") if r.time_budget else None
            for cut in cuts if isinstance(cuts, list) else []:
                print(f"  {r.profile}: time budget cut {cut['what']}: {cut['how']}")
        for r in results:
            print_farm(r.profile, r.farm)
        _print_generative(results)
        for r in results:
            for c in r.candidates:
                if c.get("rejected"):
                    print(f"  {r.profile}: rejected {c['name']}: {c['rejected']}")
    if not any(r.bundle for r in results):
        raise ConversionError("no profile produced a bundle: " + "; ".join(f"{r.profile}: {r.error}" for r in results))
    return 0
