"""Bundle transfer over MQTT against a raw publish of the same bytes, through the same Mosquitto.

    python bench/transfer.py [--mb 16] [--rounds 5] [--block-kib 128] [--cap 1000000] [--fleet 100] [--json out.json]
    python bench/transfer.py --delta [--rounds 3] [--json out.json]     (bench/transfers/delta.py)

In one run, interleaved (raw, sequential, overlapped, raw, ...), medians; the host in this process, the device
in its own (bench/transfers/device.py, as on another machine):
- raw: the bytes as block-sized QoS 1 messages, a subscriber receiving them all (the broker's bandwidth);
- overlapped (the end-to-end figure): the offer first, then the blocks
  (tests/support/publishing/offer_first_blocks.py), a device that waits on the offer fetching while they go out
  (`BlockDownload`: RTT-sized window of block subscriptions, every block's sha256 checked, writes, fsync);
- sequential: `publish_bundle` (offer last), then the same download;
- chunked offer first: tests/support/publishing/offer_first_chunks.py (the layout planned in memory, the signed
  offer published live, then the chunks, then the retained offer), a device waiting on the offer fetching while
  the chunks go out;
- chunked (the default layout since chunks): `publish_bundle` with content-addressed chunks (cut, zstd tried on
  every chunk, a bundle too big for an inline list on index pages), offer last, then the agent's `ChunkDownload`
  (every chunk's sha256, writes, fsync); end to end and the device's fetch alone, and the device process's
  CPU-seconds per 100 MB fetched (all its threads, user + system: a Raspberry Pi has a fraction of this CPU);
- cap: a download under `--cap` bytes/s for about `--cap-seconds`: achieved bytes/s by the pacer's own counters;
- fleet: one `--fleet-mb` bundle to `--fleet` fetchers in this process (each its own MQTT connection and
  downloader), against the raw fan-out of the same bytes to the same connections;
- resume: a real agent process killed (SIGKILL) at a random point of each download and restarted: bytes it
  fetched beyond the blocks it lacked (goal: at most one block), restarts without a working model (goal: 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test helpers start Mosquitto and build padded bundles
sys.path.insert(0, str(REPO / "bench"))

from transfers.flow import WINDOW, DeviceProcess, bundle_remote, cap_trial, fleet_trial, raw_remote  # noqa: E402

from edgefleet.control.credentials.keyring import init as init_keys  # noqa: E402
from edgefleet.core.mqtt.connection import Connection  # noqa: E402
from edgefleet.core.topics import Topics  # noqa: E402
from edgefleet.core.trust.signing import SigningKey, TrustedKeys  # noqa: E402

from support.fleet import AgentProcess, FleetWatcher, deploy_to, padded_bundle  # noqa: E402
from support.paths import DIGITS  # noqa: E402
from support.servers.brokers import MosquittoBroker  # noqa: E402


def resume_trials(
    broker: MosquittoBroker, source: Path, keys: tuple[Path, Path], work: Path, block: int, pad: int, trials: int
) -> dict:
    """Kill a real agent with SIGKILL at a random share of each download, restart it, and count the bytes
    it fetched beyond the blocks it lacked, and any restart that came up without a working model."""
    key, trusted = SigningKey.load(keys[0]), TrustedKeys.load([keys[1]])
    host = Connection(broker.url, "bench-resume-host", session_expiry_s=600).start()
    topics = Topics()
    watcher = FleetWatcher(host, topics)
    agent = AgentProcess(
        "bench-resume", work / "bench-resume", broker=broker.url, trust=keys[0].parent / "root.pub"
    ).start()
    rng = random.Random(7)
    refetched, without_model, current = [], 0, None
    try:
        watcher.wait_for("agent online", lambda: watcher.status.get("bench-resume"), timeout=30)
        for trial in range(trials):
            bundle = padded_bundle(source, work, key, trusted, version=str(trial + 10), pad_bytes=pad, seed=trial)
            target = deploy_to(host, topics, bundle, devices=("bench-resume",), block_size=block, layout="blocks")
            record = agent.state_dir / "downloads" / f"{target}.part.blocks"
            blocks = -(-bundle.stat().st_size // block)
            goal, deadline = int(rng.uniform(0.05, 0.95) * blocks), time.monotonic() + 60
            while time.monotonic() < deadline and not (record.exists() and sum(record.read_bytes()) >= goal):
                time.sleep(0.002)
            agent.kill9()
            held = sum(record.read_bytes()) if record.exists() else 0
            marker = len(watcher.events)
            agent.start()
            first = watcher.wait_for(
                "restarted",
                lambda: (s := watcher.status.get("bench-resume")) and s.online and s.state != "starting" and s,
            )
            without_model += int(current is not None and first.active_bundle not in (current, target))
            watcher.serving("bench-resume", target, timeout=120)
            event = watcher.wait_for(
                "downloaded",
                lambda since=marker: next((e for e in watcher.events[since:] if e.kind == "downloaded"), None),
            )
            fetched = int(event.detail.split(" bytes")[0])
            refetched.append(max(0, fetched - (bundle.stat().st_size - held * block)))
            current = target
    finally:
        agent.stop()
        host.stop()
    return {
        "trials": trials,
        "refetched_bytes_max": max(refetched),
        "refetched_bytes_median": statistics.median(refetched),
        "devices_without_working_model": without_model,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=16.0, help="bundle size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-kib", type=int, default=128)
    parser.add_argument("--kill-trials", type=int, default=10, help="kill -9 / resume trials (0: skip)")
    parser.add_argument("--cap", type=int, default=1_000_000, help="byte-rate cap to measure (bytes/s; 0: skip)")
    parser.add_argument("--cap-seconds", type=float, default=30.0, help="how long the capped download runs")
    parser.add_argument("--fleet", type=int, default=100, help="in-process fetchers for the fleet trial (0: skip)")
    parser.add_argument("--fleet-mb", type=float, default=10.0, help="bundle size for the fleet trial")
    parser.add_argument(
        "--links", default="", help="shaped links MBIT:RTT_MS,... (bench/transfers/shaped.py; e.g. 20:50,200:5)"
    )
    parser.add_argument("--link-mb", type=float, default=8.0, help="bundle size on the shaped links")
    parser.add_argument("--link-rounds", type=int, default=3)
    parser.add_argument("--skip-loopback", action="store_true", help="only the shaped links (and what else is asked)")
    parser.add_argument(
        "--baseline-python", default=None,
        help="also fetch with a device on this interpreter (another checkout's .venv: its agent code), interleaved",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--delta", action="store_true", help="deltas between versions on real models (bench/transfers/delta.py)"
    )
    args = parser.parse_args()
    block = args.block_kib * 1024
    from edgefleet.converter import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    with tempfile.TemporaryDirectory(prefix="edgefleet-bench-") as tmp, MosquittoBroker() as broker:
        work = Path(tmp)
        init_keys(work / "keys")  # root, bundle, ops and the key set; publish/deploy read $EDGEFLEET_HOME/keys
        os.environ["EDGEFLEET_HOME"] = str(work)
        keys = (work / "keys" / "bundle.key", work / "keys" / "bundle.pub")
        key, trusted = SigningKey.load(keys[0]), TrustedKeys.load([keys[1]])
        (result,) = convert(ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("intel-x86-vnni")], calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz", out=work / "bundles", key=key, name="digits-cnn", version="1",
        ))  # fmt: skip
        assert result.bundle is not None
        if args.delta:  # bench/transfers/delta.py: the version pairs on real models, then stop
            from transfers.delta import report, run

            report(run(broker.url, Path(result.bundle), key, args.rounds), args.json)
            return 0
        source = Path(result.bundle)

        def bundle_of(version: str, mb: float, seed: int = 0) -> Path:
            return padded_bundle(source, work, key, trusted, version=version, pad_bytes=int(mb * 2**20), seed=seed)

        host = Connection(broker.url, "bench-host").start()
        shaped = None
        if args.links:
            from transfers.shaped import parse_links, shaped_trials

            shaped = shaped_trials(
                host, broker.port, bundle_of, block, parse_links(args.links), args.link_mb, args.link_rounds, WINDOW
            )
            if args.skip_loopback:
                host.stop()
                return _shaped_only(shaped, args.json)
        remote = DeviceProcess(broker.url)
        baseline = DeviceProcess(broker.url, python=args.baseline_python) if args.baseline_python else None
        base_chunk: list[float] = []
        base_block: list[float] = []
        base_chunk_cpu: list[float] = []
        base_block_cpu: list[float] = []
        raw, publish, sequential, overlapped, size = [], [], [], [], 0
        chunk_publish, chunked, chunked_early = [], [], []
        block_cpu: list[float] = []  # the device process's CPU seconds for each fetch (publish-then-fetch rounds)
        chunk_cpu: list[float] = []
        for i in range(0 if args.skip_loopback else args.rounds):
            # Fresh bundles every round (and fresh random bytes for the chunked one): no fetch may find the blocks
            # or chunks retained by an earlier one.
            first, second = bundle_of(f"{100 + 2 * i}", args.mb, seed=i), bundle_of(f"{101 + 2 * i}", args.mb, seed=i)
            third = bundle_of(f"{500 + i}", args.mb, seed=1000 + i)
            fourth = bundle_of(f"{700 + i}", args.mb, seed=2000 + i)
            data = first.read_bytes()
            size = len(data)
            raw.append(raw_remote(host, remote, data, block, str(i)))
            pub, total = bundle_remote(host, remote, first, block, offer_first=False, cpu=block_cpu)
            publish.append(pub)
            sequential.append(total)
            overlapped.append(bundle_remote(host, remote, second, block, offer_first=True)[1])
            pub, total = bundle_remote(host, remote, third, block, offer_first=False, chunks=True, cpu=chunk_cpu)
            chunk_publish.append(pub)
            chunked.append(total)
            chunked_early.append(bundle_remote(host, remote, fourth, block, offer_first=True, chunks=True)[1])
            for path in (first, second, third, fourth):
                path.unlink()
            if baseline is not None:  # the same fetches by the baseline's agent code, fresh bundles of the same size
                b_chunk, b_block = bundle_of(f"{800 + i}", args.mb, seed=3000 + i), bundle_of(f"{850 + i}", args.mb)
                pub, total = bundle_remote(host, baseline, b_chunk, block, offer_first=False, chunks=True,
                                           cpu=base_chunk_cpu)  # fmt: skip
                base_chunk.append(total - pub)
                pub, total = bundle_remote(host, baseline, b_block, block, offer_first=False, cpu=base_block_cpu)
                base_block.append(total - pub)
                b_chunk.unlink()
                b_block.unlink()
        remote.close()
        if baseline is not None:
            baseline.close()
        device = Connection(broker.url, "bench-device").start()
        cap = None
        if args.cap:
            capped = bundle_of("900", args.cap * args.cap_seconds / 2**20, seed=9)
            cap = cap_trial(host, device, capped, block, work, args.cap)
            capped.unlink()
        host.stop()
        device.stop()
        fleet = None
        if args.fleet:
            shared = bundle_of("901", args.fleet_mb, seed=11)
            fleet = fleet_trial(broker.url, shared, block, work, args.fleet, shared.read_bytes())
        resume = None
        if args.kill_trials:
            resume = resume_trials(broker, source, keys, work, block, int(args.mb * 2**20), args.kill_trials)
    med = statistics.median
    size_mb = size / 1e6
    raw_mbps = size_mb / med(raw)
    seq_mbps, over_mbps = size_mb / med(sequential), size_mb / med(overlapped)
    fetch_mbps = size_mb / med([total - pub for pub, total in zip(publish, sequential, strict=True)])
    chunked_mbps = size_mb / med(chunked)
    early_mbps = size_mb / med(chunked_early)
    chunk_fetch_mbps = size_mb / med([total - pub for pub, total in zip(chunk_publish, chunked, strict=True)])
    cpu_blocks = round(med(block_cpu) * 100 / size_mb, 3)  # the device's CPU-seconds per 100 MB fetched
    cpu_chunks = round(med(chunk_cpu) * 100 / size_mb, 3)
    base_report = (
        None
        if baseline is None
        else {
            "python": args.baseline_python,
            "chunked_device_fetch_mb_s": round(size_mb / med(base_chunk), 1),
            "ratio_chunked_fetch_vs_raw": round(size_mb / med(base_chunk) / raw_mbps, 3),
            "device_fetch_mb_s": round(size_mb / med(base_block), 1),
            "ratio_fetch_vs_raw": round(size_mb / med(base_block) / raw_mbps, 3),
            "device_cpu_s_per_100mb_chunked": round(med(base_chunk_cpu) * 100 / size_mb, 3),
            "device_cpu_s_per_100mb_blocks": round(med(base_block_cpu) * 100 / size_mb, 3),
        }
    )
    per_round = [
        {
            "raw_s": round(r, 3),
            "sequential_s": round(s, 3),
            "overlapped_s": round(o, 3),
            "ratio_overlapped": round(r / o, 3),
            "chunked_s": round(c, 3),
            "chunked_publish_s": round(cp, 3),
            "ratio_chunked": round(r / c, 3),
            "ratio_chunked_fetch": round(r / (c - cp), 3),
            "chunked_offer_first_s": round(ce, 3),
            "ratio_chunked_offer_first": round(r / ce, 3),
        }
        for r, s, o, c, cp, ce in zip(raw, sequential, overlapped, chunked, chunk_publish, chunked_early, strict=True)
    ]
    report = {
        "bundle_mb": round(size_mb, 2), "block_kib": args.block_kib, "rounds": args.rounds,
        "raw_mb_s": round(raw_mbps, 1), "bundle_publish_s": round(med(publish), 3),
        "sequential_end_to_end_mb_s": round(seq_mbps, 1), "ratio_sequential_vs_raw": round(seq_mbps / raw_mbps, 3),
        "overlapped_end_to_end_mb_s": round(over_mbps, 1), "ratio_overlapped_vs_raw": round(over_mbps / raw_mbps, 3),
        "ratio_overlapped_vs_raw_per_round_median": round(med(r["ratio_overlapped"] for r in per_round), 3),
        "device_fetch_mb_s": round(fetch_mbps, 1), "ratio_fetch_vs_raw": round(fetch_mbps / raw_mbps, 3),
        "chunked_publish_s": round(med(chunk_publish), 3), "chunked_end_to_end_mb_s": round(chunked_mbps, 1),
        "ratio_chunked_vs_raw": round(chunked_mbps / raw_mbps, 3),
        "chunked_device_fetch_mb_s": round(chunk_fetch_mbps, 1),
        "ratio_chunked_fetch_vs_raw": round(chunk_fetch_mbps / raw_mbps, 3),
        "chunked_offer_first_end_to_end_mb_s": round(early_mbps, 1),
        "ratio_chunked_offer_first_vs_raw": round(early_mbps / raw_mbps, 3),
        "ratio_chunked_offer_first_vs_raw_per_round_median": round(
            med(r["ratio_chunked_offer_first"] for r in per_round), 3
        ),
        "device_cpu_s_per_100mb_blocks": cpu_blocks, "device_cpu_s_per_100mb_chunked": cpu_chunks,
        "baseline": base_report,
        "rounds_detail": per_round, "cap": cap, "fleet": fleet, "resume": resume, "shaped": shaped,
    }  # fmt: skip
    print(f"{'what (medians over rounds, interleaved)':52} {'figure':>14}")
    print(f"{'raw broker throughput, same bytes, QoS 1':52} {raw_mbps:>9.1f} MB/s")
    print(f"{'end to end, offer first (publish || fetch + verify)':52} {over_mbps:>9.1f} MB/s")
    print(f"{'  ratio to raw (goal >= 0.70)':52} {over_mbps / raw_mbps:>14.2f}")
    print(f"{'end to end, offer last (publish, then fetch + verify)':52} {seq_mbps:>9.1f} MB/s")
    print(f"{'  ratio to raw':52} {seq_mbps / raw_mbps:>14.2f}")
    print(f"{'device fetch + verify only (publish is once)':52} {fetch_mbps:>9.1f} MB/s")
    print(f"{'  ratio to raw':52} {fetch_mbps / raw_mbps:>14.2f}")
    print(f"{'chunks, end to end (publish, then fetch + verify)':52} {chunked_mbps:>9.1f} MB/s")
    print(f"{'  ratio to raw (goal >= 0.70)':52} {chunked_mbps / raw_mbps:>14.2f}")
    print(f"{'chunks, device fetch + verify only':52} {chunk_fetch_mbps:>9.1f} MB/s")
    print(f"{'  ratio to raw':52} {chunk_fetch_mbps / raw_mbps:>14.2f}")
    print(f"{'device CPU-seconds per 100 MB fetched, blocks':52} {cpu_blocks:>12.2f} s")
    print(f"{'device CPU-seconds per 100 MB fetched, chunks':52} {cpu_chunks:>12.2f} s")
    print(f"{'chunks, end to end, live offer first (publish || fetch)':52} {early_mbps:>9.1f} MB/s")
    print(f"{'  ratio to raw (goal >= 0.70)':52} {early_mbps / raw_mbps:>14.2f}")
    if cap:
        print(f"{'cap set, bytes/s':52} {cap['cap_bytes_per_s']:>14}")
        print(
            f"{'  achieved over ' + str(cap['seconds']) + ' s (agent counters)':52} {cap['achieved_bytes_per_s']:>14}"
        )
        print(f"{'  achieved / cap (goal within 0.90-1.10)':52} {cap['achieved_vs_cap']:>14.3f}")
    if fleet:
        print(f"{'fleet: devices (in-process fetchers), bundle MB':52} {fleet['devices']:>6} x {fleet['bundle_mb']:>5}")
        print(f"{'  raw fan-out of the same bytes to them, s':52} {fleet['raw_fanout_s']:>14.2f}")
        print(f"{'  every device fetched + verified, s':52} {fleet['fleet_end_to_end_s']:>14.2f}")
        print(f"{'  ratio raw fan-out / fleet':52} {fleet['ratio_fleet_vs_raw_fanout']:>14.2f}")
        print(f"{'  hashing CPU (all devices), s':52} {fleet['hashing_cpu_s']:>14.2f}")
    if resume:
        print(
            f"{'resume after kill -9: bytes re-fetched, max':52} {resume['refetched_bytes_max']:>14} (goal <= {block})"
        )
        lost = resume["devices_without_working_model"]
        print(f"{'kill -9 trials without a working model':52} {lost:>14} of {resume['trials']}")
    if base_report:
        base = base_report
        print(f"baseline device ({args.baseline_python}), same rounds:")
        print(f"{'  chunks, device fetch + verify only':52} {base['chunked_device_fetch_mb_s']:>9.1f} MB/s")
        print(f"{'    ratio to raw':52} {base['ratio_chunked_fetch_vs_raw']:>14.2f}")
        print(f"{'  blocks, device fetch + verify only':52} {base['device_fetch_mb_s']:>9.1f} MB/s")
        print(f"{'    ratio to raw':52} {base['ratio_fetch_vs_raw']:>14.2f}")
        cpu = f"{base['device_cpu_s_per_100mb_chunked']:.2f} / {base['device_cpu_s_per_100mb_blocks']:.2f} s"
        print(f"{'  device CPU-seconds per 100 MB, chunks / blocks':52} {cpu:>14}")
    if shaped:
        from transfers.shaped import print_shaped

        print_shaped(shaped)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


def _shaped_only(shaped: dict, out: Path | None) -> int:
    from transfers.shaped import print_shaped

    print_shaped(shaped)
    if out:
        out.write_text(json.dumps({"shaped": shaped}, indent=2))
    print(json.dumps({"shaped": shaped}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
