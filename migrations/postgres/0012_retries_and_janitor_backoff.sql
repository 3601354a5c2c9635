-- Postgres twin of migrations/0012_retries_and_janitor_backoff.sql.
-- Each retry of an attempt on its pool, and why (a JSON array of {at_ms, error_class, message,
-- wait_ms}); NULL: no retry.
ALTER TABLE attempts ADD COLUMN retries_json TEXT;
-- The janitor backs off per abandoned attempt: how often it looked the attempt up, and when it
-- looks again (0: at the next pass).
ALTER TABLE abandoned_instances ADD COLUMN checks BIGINT NOT NULL DEFAULT 0;
ALTER TABLE abandoned_instances ADD COLUMN next_check_ms BIGINT NOT NULL DEFAULT 0;
