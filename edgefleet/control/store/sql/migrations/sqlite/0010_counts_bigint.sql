-- PostgreSQL's count columns become BIGINT in this version (its 0010_counts_bigint.sql). SQLite's INTEGER already
-- stores 64-bit integers, so nothing changes here; the file keeps both dialects at the same schema version.
SELECT 1;
