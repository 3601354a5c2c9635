//! The replicas sharing this store and the policy each serves (`GET /v1/policies`).

use sqlx::Row;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRow {
    pub id: String,
    pub role: String,
    pub policy_generation: i64,
    pub policy_digest: String,
    pub started_ms: i64,
    pub seen_ms: i64,
}

impl Store {
    /// Records (or refreshes) a replica's heartbeat.
    pub async fn upsert_replica(&self, r: &ReplicaRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, role, policy_generation, policy_digest, started_ms, seen_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (id) DO UPDATE SET role = excluded.role,
               policy_generation = excluded.policy_generation,
               policy_digest = excluded.policy_digest, seen_ms = excluded.seen_ms",
        )
        .bind(&r.id)
        .bind(&r.role)
        .bind(r.policy_generation)
        .bind(&r.policy_digest)
        .bind(r.started_ms)
        .bind(r.seen_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    /// Replicas seen at or after `since_ms`, by id; older rows are deleted (a replica that
    /// stopped heartbeating is gone).
    pub async fn live_replicas(&self, since_ms: i64) -> Result<Vec<ReplicaRow>, StoreError> {
        sqlx::query("DELETE FROM replicas WHERE seen_ms < ?1")
            .bind(since_ms)
            .execute(self.sqlite_pool())
            .await?;
        let rows = sqlx::query(
            "SELECT id, role, policy_generation, policy_digest, started_ms, seen_ms
             FROM replicas ORDER BY id",
        )
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows
            .iter()
            .map(|r| ReplicaRow {
                id: r.get("id"),
                role: r.get("role"),
                policy_generation: r.get("policy_generation"),
                policy_digest: r.get("policy_digest"),
                started_ms: r.get("started_ms"),
                seen_ms: r.get("seen_ms"),
            })
            .collect())
    }

    /// A replica shutting down leaves at once instead of after its heartbeat expires.
    pub async fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM replicas WHERE id = ?1")
            .bind(id)
            .execute(self.sqlite_pool())
            .await?;
        Ok(())
    }
}
