"""`edgefleet control status`: the control plane's own health, from the store (any instance, any machine).

Who holds the engine lease, and each instance's loops (the rollout engine, the desired-state sync, the
broker-rights sync, ingestion, compaction, retention and the store quota): when each last completed, its errors in
the last minute and the last one (with when it happened), judged by one rule
(edgefleet/control/health.py): *stalled* after 3 intervals without completing, *failing* with errors in the last
minute, *gone* when an instance stopped without a clean exit (not counted). Exit status 0 when the engine runs
and no loop has stalled or is failing, 1 otherwise.
"""

from __future__ import annotations

import argparse
import time

from edgefleet.cli.common import add_json, print_json, print_table
from edgefleet.cli.control.common import add_store, open_from
from edgefleet.core.untrusted import safe_text


def register_status(verbs: argparse._SubParsersAction) -> None:
    status = verbs.add_parser(
        "status", help="the control plane's health: the engine lease and each instance's loops (exit 1 if unwell)"
    )
    add_store(status)
    add_json(status)
    status.set_defaults(func=cmd_control_status)


def cmd_control_status(args: argparse.Namespace) -> int:
    from edgefleet.control.health import engine_summary, health_report, worst
    from edgefleet.control.rollout.engine import ENGINE_LEASE

    store = open_from(args)
    try:
        now = time.time()
        lease, report, counters = store.lease(ENGINE_LEASE), health_report(store, now), store.counters()
    finally:
        store.close()
    engine = engine_summary(lease, report, now)
    unwell = engine["state"] != "running" or worst(report) in ("stalled", "failing")
    if args.json:
        print_json({"engine": engine, "loops": report, "counters": counters, "healthy": not unwell})
        return 1 if unwell else 0
    print(
        f"engine: {engine['state']} (lease holder {engine['holder'] or '-'}); {safe_text(str(engine['detail']), 400)}"
    )
    print_table(
        "loops",
        ["instance", "loop", "state", "last completed", "errors/min", "last error", "detail"],
        [
            (r["instance"], r["component"], r["state"],
             f"{now - float(r['last_tick']):.1f} s ago" if r["last_tick"] is not None else "never",  # type: ignore[arg-type]
             r["errors_per_min"],
             f"{now - float(r['last_error_at']):.0f} s ago: {safe_text(str(r['last_error']), 120)}"  # type: ignore[arg-type]
             if r["last_error_at"] is not None else "-",
             safe_text(str(r["detail"]), 200))
            for r in report
        ],
    )  # fmt: skip
    shown = {k: v for k, v in sorted(counters.items()) if k.startswith("ingest.")}
    if shown:
        print_table("ingestion", ["counter", "value"], list(shown.items()))
    return 1 if unwell else 0
