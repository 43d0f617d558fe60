"""The store's database layer against SQLAlchemy Core, on the ingestion write path (SQLite and PostgreSQL).

    python bench/store_layer.py [--rows 2000] [--batches 15] [--backends sqlite,postgresql] [--json] [--out FILE]

What ingestion does per batch: one transaction that inserts `--rows` telemetry reports with
`ON CONFLICT DO NOTHING` (the dedup on (device, seq, ts)). Each way writes the same rows into its own fresh
table, batch after batch, and the median per-batch time is compared side by side in one run:
- `own`: the store's layer (sqlite3 `executemany`; psycopg 3 `executemany`, which pipelines),
- `own-multirow`: one multi-row `INSERT ... VALUES (...), (...)` per chunk ,
- `own-copy` (PostgreSQL): `COPY` into a temporary table, then one `INSERT ... SELECT ... ON CONFLICT DO NOTHING`,
- `sqlalchemy`: SQLAlchemy Core, `insert(table).on_conflict_do_nothing()` executed with a list of rows
  (its "insertmanyvalues" batching: multi-row VALUES on both dialects).
Prints a table (batches/s, rows/s, median ms, ratio to `own`), and writes JSON with `--json`/`--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

COLUMNS = [
    "device_id", "seq", "ts", "bundle_id", "provider", "window_s", "requests", "errors", "p50_ms", "p95_ms",
    "p99_ms", "latency_count", "golden_agreement", "golden_max_abs_error", "cpu_percent", "rss_mb",
    "temperature_c", "received_at",
]  # fmt: skip
TYPES = [
    "TEXT", "BIGINT", "DOUBLE PRECISION", "TEXT", "TEXT", "DOUBLE PRECISION", "BIGINT", "BIGINT",
    "DOUBLE PRECISION", "DOUBLE PRECISION", "DOUBLE PRECISION", "BIGINT", "DOUBLE PRECISION", "DOUBLE PRECISION",
    "DOUBLE PRECISION", "DOUBLE PRECISION", "DOUBLE PRECISION", "DOUBLE PRECISION",
]  # fmt: skip


def rows_for(batch: int, n: int) -> list[tuple[Any, ...]]:
    base = 1_700_000_000.0 + batch
    return [
        (f"dev-{i % 5000:05d}", batch * n + i, base + i * 1e-3, "digits-1.0.0-generic-x86-64", "cpu", 1.0, 20, 0,
         0.4, 0.8, 1.1, 20, 1.0, 0.0, 12.5, 80.0, None, base)
        for i in range(n)
    ]  # fmt: skip


def ddl(table: str) -> str:
    cols = ", ".join(f"{c} {t}" for c, t in zip(COLUMNS, TYPES, strict=True))
    return f"CREATE TABLE {table} ({cols}, UNIQUE (device_id, seq, ts))"


def insert_sql(table: str, mark: str) -> str:
    return (
        f"INSERT INTO {table} ({', '.join(COLUMNS)}) VALUES ({', '.join(mark for _ in COLUMNS)}) ON CONFLICT DO NOTHING"
    )


def multirow_sql(table: str, mark: str, n: int) -> str:
    one = "(" + ", ".join(mark for _ in COLUMNS) + ")"
    return (
        f"INSERT INTO {table} ({', '.join(COLUMNS)}) VALUES {', '.join(one for _ in range(n))} ON CONFLICT DO NOTHING"
    )


def sqlite_ways(path: Path) -> dict[str, Callable[[Sequence[tuple[Any, ...]]], None]]:
    import sqlite3

    import sqlalchemy as sa
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for t in ("t_own", "t_multi", "t_sa"):
        conn.execute(ddl(t))

    def own(data: Sequence[tuple[Any, ...]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert_sql("t_own", "?"), data)
        conn.execute("COMMIT")

    def multi(data: Sequence[tuple[Any, ...]]) -> None:
        chunk = 999 // len(COLUMNS)  # SQLite's default host-parameter limit is 32766 since 3.32; stay portable
        conn.execute("BEGIN IMMEDIATE")
        for i in range(0, len(data), chunk):
            part = data[i : i + chunk]
            conn.execute(multirow_sql("t_multi", "?", len(part)), [v for row in part for v in row])
        conn.execute("COMMIT")

    engine = sa.create_engine(f"sqlite:///{path}")
    table = sa.Table("t_sa", sa.MetaData(), autoload_with=engine)
    statement = sqlite_insert(table).on_conflict_do_nothing()

    def alchemy(data: Sequence[tuple[Any, ...]]) -> None:
        with engine.begin() as c:
            c.execute(statement, [dict(zip(COLUMNS, row, strict=True)) for row in data])

    return {"own": own, "own-multirow": multi, "sqlalchemy": alchemy}


def postgres_ways(url: str) -> dict[str, Callable[[Sequence[tuple[Any, ...]]], None]]:
    import psycopg
    import sqlalchemy as sa
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    conn = psycopg.connect(url, autocommit=True)
    for t in ("t_own", "t_multi", "t_copy", "t_sa"):
        conn.execute(ddl(t))  # type: ignore[arg-type]

    def own(data: Sequence[tuple[Any, ...]]) -> None:
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(insert_sql("t_own", "%s"), data)  # type: ignore[arg-type]

    def multi(data: Sequence[tuple[Any, ...]]) -> None:
        chunk = 500
        with conn.transaction():
            for i in range(0, len(data), chunk):
                part = data[i : i + chunk]
                conn.execute(multirow_sql("t_multi", "%s", len(part)), [v for row in part for v in row])  # type: ignore[arg-type]

    def copy(data: Sequence[tuple[Any, ...]]) -> None:
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS t_stage (LIKE t_copy) ON COMMIT DELETE ROWS")
            with conn.cursor() as cur, cur.copy(f"COPY t_stage ({', '.join(COLUMNS)}) FROM STDIN") as out:  # type: ignore[arg-type]
                for row in data:
                    out.write_row(row)
            conn.execute("INSERT INTO t_copy SELECT * FROM t_stage ON CONFLICT DO NOTHING")

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    table = sa.Table("t_sa", sa.MetaData(), autoload_with=engine)
    statement = pg_insert(table).on_conflict_do_nothing()

    def alchemy(data: Sequence[tuple[Any, ...]]) -> None:
        with engine.begin() as c:
            c.execute(statement, [dict(zip(COLUMNS, row, strict=True)) for row in data])

    return {"own": own, "own-multirow": multi, "own-copy": copy, "sqlalchemy": alchemy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            server = None
            if backend == "sqlite":
                ways = sqlite_ways(Path(tmp) / "bench.sqlite")
            else:
                from support.servers.pg_server import PostgresServer

                server = PostgresServer(durable=True).start()
                ways = postgres_ways(server.create_database("bench"))
            try:
                # interleaved rounds, so background load falls on every way alike
                times: dict[str, list[float]] = {name: [] for name in ways}
                for b in range(args.batches):
                    for name, write in ways.items():
                        data = rows_for(b, args.rows)
                        started = time.perf_counter()
                        write(data)
                        times[name].append(time.perf_counter() - started)
                base = statistics.median(times["own"])
                for name, ts in times.items():
                    med = statistics.median(ts)
                    results.append({
                        "backend": backend, "way": name, "rows": args.rows, "batches": args.batches,
                        "median_ms": round(med * 1000, 2), "rows_per_s": round(args.rows / med),
                        "ratio_to_own": round(med / base, 2),
                    })  # fmt: skip
            finally:
                if server is not None:
                    server.close()
    print(f"{'backend':<11} {'way':<13} {'median ms':>10} {'rows/s':>9} {'x own':>6}")
    for r in results:
        print(f"{r['backend']:<11} {r['way']:<13} {r['median_ms']:>10} {r['rows_per_s']:>9} {r['ratio_to_own']:>6}")
    if args.json or args.out:
        text = json.dumps({"bench": "store_layer", "results": results}, indent=2)
        if args.out:
            args.out.write_text(text)
        else:
            print(text)


if __name__ == "__main__":
    main()
