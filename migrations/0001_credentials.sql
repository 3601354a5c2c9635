-- Credentials: metadata as JSON, the secret sealed (AES-256-GCM) and never in plain text.
CREATE TABLE credentials (
    workspace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    meta_json   TEXT NOT NULL,
    sealed      BLOB NOT NULL,
    version     INTEGER NOT NULL DEFAULT 1,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (workspace, name)
);
