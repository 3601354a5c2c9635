//! The replicas sharing this store and the policy each serves (`GET /v1/policies`).

use super::{Store, StoreError, StoreRow};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRow {
    pub id: String,
    pub role: String,
    pub policy_generation: i64,
    pub policy_digest: String,
    pub started_ms: i64,
    pub seen_ms: i64,
}

fn from_row(r: &impl StoreRow) -> Result<ReplicaRow, sqlx::Error> {
    Ok(ReplicaRow {
        id: r.col("id")?,
        role: r.col("role")?,
        policy_generation: r.col("policy_generation")?,
        policy_digest: r.col("policy_digest")?,
        started_ms: r.col("started_ms")?,
        seen_ms: r.col("seen_ms")?,
    })
}

impl Store {
    /// Records (or refreshes) a replica's heartbeat.
    pub async fn upsert_replica(&self, r: &ReplicaRow) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO replicas
               (id, role, policy_generation, policy_digest, started_ms, seen_ms)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (id) DO UPDATE SET role = excluded.role,
               policy_generation = excluded.policy_generation,
               policy_digest = excluded.policy_digest, seen_ms = excluded.seen_ms";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(&r.id)
            .bind(&r.role)
            .bind(r.policy_generation)
            .bind(&r.policy_digest)
            .bind(r.started_ms)
            .bind(r.seen_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// Replicas seen at or after `since_ms`, by id; older rows are deleted (a replica that
    /// stopped heartbeating is gone).
    pub async fn live_replicas(&self, since_ms: i64) -> Result<Vec<ReplicaRow>, StoreError> {
        const PRUNE: &str = "DELETE FROM replicas WHERE seen_ms < $1";
        const SQL: &str = "SELECT id, role, policy_generation, policy_digest, started_ms, seen_ms
             FROM replicas ORDER BY id";
        with_pool!(self, pool => sqlx::query(PRUNE)
            .bind(since_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .fetch_all(pool)
            .await?
            .iter()
            .map(from_row)
            .collect::<Result<_, _>>()?))
    }

    /// A replica shutting down leaves at once instead of after its heartbeat expires.
    pub async fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        const SQL: &str = "DELETE FROM replicas WHERE id = $1";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }
}
