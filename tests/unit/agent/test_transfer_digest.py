"""The whole-file sha256 of a download, computed as blocks arrive: equal to the file's, whatever the order."""

from __future__ import annotations

import hashlib
import random

from edgefleet.agent.transfer.digest import OrderedDigest

BLOCKS = [bytes([i]) * 1000 for i in range(40)]
WHOLE = hashlib.sha256(b"".join(BLOCKS)).hexdigest()


def _run(order: list[int], held_before: set[int], max_pending: int = 64) -> OrderedDigest:
    digest = OrderedDigest(len(BLOCKS), held_before.__contains__, BLOCKS.__getitem__, max_pending=max_pending)
    for index in order:
        digest.add(index, BLOCKS[index])
    assert digest.finish() == WHOLE
    return digest


def test_blocks_in_order_are_hashed_from_memory_alone() -> None:
    assert _run(list(range(40)), set()).read_back == 0


def test_blocks_out_of_order_give_the_same_digest() -> None:
    order = list(range(40))
    random.Random(3).shuffle(order)
    _run(order, set())


def test_early_blocks_beyond_the_memory_bound_are_read_back_from_disk() -> None:
    digest = _run([*range(1, 40), 0], set(), max_pending=5)
    assert digest.read_back == 39 - 5


def test_a_resumed_download_reads_the_blocks_it_already_held() -> None:
    held = set(range(0, 40, 2))
    digest = _run([i for i in range(40) if i not in held], held)
    assert digest.read_back == len(held)
