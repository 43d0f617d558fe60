-- The schema as the first SQLite store made it (IF NOT EXISTS: a file from before versioned migrations is adopted).
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY, online INTEGER NOT NULL, state TEXT NOT NULL, profile TEXT,
    groups_json TEXT NOT NULL DEFAULT '[]', labels_json TEXT NOT NULL DEFAULT '{}', agent_version TEXT,
    arch TEXT, os TEXT, hostname TEXT, active_bundle TEXT, active_model TEXT, provider TEXT,
    verified INTEGER NOT NULL DEFAULT 0, last_error TEXT, status_ts REAL NOT NULL, first_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS telemetry (
    device_id TEXT NOT NULL, seq INTEGER, ts REAL NOT NULL, bundle_id TEXT, provider TEXT, window_s REAL,
    requests INTEGER, errors INTEGER, p50_ms REAL, p95_ms REAL, p99_ms REAL, latency_count INTEGER,
    golden_agreement REAL, golden_max_abs_error REAL, cpu_percent REAL, rss_mb REAL, temperature_c REAL,
    received_at REAL, UNIQUE (device_id, seq, ts)
);
CREATE INDEX IF NOT EXISTS telemetry_device_ts ON telemetry (device_id, ts);
CREATE INDEX IF NOT EXISTS telemetry_ts ON telemetry (ts);
CREATE TABLE IF NOT EXISTS latest_telemetry (
    device_id TEXT PRIMARY KEY, seq INTEGER, ts REAL NOT NULL, bundle_id TEXT, provider TEXT, window_s REAL,
    requests INTEGER, errors INTEGER, p50_ms REAL, p95_ms REAL, p99_ms REAL, latency_count INTEGER,
    golden_agreement REAL, golden_max_abs_error REAL, cpu_percent REAL, rss_mb REAL, temperature_c REAL,
    received_at REAL
);
CREATE TABLE IF NOT EXISTS telemetry_rollup (
    device_id TEXT NOT NULL, bucket REAL NOT NULL, bundle_id TEXT NOT NULL, reports INTEGER NOT NULL,
    requests INTEGER NOT NULL, errors INTEGER NOT NULL, p50_sum REAL, p50_n INTEGER, p95_sum REAL, p95_n INTEGER,
    p95_max REAL, golden_sum REAL, golden_n INTEGER, golden_min REAL,
    PRIMARY KEY (device_id, bucket, bundle_id)
);
CREATE TABLE IF NOT EXISTS events (
    device_id TEXT NOT NULL, seq INTEGER, ts REAL NOT NULL, kind TEXT NOT NULL, bundle_id TEXT,
    detail TEXT NOT NULL, progress REAL, received_at REAL, UNIQUE (device_id, seq, ts)
);
CREATE INDEX IF NOT EXISTS events_device_ts ON events (device_id, ts);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE TABLE IF NOT EXISTS groups (
    name TEXT PRIMARY KEY, devices_json TEXT NOT NULL, selector TEXT, priority INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS deployments (
    scope TEXT NOT NULL, target TEXT NOT NULL, profile TEXT NOT NULL, bundle_id TEXT NOT NULL,
    model_name TEXT NOT NULL, model_version TEXT NOT NULL, rollback INTEGER NOT NULL, source TEXT NOT NULL,
    updated_at REAL NOT NULL, PRIMARY KEY (scope, target, profile)
);
CREATE TABLE IF NOT EXISTS published (
    device_id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, rollback INTEGER NOT NULL, issued_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS bundles (
    bundle_id TEXT PRIMARY KEY, model_name TEXT NOT NULL, model_version TEXT NOT NULL, profile TEXT NOT NULL,
    size INTEGER NOT NULL, accuracy_budget REAL, published_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, doc TEXT NOT NULL, command TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
