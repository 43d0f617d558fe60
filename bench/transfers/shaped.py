"""The transfer bench on a shaped link (bench/transfer.py --links): the device process in a network namespace of its
own, reaching Mosquitto only through the user-space relay of bench/transfers/shaper.py (a rate and a one-way delay
each way), over a veth pair. Where a namespace cannot be made (not root, no `ip`), the relay runs on loopback and the
result says so.

Per link, interleaved rounds: the link's own goodput (the same bytes as block-sized QoS 1 messages to the device,
through the same relay: what any MQTT client gets from this link), then the device's chunked and block fetch of a
fresh bundle published beforehand (offer last: the fetch alone, from the offer's publish to the verified file), and
the device process's CPU seconds for each fetch.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from edgefleet.core.mqtt.connection import Connection
from transfers.flow import DeviceProcess, bundle_remote, raw_remote

SHAPER = Path(__file__).with_name("shaper.py")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


class Namespace:
    """A network namespace joined to this one by a veth pair: the device inside at .2, the relay outside at .1."""

    def __init__(self) -> None:
        tag = os.getpid() % 100_000
        self.name, self.outer, self.inner = f"efbench{tag}", f"efb{tag}o", f"efb{tag}i"
        self.relay_host, self.device_host = "10.213.77.1", "10.213.77.2"
        self.made = False
        self.why_not: str | None = None

    def __enter__(self) -> Namespace:
        try:
            _ip("netns", "add", self.name)
            self.made = True
            _ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
            _ip("link", "set", self.inner, "netns", self.name)
            _ip("addr", "add", f"{self.relay_host}/30", "dev", self.outer)
            _ip("link", "set", self.outer, "up")
            _ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.device_host}/30", "dev", self.inner)
            _ip("netns", "exec", self.name, "ip", "link", "set", self.inner, "up")
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        except (OSError, subprocess.SubprocessError) as err:
            detail = getattr(err, "stderr", None) or str(err)
            self.why_not = f"no network namespace ({detail.strip()}): the relay on loopback instead"
            self._remove()
            self.relay_host = "127.0.0.1"
        return self

    @property
    def prefix(self) -> list[str]:
        """What runs a command inside (nothing when there is no namespace)."""
        return [] if self.why_not else ["ip", "netns", "exec", self.name]

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def _remove(self) -> None:
        if not self.made:
            return
        for args in (("link", "del", self.outer), ("netns", "del", self.name)):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _ip(*args)
        self.made = False


class Relay:
    """bench/transfers/shaper.py in its own process, relaying `listen_host` to the broker."""

    def __init__(self, listen_host: str, upstream: str, mbit: float, rtt_ms: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SHAPER), "--listen", f"{listen_host}:0", "--upstream", upstream,
             "--mbit", str(mbit), "--rtt-ms", str(rtt_ms)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            self.close()
            raise RuntimeError(f"the shaper did not start: {line!r}")
        self.url = f"mqtt://{listen_host}:{line[1]}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def parse_links(text: str) -> list[tuple[float, float]]:
    """`20:50,200:5` -> [(20 Mbit/s, 50 ms RTT), (200 Mbit/s, 5 ms RTT)]."""
    links = []
    for item in text.split(","):
        mbit, _, rtt = item.partition(":")
        links.append((float(mbit), float(rtt)))
    return links


def shaped_trials(
    host: Connection,
    broker_port: int,
    bundle_of: Callable[[str, float, int], Path],
    block: int,
    links: list[tuple[float, float]],
    mb: float,
    rounds: int,
    window: int,
) -> dict:
    med = statistics.median
    results = []
    with Namespace() as namespace:
        for n, (mbit, rtt_ms) in enumerate(links):
            relay = Relay(namespace.relay_host, f"127.0.0.1:{broker_port}", mbit, rtt_ms)
            device = DeviceProcess(relay.url, prefix=namespace.prefix)
            raw, chunked, blocks, size = [], [], [], 0
            chunk_cpu: list[float] = []
            block_cpu: list[float] = []
            try:
                for i in range(rounds):
                    seed = 5000 + 100 * n + i
                    chunk_bundle = bundle_of(f"{seed}", mb, seed)
                    block_bundle = bundle_of(f"{seed + 50}", mb, seed + 50)
                    data = chunk_bundle.read_bytes()
                    size = len(data)
                    raw.append(size / raw_remote(host, device, data, block, f"link{n}-{i}"))
                    pub, total = bundle_remote(
                        host, device, chunk_bundle, block, offer_first=False, chunks=True, cpu=chunk_cpu
                    )
                    chunked.append(size / (total - pub))
                    pub, total = bundle_remote(host, device, block_bundle, block, offer_first=False, cpu=block_cpu)
                    blocks.append(block_bundle.stat().st_size / (total - pub))
                    chunk_bundle.unlink()
                    block_bundle.unlink()
            finally:
                device.close()
                relay.close()
            link_mb_s = med(raw) / 1e6
            results.append({
                "mbit": mbit, "rtt_ms": rtt_ms, "bundle_mb": round(size / 1e6, 2), "rounds": rounds,
                "link_rate_mb_s": round(mbit / 8, 2),
                "link_goodput_mb_s": round(link_mb_s, 2),
                "chunked_fetch_mb_s": round(med(chunked) / 1e6, 2),
                "ratio_chunked_fetch_vs_link": round(med(chunked) / 1e6 / link_mb_s, 3),
                "block_fetch_mb_s": round(med(blocks) / 1e6, 2),
                "ratio_block_fetch_vs_link": round(med(blocks) / 1e6 / link_mb_s, 3),
                "device_cpu_s_per_100mb_chunked": round(med(chunk_cpu) * 100 / (size / 1e6), 3),
                "per_round_link_mb_s": [round(r / 1e6, 2) for r in raw],
                "per_round_chunked_mb_s": [round(c / 1e6, 2) for c in chunked],
                "per_round_block_mb_s": [round(b / 1e6, 2) for b in blocks],
            })  # fmt: skip
        where = namespace.why_not or f"device in network namespace {namespace.name}, veth to the relay"
    return {"where": where, "window": window, "links": results}


def print_shaped(shaped: dict) -> None:
    print(f"shaped link ({shaped['where']}):")
    for link in shaped["links"]:
        name = f"{link['mbit']:g} Mbit/s, {link['rtt_ms']:g} ms RTT"
        print(f"  {name + ': link goodput (raw QoS 1)':50} {link['link_goodput_mb_s']:>9.2f} MB/s")
        print(
            f"  {'  device chunked fetch, ratio to link (goal >= 0.9)':50} {link['chunked_fetch_mb_s']:>9.2f} MB/s"
            f" {link['ratio_chunked_fetch_vs_link']:>6.2f}"
        )
        print(
            f"  {'  device block fetch, ratio to link':50} {link['block_fetch_mb_s']:>9.2f} MB/s"
            f" {link['ratio_block_fetch_vs_link']:>6.2f}"
        )
