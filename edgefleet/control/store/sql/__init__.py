"""The database layer under the store's repositories: one SQL codebase, two databases.

- `database`: what a repository sees: `Database` (read connections, write transactions, a unit of work retried
  whole after a lost connection), `Db`, the `Dialect` differences, and the batched-delete and window helpers.
- `sqlite.SqliteDatabase` and `postgres.PostgresDatabase`: the connections for each database, opened by
  `edgefleet.control.store.open_database` (PostgreSQL's driver is imported only when a PostgreSQL URL is used).
- `migrate` and `migrations/<dialect>/NNNN_*.sql`: the versioned schema, applied on open.
"""
