-- Replicas of one deployment sharing this store: what each serves and which policy it
-- serves (by content digest), refreshed by each replica's heartbeat, so that any replica
-- can say when they disagree (GET /v1/policies).
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    policy_generation INTEGER NOT NULL,
    policy_digest TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    seen_ms INTEGER NOT NULL
);
