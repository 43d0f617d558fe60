"""bench/transfer.py from two trees, run alternately: this tree's chunked layout against a baseline's, same machine.

    python bench/transfer_ab.py --baseline-repo /tmp/base [--runs 3] [--rounds 3] [--mb 16] [--json out.json]

Runs `bench/transfer.py --kill-trials 0 --cap 0 --fleet 0` (raw, blocks and chunks interleaved within each run) of
the baseline tree, then of this tree, `--runs` times over, each with PYTHONPATH set to its tree (its device process
inherits it). Reports, per tree, the medians over all its rounds of: raw broker time, chunked publish, chunked end to
end and the device's fetch alone (end to end minus publish), with the ratios to raw computed per round (the same
round's raw: the load of the moment cancels), and the load average at the start and end. A baseline is a copy of
another commit, e.g. `git archive main | tar -x -C /tmp/base`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run(tree: Path, mb: float, rounds: int) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        command = [sys.executable, str(tree / "bench" / "transfer.py"), "--mb", str(mb), "--rounds", str(rounds),
                   "--kill-trials", "0", "--cap", "0", "--fleet", "0", "--json", out.name]  # fmt: skip
        subprocess.run(command, env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
        return list(json.loads(Path(out.name).read_text())["rounds_detail"])


def summary(rounds: list[dict], mb: float) -> dict:
    med = statistics.median
    fetch = [r["chunked_s"] - r["chunked_publish_s"] for r in rounds]
    return {
        "rounds": len(rounds),
        "raw_s": round(med(r["raw_s"] for r in rounds), 3),
        "raw_mb_s": round(mb * 2**20 / 1e6 / med(r["raw_s"] for r in rounds), 1),
        "chunked_publish_s": round(med(r["chunked_publish_s"] for r in rounds), 3),
        "chunked_fetch_s": round(med(fetch), 3),
        "chunked_s": round(med(r["chunked_s"] for r in rounds), 3),
        "ratio_chunked": round(med(r["ratio_chunked"] for r in rounds), 3),
        "ratio_chunked_fetch": round(med(r["ratio_chunked_fetch"] for r in rounds), 3),
        "ratio_overlapped_blocks": round(med(r["ratio_overlapped"] for r in rounds), 3),
        "ratio_chunked_offer_first": (
            round(med(r["ratio_chunked_offer_first"] for r in rounds), 3)
            if all("ratio_chunked_offer_first" in r for r in rounds)
            else "-"  # a baseline without tests/support/publishing/offer_first_chunks.py
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-repo", type=Path, required=True, help="a copy of the tree to compare against")
    parser.add_argument("--runs", type=int, default=3, help="alternations (baseline, this tree) to run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per bench/transfer.py run")
    parser.add_argument("--mb", type=float, default=16.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trees = {"baseline": args.baseline_repo.resolve(), "this tree": REPO}
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    load_start = os.getloadavg()
    for run in range(args.runs):
        for name, tree in trees.items():
            rounds[name] += one_run(tree, args.mb, args.rounds)
            print(f"run {run + 1}/{args.runs}: {name} done", file=sys.stderr)
    load_end = os.getloadavg()
    report = {name: summary(r, args.mb) for name, r in rounds.items()}
    report["load_average_start_end"] = [round(load_start[0], 2), round(load_end[0], 2)]
    base, new = report["baseline"], report["this tree"]
    print(f"{'chunked layout, ' + str(args.mb) + ' MB, medians':44} {'baseline':>10} {'this tree':>10}")
    for key, label in [("raw_mb_s", "raw broker MB/s"), ("chunked_publish_s", "chunked publish, s"),
                       ("chunked_fetch_s", "chunked device fetch + verify, s"), ("chunked_s", "chunked end to end, s"),
                       ("ratio_chunked", "  end to end / raw (goal >= 0.70)"),
                       ("ratio_chunked_fetch", "  device fetch / raw"),
                       ("ratio_chunked_offer_first", "chunks, live offer first, end to end / raw"),
                       ("ratio_overlapped_blocks", "blocks, offer first, end to end / raw")]:  # fmt: skip
        print(f"{label:44} {base[key]:>10} {new[key]:>10}")
    print(f"{'load average (1 min) at start, end':44} {report['load_average_start_end']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
