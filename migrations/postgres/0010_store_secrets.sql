-- Postgres twin of migrations/0010_store_secrets.sql.
-- Secrets of the deployment itself, sealed under the master key like credentials: today the
-- seed placeholders are derived from, kept here so that placeholders (which running
-- sandboxes hold) stay the same when the master key is rotated (`sandgate store rekey`).
CREATE TABLE store_secrets (
    name   TEXT PRIMARY KEY,
    sealed BYTEA NOT NULL
);
