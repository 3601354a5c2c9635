-- Postgres twin of migrations/0001_credentials.sql (same tables, columns and meaning).
-- Credentials: metadata as JSON, the secret sealed (AES-256-GCM) and never in plain text.
-- The timestamps are the same ISO-8601 UTC text the SQLite schema writes.
CREATE TABLE credentials (
    workspace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    meta_json   TEXT NOT NULL,
    sealed      BYTEA NOT NULL,
    version     BIGINT NOT NULL DEFAULT 1,
    created_at  TEXT NOT NULL DEFAULT (to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
    updated_at  TEXT NOT NULL DEFAULT (to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
    PRIMARY KEY (workspace, name)
);
