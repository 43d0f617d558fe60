-- Rows stored before ingest bounded numbers (issue 32) that lie outside those bounds are deleted: a report with
-- a negative, infinite or absurd figure, or dated ahead of now (it would stay a device's latest for ever). The
-- next report of such a device takes its place.
DELETE FROM latest_telemetry WHERE requests < 0 OR requests > 4294967296 OR errors < 0 OR errors > 4294967296 OR latency_count < 0 OR latency_count > 4294967296 OR NOT (p50_ms BETWEEN 0 AND 3600000) OR NOT (p95_ms BETWEEN 0 AND 3600000) OR NOT (p99_ms BETWEEN 0 AND 3600000) OR NOT (golden_agreement BETWEEN 0 AND 1) OR NOT (golden_max_abs_error BETWEEN 0 AND 1e300) OR NOT (cpu_percent BETWEEN 0 AND 409600) OR NOT (rss_mb BETWEEN 0 AND 1073741824) OR NOT (temperature_c BETWEEN -273.15 AND 1000) OR NOT (window_s BETWEEN 0 AND 604800) OR NOT (ts BETWEEN 0 AND EXTRACT(EPOCH FROM now()) + 300);
DELETE FROM telemetry WHERE requests < 0 OR requests > 4294967296 OR errors < 0 OR errors > 4294967296 OR latency_count < 0 OR latency_count > 4294967296 OR NOT (p50_ms BETWEEN 0 AND 3600000) OR NOT (p95_ms BETWEEN 0 AND 3600000) OR NOT (p99_ms BETWEEN 0 AND 3600000) OR NOT (golden_agreement BETWEEN 0 AND 1) OR NOT (golden_max_abs_error BETWEEN 0 AND 1e300) OR NOT (cpu_percent BETWEEN 0 AND 409600) OR NOT (rss_mb BETWEEN 0 AND 1073741824) OR NOT (temperature_c BETWEEN -273.15 AND 1000) OR NOT (window_s BETWEEN 0 AND 604800) OR NOT (ts BETWEEN 0 AND EXTRACT(EPOCH FROM now()) + 300);
DELETE FROM telemetry_rollup WHERE requests < 0 OR errors < 0 OR reports < 0 OR NOT (p95_max BETWEEN 0 AND 3600000) OR NOT (p50_sum BETWEEN 0 AND 1e300) OR NOT (p95_sum BETWEEN 0 AND 1e300) OR NOT (golden_sum BETWEEN 0 AND 1e300) OR NOT (golden_min BETWEEN 0 AND 1);
DELETE FROM telemetry_quality WHERE field_samples < 0 OR probe_requests < 0 OR golden_failed < 0 OR NOT (field_accuracy BETWEEN 0 AND 1) OR NOT (golden_min BETWEEN -1 AND 1) OR NOT (drift_max BETWEEN 0 AND 1e6) OR NOT (shadow_agreement BETWEEN -1 AND 1) OR NOT (ts BETWEEN 0 AND EXTRACT(EPOCH FROM now()) + 300);
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
