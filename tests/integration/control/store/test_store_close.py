"""Closing a SQLite store while another thread is inside a statement (a loop a stop could not join in time, a
dashboard request still answering) lets that statement finish and closes its connection when it is handed back.
sqlite3 frees a running statement when its connection is closed under it, and the reading thread can then crash the
process (a segmentation fault on Python 3.11.7; CI once lost a pytest worker to one beside an in-process control
plane, its cause not established). The scenario runs in a child process, so a crash fails this test with the signal
instead of taking the test run with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCENARIO = r"""
import sys, threading, time
from pathlib import Path
from edgefleet.control.store.errors import StoreError
from edgefleet.control.store.sql.sqlite import SqliteDatabase

path = Path(sys.argv[1])
rounds, finished, refused = 10, 0, 0
for n in range(rounds):
    database = SqliteDatabase(path / f"s{n}.sqlite", f"sqlite://{path}/s{n}.sqlite")
    started, rows = threading.Event(), []

    def slow(x):
        started.set()
        time.sleep(0.0002)
        return x

    def read():
        with database.read() as db:
            conn = db.conn
            conn.create_function("slow", 1, slow)
            query = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 2000) "
            rows.extend(conn.execute(query + "SELECT slow(x) FROM r").fetchall())

    reader = threading.Thread(target=read)
    reader.start()
    started.wait(10)
    database.close()  # while the reader is inside its statement
    reader.join(60)
    finished += len(rows) == 2000
    try:
        with database.read() as db:
            db.execute("SELECT 1")
    except StoreError:
        refused += 1
print(f"{finished} {refused} {rounds}")
"""


def test_a_store_closed_while_another_thread_reads_lets_the_read_finish_and_refuses_new_work(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", SCENARIO, str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    finished, refused, rounds = map(int, result.stdout.split())
    assert finished == rounds, f"{rounds - finished} reads cut short by the close"
    assert refused == rounds, "a closed store takes no new work"
