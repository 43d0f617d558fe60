"""What the agent's thread choice costs and what it picks: a bundle loaded with a fresh decision cache by an agent
left to choose (`threads=0`: the bundle's count timed against the runtime's default) and by one configured with
the bundle's count (nothing measured), alternating, several times.

    python bench/agent_threads.py BUNDLE --trust KEY.pub [--runs 5] [--json]

Prints a table (each run's load time, the count chosen and why) and the medians side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edgefleet.agent.runtime.model import LoadedModel  # noqa: E402
from edgefleet.agent.runtime.selection.threads import bundle_threads  # noqa: E402
from edgefleet.core.bundle.archive import unpack_bundle  # noqa: E402
from edgefleet.core.trust.signing import TrustedKeys  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--trust", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agent-threads-"))
    manifest = unpack_bundle(args.bundle, work / "bundle", TrustedKeys.load([args.trust]))
    counts = bundle_threads(manifest)
    configured = counts[0] if counts else 1
    rows = []
    for run in range(args.runs):
        for threads in (0, configured):
            model = LoadedModel(work / "bundle", manifest, threads, cache_dir=Path(tempfile.mkdtemp(dir=work)))
            rows.append({"run": run, "setting": threads, "load_ms": model.load_ms, "chosen": model.choice.threads,
                         "reason": model.choice.threads_reason})  # fmt: skip
            model.close()
    medians = {s: float(np.median([r["load_ms"] for r in rows if r["setting"] == s])) for s in (0, configured)}
    chose_default = sum(1 for r in rows if r["setting"] == 0 and r["chosen"] == 0)
    summary = {
        "bundle": manifest.bundle_id, "bundle_threads": counts, "median_load_ms": medians,
        "measuring_costs_ms": medians[0] - medians[configured], "runs_choosing_the_runtime_default": chose_default,
        "runs": rows,
    }  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{manifest.bundle_id}: bundle timed at {counts}")
    print("| run | agent threads | load ms | chosen | why |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['setting'] or 'auto'} | {r['load_ms']:.0f} | {r['chosen']} | {r['reason']} |")
    ratio = medians[0] / medians[configured]
    print(f"median load: auto {medians[0]:.0f} ms, configured {medians[configured]:.0f} ms ({ratio:.2f}×); "
          f"auto chose the runtime default in {chose_default}/{args.runs}")  # fmt: skip


if __name__ == "__main__":
    main()
