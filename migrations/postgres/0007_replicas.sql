-- Postgres twin of migrations/0007_replicas.sql.
-- Replicas of one deployment sharing this store: what each serves and which policy it
-- serves (by content digest), refreshed by each replica's heartbeat, so that any replica
-- can say when they disagree (GET /v1/policies).
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    policy_generation BIGINT NOT NULL,
    policy_digest TEXT NOT NULL,
    started_ms BIGINT NOT NULL,
    seen_ms BIGINT NOT NULL
);
