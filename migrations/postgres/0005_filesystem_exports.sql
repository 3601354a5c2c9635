-- Postgres twin of migrations/0005_filesystem_exports.sql.
-- Filesystem exports: a snapshot whose archive (a gzip'd tar of the sandbox's files, read
-- through its provider's files API) sandgate keeps itself, restorable on any provider that
-- writes files. `provider` snapshots keep their archive with the provider, as before.
ALTER TABLE snapshots ADD COLUMN kind TEXT NOT NULL DEFAULT 'provider';
ALTER TABLE snapshots ADD COLUMN archive BYTEA;
