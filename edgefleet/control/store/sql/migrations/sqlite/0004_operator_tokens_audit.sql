-- The operator tables: API tokens (their sha256 only) and the audit trail of every state-changing operation
-- (edgefleet/control/store_sql_operator.py).
CREATE TABLE IF NOT EXISTS api_tokens (
    name TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION, revoked_at DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL,
    outcome TEXT NOT NULL, detail_json TEXT NOT NULL, via TEXT NOT NULL, remote TEXT
);
CREATE INDEX IF NOT EXISTS audit_ts ON audit (ts);
