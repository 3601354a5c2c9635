-- Postgres twin of migrations/0003_snapshots.sql.
-- Snapshots of sandboxes' files, taken by a provider and restorable into a new sandbox of the
-- same workspace on the same pool. The archive itself lives with the provider.
CREATE TABLE snapshots (
    id          TEXT PRIMARY KEY,
    workspace   TEXT NOT NULL,
    sandbox_id  TEXT NOT NULL,
    pool        TEXT NOT NULL,
    provider    TEXT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    created_ms  BIGINT NOT NULL
);
CREATE INDEX snapshots_by_workspace ON snapshots (workspace, created_ms, id);
