-- Every count a device reports is a 64-bit integer, as SQLite's INTEGER always was (issue 32): PostgreSQL's INTEGER
-- is 32-bit, so a report with requests >= 2^31 was refused on PostgreSQL only. The bounds themselves are checked
-- at ingest (edgefleet/core/messages.py, MAX_COUNT and MAX_WINDOW_COUNT); the columns now hold any admitted value
-- and a bucket's sum of them. Rewrites the tables once (ALTER COLUMN ... TYPE takes an exclusive lock meanwhile).
ALTER TABLE telemetry ALTER COLUMN requests TYPE BIGINT, ALTER COLUMN errors TYPE BIGINT,
    ALTER COLUMN latency_count TYPE BIGINT;
ALTER TABLE latest_telemetry ALTER COLUMN requests TYPE BIGINT, ALTER COLUMN errors TYPE BIGINT,
    ALTER COLUMN latency_count TYPE BIGINT;
ALTER TABLE telemetry_rollup ALTER COLUMN reports TYPE BIGINT, ALTER COLUMN requests TYPE BIGINT,
    ALTER COLUMN errors TYPE BIGINT, ALTER COLUMN p50_n TYPE BIGINT, ALTER COLUMN p95_n TYPE BIGINT,
    ALTER COLUMN golden_n TYPE BIGINT;
ALTER TABLE telemetry_quality ALTER COLUMN field_samples TYPE BIGINT, ALTER COLUMN probe_requests TYPE BIGINT,
    ALTER COLUMN golden_failed TYPE BIGINT;
