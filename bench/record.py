"""Run a benchmark and record where its figures came from, for bench/report.py.

    python bench/record.py NAME [--stdout] -- COMMAND...

Runs COMMAND (a bench that writes bench/results/NAME.json itself, or with --stdout one that prints its JSON
document, which is then written there), and writes bench/results/NAME.meta.json: the command line, the machine
(CPU model, cores, memory, load average before and after), the date, the git commit, and the wall time. The
report prints each table with these, so every figure names the machine and the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "cpu_features": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags],
        "gpu": None,
        "python": platform.python_version(),
    }


def commit() -> str | None:
    """HEAD, with "+uncommitted" where tracked files outside bench/results differ from it (the code measured is then
    not the commit's)."""
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    head = result.stdout.strip() or None
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", ".", ":(exclude)bench/results"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return f"{head}+uncommitted" if head and changed else head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("--stdout", action="store_true", help="the bench prints its JSON: write it to NAME.json")
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("give the bench command after --")
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("give the bench command after --")
    RESULTS.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    measured_at = commit()  # the code the bench runs: the checkout can move on while a long bench runs
    start = time.time()
    result = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE if args.stdout else None)
    seconds = time.time() - start
    if result.returncode != 0:
        print(f"record: {' '.join(command)} exited {result.returncode}; nothing recorded", file=sys.stderr)
        return result.returncode
    if args.stdout:
        document = json.loads(result.stdout)
        (RESULTS / f"{args.name}.json").write_text(json.dumps(document, indent=2) + "\n")
    meta = {
        "command": " ".join(command),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d", time.gmtime(start)),
        "commit": measured_at,
        "wall_s": round(seconds, 1),
        "load_average": [round(v, 1) for v in (*load_before[:1], *os.getloadavg()[:1])],
    }
    (RESULTS / f"{args.name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"recorded bench/results/{args.name}.json and .meta.json ({seconds:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
