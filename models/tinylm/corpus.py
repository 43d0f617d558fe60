"""The tinylm corpus: Python source from the standard library of the Python that runs this script.

Every machine with Python 3.11 has these files, so nothing is downloaded. The selection is deterministic:

* every ``.py`` file under ``sysconfig.get_paths()["stdlib"]``, except test suites (``test/``, ``tests/``,
  ``idle_test/``), ``idlelib/``, ``site-packages/``, ``lib2to3/``, ``tkinter/``, the generated codec tables in
  ``encodings/``, the build configuration (``config-*``, ``_sysconfigdata*``), generated data (``pydoc_data/``)
  and files over ``MAX_FILE_BYTES``;
* of those, files are taken in the order of a hash of their relative path until ``BUDGET_BYTES`` is reached, then
  sorted by path (a spread over the whole library rather than its first letters);
* each file goes to the held-out split when the hash of its relative path (with a different salt) falls in the
  bottom ``HELDOUT_PERCENT`` percent, else to the training split.

Because the standard library differs a little between patch versions, the held-out text the recorded perplexity
uses is committed (``heldout.txt``), as is the calibration text (``calib.txt``); ``python corpus.py --write`` makes
them again (only needed when the corpus rules change).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELDOUT_FILE = HERE / "heldout.txt"
CALIB_FILE = HERE / "calib.txt"

BUDGET_BYTES = 3_000_000  # the selected subset, train and held-out together
MAX_FILE_BYTES = 128_000
HELDOUT_PERCENT = 5
HELDOUT_MAX_BYTES = 200_000
CALIB_MAX_BYTES = 20_000
DOC_SEPARATOR = "\n\n"  # how files are joined in heldout.txt and calib.txt

SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "lib2to3", "tkinter"}
SKIP_TOP = {"encodings", "pydoc_data", "__pycache__", "lib-dynload", "ensurepip"}


@dataclass(frozen=True)
class Doc:
    """One source file: its path relative to the stdlib folder (with ``/``) and its text."""

    rel: str
    text: str


@dataclass(frozen=True)
class Corpus:
    train: tuple[Doc, ...]
    heldout: tuple[Doc, ...]
    python: str  # e.g. "3.11.7"
    stdlib: str  # the folder the files came from


def _hash(rel: str, salt: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}:{rel}".encode()).digest()[:8], "big")


def _eligible(root: Path) -> list[tuple[str, Path]]:
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if parts[0] in SKIP_TOP or parts[0].startswith("config-") or rel.startswith("_sysconfigdata"):
            continue
        if any(p in SKIP_DIRS for p in parts[:-1]) or parts[-1].startswith("test_"):
            continue
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES or path.stat().st_size == 0:
            continue
        out.append((rel, path))
    return sorted(out)


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    # One newline convention, no trailing blank lines: the text the model sees is the same everywhere.
    return text.replace("\r\n", "\n").rstrip() + "\n"


def build(stdlib: str | None = None) -> Corpus:
    """Select, read and split the files. Deterministic for a given standard library."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"standard library folder not found: {root}")
    chosen: list[Doc] = []
    total = 0
    for rel, path in sorted(_eligible(root), key=lambda item: (_hash(item[0], "select"), item[0])):
        text = _read(path)
        if text is None:
            continue
        size = len(text.encode())
        if total + size > BUDGET_BYTES:
            continue  # a smaller file later may still fit
        chosen.append(Doc(rel, text))
        total += size
    chosen.sort(key=lambda d: d.rel)
    heldout = tuple(d for d in chosen if _hash(d.rel, "split") % 100 < HELDOUT_PERCENT)
    train = tuple(d for d in chosen if _hash(d.rel, "split") % 100 >= HELDOUT_PERCENT)
    return Corpus(train, heldout, python=".".join(map(str, sys.version_info[:3])), stdlib=str(root))


def _take(docs: tuple[Doc, ...] | list[Doc], limit: int) -> list[Doc]:
    """Whole files, in order, while the joined text stays within ``limit`` bytes."""
    out: list[Doc] = []
    size = 0
    for d in docs:
        extra = len(d.text.encode()) + (len(DOC_SEPARATOR) if out else 0)
        if size + extra > limit:
            continue
        out.append(d)
        size += extra
    return out


def heldout_docs(corpus: Corpus) -> list[Doc]:
    return _take(corpus.heldout, HELDOUT_MAX_BYTES)


def calib_docs(corpus: Corpus) -> list[Doc]:
    # Small training files (up to 4 KB each) spread evenly over the split, about eight of them.
    small = [d for d in corpus.train if len(d.text.encode()) <= 4_000]
    return _take(small[:: max(1, len(small) // 8)], CALIB_MAX_BYTES)


def join(docs: list[Doc]) -> str:
    return DOC_SEPARATOR.join(d.text for d in docs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="(re)write heldout.txt and calib.txt")
    args = parser.parse_args()
    corpus = build()
    tr = sum(len(d.text.encode()) for d in corpus.train)
    ho = sum(len(d.text.encode()) for d in corpus.heldout)
    print(f"Python {corpus.python}, {corpus.stdlib}")
    print(f"train: {len(corpus.train)} files, {tr} bytes; held-out: {len(corpus.heldout)} files, {ho} bytes")
    hd, cd = heldout_docs(corpus), calib_docs(corpus)
    print("heldout.txt:", ", ".join(d.rel for d in hd))
    print("calib.txt:", ", ".join(d.rel for d in cd))
    if args.write:
        HELDOUT_FILE.write_text(join(hd), encoding="utf-8")
        CALIB_FILE.write_text(join(cd), encoding="utf-8")
        print(f"wrote {HELDOUT_FILE} ({HELDOUT_FILE.stat().st_size} B), {CALIB_FILE} ({CALIB_FILE.stat().st_size} B)")


if __name__ == "__main__":
    main()
