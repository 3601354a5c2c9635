-- Postgres twin of migrations/0004_delegations.sql.
-- Delegated capabilities: a principal lets an agent perform some of its own actions on one
-- sandbox until a deadline. Only the SHA-256 of the token is kept; the token is shown once.
CREATE TABLE delegations (
    id           TEXT PRIMARY KEY,
    token_hash   TEXT NOT NULL UNIQUE,
    sandbox_id   TEXT NOT NULL,
    workspace    TEXT NOT NULL,
    delegator    TEXT NOT NULL,
    agent        TEXT NOT NULL,
    actions_json TEXT NOT NULL,
    created_ms   BIGINT NOT NULL,
    expires_ms   BIGINT NOT NULL,
    revoked_ms   BIGINT
);
CREATE INDEX delegations_by_sandbox ON delegations (sandbox_id, created_ms);
