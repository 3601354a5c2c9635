-- Postgres twin of migrations/0011_sandbox_expiry.sql.
-- A sandbox's lifetime (`ttl_secs` at create, `POST /v1/sandboxes/{id}/timeout` later): the
-- janitor deletes a sandbox once `expires_ms` has passed. NULL: no lifetime.
ALTER TABLE sandboxes ADD COLUMN expires_ms BIGINT;
CREATE INDEX sandboxes_expiry ON sandboxes (expires_ms) WHERE expires_ms IS NOT NULL;
