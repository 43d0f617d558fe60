"""`edgefleet rollout start|list|status|pause|resume|abort|rollback`: rollouts in waves with guardrails."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.cli.common import add_broker, add_json, connect, fmt, print_json, print_table
from edgefleet.core.errors import UserInputError
from edgefleet.core.untrusted import safe_text

if TYPE_CHECKING:
    from edgefleet.control.rollout.plan import RolloutDoc

# Host modules are imported inside the commands, so `edgefleet agent` on a device never loads them.


from edgefleet.cli.control.common import add_store, duration, open_from, optional_float, publish_bundles


def register(sub: argparse._SubParsersAction) -> None:
    _register_rollout(sub)


# --- rollouts
def _register_rollout(sub: argparse._SubParsersAction) -> None:
    rollout = sub.add_parser("rollout", help="roll bundles out to a group in waves, with guardrails")
    verbs = rollout.add_subparsers(dest="verb", required=True, metavar="VERB")
    start = verbs.add_parser("start", help="publish bundles (one per profile) and start a rollout to a group")
    start.add_argument("bundles", type=Path, nargs="*", metavar="BUNDLE")
    start.add_argument(
        "--agent-release", type=Path, metavar="FILE",
        help="roll out this agent release (`edgefleet release build`) instead of bundles: each wave's devices are "
        "named it and judged on its commit and on the models of --slot staying healthy (docs/agent.md)",
    )  # fmt: skip
    start.add_argument(
        "--agent-downgrade", action="store_true", help="the agent release is older than what devices run: allow it"
    )
    start.add_argument("--group", required=True, help="host-side group, or an agent --group name")
    start.add_argument(
        "--slot", default="default",
        help="the slot (model) of the group's devices to roll out; their other slots are left alone (default: default)",
    )  # fmt: skip
    start.add_argument("--canary", default="1", help="first wave: a device count (1) or a share (10%%)")
    start.add_argument(
        "--waves", default="25%,50%,100%", help="cumulative wave sizes after the canary (default 25%%,50%%,100%%)"
    )
    t = start.add_argument_group("thresholds (per wave; 'none' switches one off)")
    t.add_argument("--max-latency-factor", type=optional_float, default=1.5, help="new p95 ≤ F × previous p95")
    t.add_argument("--latency-slack-ms", type=float, default=0.0, help="absolute slack on the latency limit")
    t.add_argument(
        "--max-golden-drop", type=optional_float, default=-1.0,
        help="golden agreement drop allowed vs the previous bundle (default: the bundles' accuracy budget)",
    )  # fmt: skip
    t.add_argument("--min-golden", type=optional_float, default=None, help="absolute floor for golden agreement")
    t.add_argument("--max-error-rate", type=optional_float, default=0.01, help="errors / requests at most this")
    t.add_argument("--min-requests", type=int, default=20, help="requests before latency and errors are judged")
    t.add_argument("--max-failed-devices", type=int, default=0, help="failures a wave tolerates")
    t.add_argument(
        "--max-field-drop", type=optional_float, default=0.02,
        help="field accuracy (labelled feedback) drop allowed vs the previous bundle, where feedback exists",
    )  # fmt: skip
    t.add_argument("--min-field-samples", type=int, default=50, help="feedbacks needed before and after the wave")
    t.add_argument(
        "--max-drift-psi", type=optional_float, default=None,
        help="the new bundle's worst drift PSI (inputs and outputs, from telemetry) at most this; off by default",
    )  # fmt: skip
    t.add_argument("--min-drift-samples", type=int, default=100, help="live samples behind drift before judging")
    t.add_argument(
        "--allow-unjudged", action="append", default=[], metavar="CRITERION",
        help="let a criterion without data pass unjudged (latency, golden, errors, field-accuracy, shadow, drift; "
        "repeatable); without it a criterion lacking data fails the wave. Recorded in the rollout",
    )  # fmt: skip
    s_ = start.add_argument_group("shadow phase (before the waves, on the canary)")
    s_.add_argument("--shadow", type=duration, default=None, metavar="DURATION",
                    help="run the candidate as a shadow on the canary for at least this long first")  # fmt: skip
    s_.add_argument("--shadow-timeout", type=duration, default=None, help="fail the phase without enough data by then")
    s_.add_argument("--shadow-min-agreement", type=float, default=0.99, help="worst per-output agreement")
    s_.add_argument("--shadow-min-requests", type=int, default=50, help="mirrored requests before judging")
    s_.add_argument("--shadow-max-latency-factor", type=optional_float, default=1.5, help="shadow p95 ≤ F × served")
    w = start.add_argument_group("timing")
    w.add_argument("--baseline", type=duration, default=30.0, help="telemetry window before each wave")
    w.add_argument("--observe", type=duration, default=60.0, help="how long each wave is watched")
    w.add_argument("--install-timeout", type=duration, default=300.0, help="devices not committed by then time out")
    w.add_argument("--report-timeout", type=duration, default=60.0, help="grace for late telemetry")
    w.add_argument("--min-reports", type=int, default=2, help="telemetry reports needed per device")
    start.add_argument("--no-publish", action="store_true", help="the bundles are already on the broker")
    start.add_argument("-q", "--quiet", action="store_true", help="print only the rollout's id (for a script)")
    add_broker(start)
    add_store(start)
    add_json(start)
    start.set_defaults(func=cmd_rollout_start)

    listing = verbs.add_parser("list", help="the rollouts, newest first: state, group, bundles and outcome")
    listing.add_argument("--active", action="store_true", help="only rollouts still running (pending, paused …)")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    add_store(listing)
    add_json(listing)
    listing.set_defaults(func=cmd_rollout_list)

    status = verbs.add_parser("status", help="every rollout, or one in detail")
    status.add_argument("rollout_id", nargs="?")
    status.add_argument(
        "--wait", action="store_true",
        help="follow the rollout until it ends, one line per change; exit 0 only if it succeeded",
    )  # fmt: skip
    status.add_argument("--timeout", type=duration, default=1800.0, help="with --wait: give up after this long")
    add_store(status)
    add_json(status)
    status.set_defaults(func=cmd_rollout_status)
    for verb, text in (
        ("pause", "hold a rollout where it is (installs already asked for go on)"),
        ("resume", "continue a paused rollout"),
        ("abort", "stop a rollout and return every device it touched to its previous bundle"),
        ("rollback", "abort an active rollout, or return the devices of a succeeded one to their previous bundles"),
    ):
        command = verbs.add_parser(verb, help=text)
        command.add_argument("rollout_id")
        add_store(command)
        add_json(command)
        command.set_defaults(func=cmd_rollout_command, command=verb)


def cmd_rollout_start(args: argparse.Namespace) -> None:
    from edgefleet.control import operations as ops
    from edgefleet.control.rollout.engine import bundle_ref
    from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest

    if args.agent_release is not None:
        _start_agent_release(args)
        return
    if not args.bundles:
        raise UserInputError("rollout start needs BUNDLE files, or --agent-release FILE")
    manifests = []
    for path in args.bundles:
        try:
            manifests.append(parse_manifest(read_signed_manifest(path).manifest_json))
        except OSError as err:  # a BundleError already names the file and what is wrong with it
            raise UserInputError(f"{path} is not a readable bundle: {err}") from err
    spec = ops.rollout_spec(
        [bundle_ref(m) for m in manifests], args.group, canary=args.canary, waves=args.waves.split(","),
        thresholds={
            "max_latency_factor": args.max_latency_factor, "latency_slack_ms": args.latency_slack_ms,
            "max_golden_drop": args.max_golden_drop, "min_golden_agreement": args.min_golden,
            "max_error_rate": args.max_error_rate, "min_requests": args.min_requests,
            "max_field_accuracy_drop": args.max_field_drop, "min_field_samples": args.min_field_samples,
            "max_drift_psi": args.max_drift_psi, "min_drift_samples": args.min_drift_samples,
        },
        allow_unjudged=[c.strip() for a in args.allow_unjudged for c in a.split(",") if c.strip()],
        shadow=None if args.shadow is None else {
            "observe_s": args.shadow, "timeout_s": args.shadow_timeout or max(args.shadow * 5, 300.0),
            "min_agreement": args.shadow_min_agreement, "min_requests": args.shadow_min_requests,
            "max_latency_factor": args.shadow_max_latency_factor,
        },
        timing={
            "baseline_s": args.baseline, "observe_s": args.observe, "install_timeout_s": args.install_timeout,
            "report_timeout_s": args.report_timeout, "min_reports": args.min_reports,
        },
        max_failed_devices=args.max_failed_devices, slot=args.slot,
    )  # fmt: skip
    store = open_from(args)
    try:
        ops.check_rollout(store, spec)  # fail before publishing anything
        if not args.no_publish:
            publish_bundles(args, store, args.bundles)
        else:
            _record_published(args, store, args.bundles, manifests)
        doc = ops.start_rollout(store, ops.Operator.shell(), spec)
    finally:
        store.close()
    if args.quiet:
        print(doc.id)
    elif args.json:
        print_json(_rollout_json(doc))
    else:
        sizes = ", ".join(str(len(w.devices)) for w in doc.waves)
        print(f"rollout {doc.id}: slot {spec.slot} of {len(doc.devices)} devices of {spec.group} in waves of {sizes}")
        print(f"follow it with: edgefleet rollout status {doc.id}")


def _start_agent_release(args: argparse.Namespace) -> None:
    """`rollout start --agent-release FILE`: verify and publish the release, then plan its waves (audited)."""
    from edgefleet.control import operations as ops
    from edgefleet.control.credentials.keyring import HostKeys
    from edgefleet.control.publish.release import publish_release, verify_with_keyset

    if args.bundles or args.shadow is not None:
        raise UserInputError("an agent-release rollout ships no bundle and has no shadow phase")
    release = verify_with_keyset(args.agent_release, HostKeys.default())  # before anything is published
    ref = {"release_id": release.release_id, "version": release.version,
           "allow_downgrade_to": release.release_id if args.agent_downgrade else None}  # fmt: skip
    spec = ops.rollout_spec(
        [], args.group, canary=args.canary, waves=args.waves.split(","),
        thresholds={
            "max_latency_factor": args.max_latency_factor, "latency_slack_ms": args.latency_slack_ms,
            "max_golden_drop": args.max_golden_drop, "min_golden_agreement": args.min_golden,
            "max_error_rate": args.max_error_rate, "min_requests": args.min_requests,
            "max_field_accuracy_drop": args.max_field_drop, "min_field_samples": args.min_field_samples,
            "max_drift_psi": args.max_drift_psi, "min_drift_samples": args.min_drift_samples,
        },
        allow_unjudged=[c.strip() for a in args.allow_unjudged for c in a.split(",") if c.strip()],
        timing={
            "baseline_s": args.baseline, "observe_s": args.observe, "install_timeout_s": args.install_timeout,
            "report_timeout_s": args.report_timeout, "min_reports": args.min_reports,
        },
        max_failed_devices=args.max_failed_devices, slot=args.slot, agent_release=ref,
    )  # fmt: skip
    store = open_from(args)
    try:
        ops.check_rollout(store, spec)  # fail before publishing anything
        if not args.no_publish:
            conn, topics = connect(args, "control")
            try:
                publish_release(conn, topics, args.agent_release)
            finally:
                conn.stop()
        doc = ops.start_rollout(store, ops.Operator.shell(), spec)
    finally:
        store.close()
    if args.quiet:
        print(doc.id)
    elif args.json:
        print_json(_rollout_json(doc))
    else:
        sizes = ", ".join(str(len(w.devices)) for w in doc.waves)
        print(f"rollout {doc.id}: agent {release.version} to {len(doc.devices)} devices of {spec.group} "
              f"in waves of {sizes}")  # fmt: skip
        print(f"follow it with: edgefleet rollout status {doc.id}")


def _shipped(doc: RolloutDoc) -> str:
    """What a rollout ships, for its row: its bundles, or its agent release."""
    release = doc.spec.agent_release
    return f"agent {release.release_id}" if release else ", ".join(b.bundle_id for b in doc.spec.bundles)


def _record_published(args: argparse.Namespace, store: Any, bundles: list[Path], manifests: list[Any]) -> None:
    """`--no-publish`: the bundles are on the broker already; record what the store lacks of them (the record and
    the facts its rollouts weigh device reports against), from the files and the retained signed offers."""
    from edgefleet.control.publish.chunks import retained_offers
    from edgefleet.control.rollout.judge.bundle_facts import record_facts
    from edgefleet.control.store import BundleRecord

    missing = [(p, m) for p, m in zip(bundles, manifests, strict=True) if store.bundle_facts(m.bundle_id) is None]
    if not missing:
        return
    conn, topics = connect(args, "control")
    try:
        offers = retained_offers(conn, topics)
    finally:
        conn.stop()
    for path, manifest in missing:
        offer = offers.get(manifest.bundle_id)
        if offer is None:
            raise UserInputError(
                f"{manifest.bundle_id} is not on the broker: publish it (drop --no-publish) before rolling it out"
            )
        if store.bundle(manifest.bundle_id) is None:
            store.put_bundle(BundleRecord(manifest.bundle_id, manifest.model_name, manifest.model_version,
                                          manifest.profile, offer.transfer.size, manifest.accuracy.budget,
                                          time.time()))  # fmt: skip
        record_facts(store, path, manifest, offer.transfer)


def cmd_rollout_list(args: argparse.Namespace) -> None:
    from edgefleet.control.rollout.engine import load_doc
    from edgefleet.control.rollout.finish import can_roll_back
    from edgefleet.control.rollout.plan import ACTIVE_STATES

    if args.limit < 1:
        raise UserInputError("--limit takes a positive number of rollouts")
    store = open_from(args)
    try:
        rows = store.rollouts(ACTIVE_STATES if args.active else None)
    finally:
        store.close()
    docs = [load_doc(r) for r in sorted(rows, key=lambda r: r.created_at, reverse=True)[: args.limit]]
    if args.json:
        from edgefleet.control.dashboard.views import rollout_summary

        print_json({"rollouts": [rollout_summary(d) for d in docs]})
        return
    print_table(
        f"rollouts ({len(docs)} of {len(rows)})",
        ["rollout", "state", "group", "bundles", "started", "wave", "devices", "rollback", "outcome"],
        [
            (d.id, d.state, d.spec.group, _shipped(d),
             time.strftime("%Y-%m-%d %H:%M", time.localtime(d.created_at)), f"{d.current_wave + 1}/{len(d.waves)}",
             _counts(d.counts()), "yes" if can_roll_back(d) else "", safe_text(d.outcome, 200))
            for d in docs
        ],
    )  # fmt: skip


def _rollout_json(doc: RolloutDoc) -> dict[str, Any]:
    from edgefleet.control.dashboard.views import rollout_summary

    return rollout_summary(doc) | {"document": doc.model_dump(mode="json")}


def cmd_rollout_status(args: argparse.Namespace) -> int:
    if args.wait:
        return _wait(args)
    _status(args)
    return 0


def _wait(args: argparse.Namespace) -> int:
    """Follow one rollout until it is no longer active: a line whenever its state or a wave's changes."""
    from edgefleet.control.rollout.engine import load_doc
    from edgefleet.core.errors import UnknownNameError

    if not args.rollout_id:
        raise UserInputError("--wait follows one rollout: give its id (`edgefleet rollout status` lists them)")
    deadline = time.monotonic() + args.timeout
    seen = None
    store = open_from(args)
    try:
        while True:
            row = store.rollout(args.rollout_id)
            if row is None:
                raise UnknownNameError("rollout", args.rollout_id, [r.id for r in store.rollouts()])
            doc = load_doc(row)
            now = (doc.state, tuple((w.state, w.verdict) for w in doc.waves))
            if now != seen and not args.json:
                waves = ", ".join(f"{'canary' if w.index == 0 else w.index}: {w.state}" for w in doc.waves)
                print(f"{time.strftime('%H:%M:%S')} rollout {doc.id} {doc.state} ({waves})", flush=True)
            seen = now
            if not doc.active:
                break
            if time.monotonic() > deadline:
                raise UserInputError(
                    f"rollout {doc.id} is still {doc.state} after {args.timeout:g} s (is `edgefleet control serve` "
                    "running? it drives rollouts)"
                )
            time.sleep(1.0)
    finally:
        store.close()
    if args.json:
        print_json(_rollout_json(doc))
    else:
        print(f"rollout {doc.id}: {doc.state}; {safe_text(doc.outcome, 400)}")
    return 0 if doc.state == "succeeded" else 1


def _status(args: argparse.Namespace) -> None:
    from edgefleet.control.health import health_report
    from edgefleet.control.rollout.engine import ENGINE_LEASE, load_doc
    from edgefleet.core.errors import UnknownNameError

    store = open_from(args)
    try:
        lease, health = store.lease(ENGINE_LEASE), health_report(store)
        if args.rollout_id:
            row = store.rollout(args.rollout_id)
            if row is None:
                raise UnknownNameError("rollout", args.rollout_id, [r.id for r in store.rollouts()])
            docs = [load_doc(row)]
        else:
            docs = [load_doc(r) for r in store.rollouts()]
    finally:
        store.close()
    engine = engine_text(lease, health)
    if args.json:
        if args.rollout_id:
            print_json(_rollout_json(docs[0]) | {"engine": engine})
        else:
            from edgefleet.control.dashboard.views import rollout_summary

            print_json({"engine": engine, "rollouts": [rollout_summary(d) for d in docs]})
        return
    if not args.rollout_id:
        print_table(
            f"rollouts (engine {engine})",
            ["rollout", "state", "group", "bundles", "wave", "devices", "outcome"],
            [
                (d.id, d.state, d.spec.group, _shipped(d),
                 f"{d.current_wave + 1}/{len(d.waves)}", _counts(d.counts()), d.outcome)
                for d in docs
            ],
        )  # fmt: skip
        return
    doc = docs[0]
    print(f"rollout {doc.id}: {doc.state} (engine {engine}); {safe_text(doc.outcome, 400)}")  # device reasons
    print_table(
        "waves",
        ["wave", "state", "devices", "verdict"],
        [
            ("canary" if w.index == 0 else str(w.index), w.state,
             _counts({s: sum(1 for d in w.devices if doc.devices[d].state == s) for s in
                      {doc.devices[d].state for d in w.devices}}), w.verdict)
            for w in doc.waves
        ],
    )  # fmt: skip
    from edgefleet.cli.control.rollout_view import print_quality

    print_table(
        "devices",
        ["device", "wave", "state", "reported", "back to", "to", "baseline p95", "p95", "golden", "reason"],
        [
            (p.device_id, p.wave, p.state, safe_text(p.reported_bundle, 80), p.previous_bundle or "-",
             p.target_bundle, fmt(p.baseline.p95_ms if p.baseline else None),
             fmt(p.observed.p95_ms if p.observed else None),
             fmt(p.observed.golden_agreement if p.observed else None, 3),
             safe_text("; ".join([p.reason, *(f"warning: {w}" for w in p.warnings)]), 400))
            for p in sorted(doc.devices.values(), key=lambda p: (p.wave, p.device_id))
        ],
    )  # fmt: skip
    print_quality(doc)
    for device_id, why in sorted(doc.left_out.items()):
        print(f"left out: {device_id}: {safe_text(why, 300)}")
    for entry in doc.log[-15:]:
        print(f"{time.strftime('%H:%M:%S', time.localtime(entry.ts))} {safe_text(entry.message, 400)}")


def engine_text(lease: tuple[str, float] | None, health: list[dict[str, Any]]) -> str:
    """ "running", or what the engine is instead and why (edgefleet/control/health.py engine_summary)."""
    from edgefleet.control.health import engine_summary

    summary = engine_summary(lease, health, time.time())
    if summary["state"] in ("running", "never ran", "not running"):
        return str(summary["state"])
    return f"{summary['state']}: {safe_text(str(summary['detail']), 300)}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def cmd_rollout_command(args: argparse.Namespace) -> None:
    from edgefleet.control import operations as ops

    store = open_from(args)
    try:
        who = ops.Operator.shell()
        if args.command == "rollback":
            doc = ops.rollback_rollout(store, who, args.rollout_id)
        else:
            doc = ops.rollout_command(store, who, args.rollout_id, args.command)
    finally:
        store.close()
    if args.json:
        print_json({"rollout": doc.id, "requested": args.command, "state": doc.state})
    else:
        print(f"{args.command} requested for rollout {doc.id} ({doc.state}); the control plane applies it")
    sys.stdout.flush()
