"""`edgefleet inspect MODEL [--profile P…] [--json]`: operators, signature, and per-profile verdicts."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgefleet.cli.common import add_json, print_json, print_table
from edgefleet.core.profiles import Profile, get_profile, load_profiles


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("inspect", help="what a model contains and what each profile's runtimes cannot run")
    parser.add_argument("model", type=Path)
    parser.add_argument("--profile", action="append", default=None, help="repeat for several (default: every one)")
    add_json(parser)
    parser.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    from edgefleet.converter import inspect_model
    from edgefleet.converter.generative import is_generative

    profiles = [get_profile(n) for n in args.profile] if args.profile else list(load_profiles().values())
    if is_generative(args.model):
        return _inspect_language_model(args, profiles)
    report = inspect_model(args.model, profiles)
    if args.json:
        print_json(report)
        return 0
    print(f"{report.model}: opsets {report.opsets}, {report.subgraph_ops} nodes inside If/Loop/Scan bodies")
    for role, specs in (("input", report.inputs), ("output", report.outputs)):
        for spec in specs:
            shape = ["?" if d is None else d for d in spec.shape]
            layout = f" ({report.layouts[spec.name]} image)" if role == "input" and spec.name in report.layouts else ""
            print(f"  {role} {spec.name}: {spec.dtype} {shape}{layout}")
    if report.custom_domains:
        print(f"  custom domains: {report.custom_domains}")
    if report.quantization:
        print(f"  arrives quantized: {report.quantization['summary']}")
    for rewrite in report.rewrites:
        print(f"  rewritten on load: {rewrite}")
    print_table(
        "operators",
        ["domain", "op", "opset", "count", "in subgraphs"],
        [(u.domain or "ai.onnx", u.op_type, u.opset, u.count, u.in_subgraphs) for u in report.operators],
    )
    rows = []
    for verdict in report.profiles:
        for target in verdict.targets:
            cannot = "; ".join(f"{u.op} ({u.reason})" for u in target.unsupported)
            notes = "; ".join(verdict.notes + target.notes)
            rows.append((verdict.profile, f"{target.runtime}/{target.format}", target.verdict, cannot, notes))
    print_table("profiles", ["profile", "target", "verdict", "cannot run", "notes"], rows)
    return 0


def _inspect_language_model(args: argparse.Namespace, profiles: list[Profile]) -> int:
    """A language model (a model directory, or an ONNX with past key/value inputs): what it is, and per profile
    the candidates `convert` would build."""
    from edgefleet.converter.generative import inspect_decoder

    report = inspect_decoder(args.model, profiles)
    if args.json:
        print_json(report)
        return 0
    parameters = f"{report['parameters']:,} parameters" if report["parameters"] else "parameters unknown"
    print(f"{report['path']}: {report['kind']}, {report['model_type']}, {parameters} ({report['precision']})")
    print(
        f"  {report['layers']} layers, hidden {report['hidden_size']}, {report['attention_heads']} heads / "
        f"{report['key_value_heads']} key-value heads (head dim {report['head_dim']}), "
        f"vocabulary {report['vocab_size']}, context {report['context_length']}"
    )
    print(f"  tokenizer {', '.join(map(str, report['tokenizer']))}; end tokens {report['eos_token_ids']}")  # type: ignore[call-overload]
    print(f"  OpenVINO export: {report['openvino']}")
    rows = []
    for verdict in report["profiles"]:  # type: ignore[attr-defined]
        targets = verdict["targets"]
        if isinstance(targets, str):
            rows.append((verdict["profile"], "", "", targets))
            continue
        for target in targets:
            not_built = "; ".join(f"{k}: {v}" for k, v in target["not_built"].items())
            rows.append((verdict["profile"], target["runtime"], ", ".join(target["candidates"]), not_built))
    print_table("profiles", ["profile", "runtime", "candidates", "not built"], rows)
    return 0
