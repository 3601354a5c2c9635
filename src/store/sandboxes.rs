//! Sandbox creation state: sandboxes, attempts, idempotency keys, per-pool samples, abandoned
//! instances and coordinator leases. Every statement lives here; the coordinator and the API
//! only call these methods, so a Postgres implementation can follow behind the same surface.

use std::collections::HashMap;

use sqlx::Row;

use super::{Store, StoreError};

/// States in which a create is still being worked on (owned by a lease).
pub const IN_FLIGHT_STATES: [&str; 3] = ["pending", "provisioning", "reconciling"];

#[derive(Debug, Clone)]
pub struct SandboxRow {
    pub id: String,
    pub workspace: String,
    pub principal_json: String,
    pub state: String,
    pub request_json: String,
    pub labels_json: String,
    pub candidates_json: String,
    pub placement_json: Option<String>,
    /// Why the candidate list is what it is (see `create::record`); written once, at insert.
    pub placement_record_json: Option<String>,
    pub error_json: Option<String>,
    pub token_sealed: Vec<u8>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

#[derive(Debug, Clone)]
pub struct AttemptRow {
    pub id: String,
    pub sandbox_id: String,
    pub seq: i64,
    pub pool: String,
    pub provider: String,
    pub account: String,
    pub state: String,
    pub outcome: Option<String>,
    pub error_class: Option<String>,
    pub message: Option<String>,
    pub instance_id: Option<String>,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
}

/// The end of an attempt.
#[derive(Debug, Clone)]
pub struct AttemptEnd<'a> {
    pub state: &'a str,
    pub outcome: &'a str,
    pub error_class: Option<&'a str>,
    pub message: Option<&'a str>,
    pub instance_id: Option<&'a str>,
    pub finished_ms: i64,
}

/// A successful attempt and the placement it makes.
#[derive(Debug, Clone, Copy)]
pub struct Success<'a> {
    pub attempt_id: &'a str,
    pub sandbox_id: &'a str,
    pub instance_id: &'a str,
    pub pool: &'a str,
    pub latency_ms: f64,
    pub placement_json: &'a str,
    pub now_ms: i64,
}

#[derive(Debug, Clone)]
pub struct AbandonedRow {
    pub attempt_id: String,
    pub sandbox_id: String,
    pub pool: String,
    pub account: String,
}

/// An idempotency key to claim together with a new sandbox.
pub struct IdempotencyClaim<'a> {
    pub key: &'a str,
    pub body_hash: &'a str,
    pub expires_ms: i64,
}

pub enum InsertOutcome {
    Created,
    /// The key is held (unexpired) by an earlier request.
    Existing {
        sandbox_id: String,
        body_hash: String,
    },
}

#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    pub workspace: Option<String>,
    pub state: Option<String>,
    pub label: Option<(String, String)>,
    /// Opaque cursor: the id of the last sandbox of the previous page.
    pub after: Option<String>,
    pub limit: u32,
}

/// Measured per-pool statistics within a window.
#[derive(Debug, Default, Clone)]
pub struct PoolSamples {
    pub latencies_ms: Vec<f64>,
    pub attempts: u64,
    pub successes: u64,
}

const SANDBOX_COLUMNS: &str = "id, workspace, principal_json, state, request_json, labels_json, candidates_json, placement_json, placement_record_json, error_json, token_sealed, created_ms, updated_ms";
const ATTEMPT_COLUMNS: &str = "id, sandbox_id, seq, pool, provider, account, state, outcome, error_class, message, instance_id, started_ms, finished_ms";

fn sandbox_row(r: &sqlx::sqlite::SqliteRow) -> SandboxRow {
    SandboxRow {
        id: r.get("id"),
        workspace: r.get("workspace"),
        principal_json: r.get("principal_json"),
        state: r.get("state"),
        request_json: r.get("request_json"),
        labels_json: r.get("labels_json"),
        candidates_json: r.get("candidates_json"),
        placement_json: r.get("placement_json"),
        placement_record_json: r.get("placement_record_json"),
        error_json: r.get("error_json"),
        token_sealed: r.get("token_sealed"),
        created_ms: r.get("created_ms"),
        updated_ms: r.get("updated_ms"),
    }
}

fn attempt_row(r: &sqlx::sqlite::SqliteRow) -> AttemptRow {
    AttemptRow {
        id: r.get("id"),
        sandbox_id: r.get("sandbox_id"),
        seq: r.get("seq"),
        pool: r.get("pool"),
        provider: r.get("provider"),
        account: r.get("account"),
        state: r.get("state"),
        outcome: r.get("outcome"),
        error_class: r.get("error_class"),
        message: r.get("message"),
        instance_id: r.get("instance_id"),
        started_ms: r.get("started_ms"),
        finished_ms: r.get("finished_ms"),
    }
}

impl Store {
    /// The unexpired holder of an idempotency key.
    pub async fn find_idempotency_key(
        &self,
        workspace: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<(String, String)>, StoreError> {
        let row = sqlx::query(
            "SELECT body_hash, sandbox_id FROM idempotency_keys
             WHERE workspace = ?1 AND key = ?2 AND expires_ms > ?3",
        )
        .bind(workspace)
        .bind(key)
        .bind(now_ms)
        .fetch_optional(self.sqlite_pool())
        .await?;
        Ok(row.map(|r| (r.get("body_hash"), r.get("sandbox_id"))))
    }

    /// Inserts a new sandbox and, atomically with it, claims its idempotency key. When the key
    /// is already held (a concurrent or earlier identical request), nothing is inserted and the
    /// holder is returned.
    pub async fn insert_sandbox(
        &self,
        row: &SandboxRow,
        lease_owner: &str,
        lease_expires_ms: i64,
        claim: Option<IdempotencyClaim<'_>>,
        now_ms: i64,
    ) -> Result<InsertOutcome, StoreError> {
        let mut tx = self.sqlite_pool().begin().await?;
        // The first statement writes, so the transaction takes the write lock at once (no
        // read-to-write upgrade that SQLite would refuse under contention).
        sqlx::query(
            "INSERT INTO sandboxes (id, workspace, principal_json, state, request_json, labels_json,
               candidates_json, placement_json, error_json, token_sealed, lease_owner,
               lease_expires_ms, created_ms, updated_ms, placement_record_json)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, ?14)",
        )
        .bind(&row.id)
        .bind(&row.workspace)
        .bind(&row.principal_json)
        .bind(&row.state)
        .bind(&row.request_json)
        .bind(&row.labels_json)
        .bind(&row.candidates_json)
        .bind(&row.placement_json)
        .bind(&row.error_json)
        .bind(&row.token_sealed)
        .bind(lease_owner)
        .bind(lease_expires_ms)
        .bind(row.created_ms)
        .bind(&row.placement_record_json)
        .execute(&mut *tx)
        .await?;
        if let Some(claim) = claim {
            sqlx::query(
                "INSERT INTO idempotency_keys (workspace, key, body_hash, sandbox_id, expires_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (workspace, key) DO UPDATE SET body_hash = excluded.body_hash,
                   sandbox_id = excluded.sandbox_id, expires_ms = excluded.expires_ms
                 WHERE idempotency_keys.expires_ms <= ?6",
            )
            .bind(&row.workspace)
            .bind(claim.key)
            .bind(claim.body_hash)
            .bind(&row.id)
            .bind(claim.expires_ms)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            let holder = sqlx::query(
                "SELECT body_hash, sandbox_id FROM idempotency_keys WHERE workspace = ?1 AND key = ?2",
            )
            .bind(&row.workspace)
            .bind(claim.key)
            .fetch_one(&mut *tx)
            .await?;
            let sandbox_id: String = holder.get("sandbox_id");
            if sandbox_id != row.id {
                tx.rollback().await?;
                return Ok(InsertOutcome::Existing {
                    sandbox_id,
                    body_hash: holder.get("body_hash"),
                });
            }
        }
        tx.commit().await?;
        Ok(InsertOutcome::Created)
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1"
        )))
        .bind(id)
        .fetch_optional(self.sqlite_pool())
        .await?;
        Ok(row.as_ref().map(sandbox_row))
    }

    /// Sandboxes ordered by creation, filtered, one page at a time.
    pub async fn list_sandboxes(&self, f: &ListFilter) -> Result<Vec<SandboxRow>, StoreError> {
        let mut sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes s WHERE 1 = 1");
        if f.workspace.is_some() {
            sql.push_str(" AND workspace = ?1");
        }
        if f.state.is_some() {
            sql.push_str(" AND state = ?2");
        }
        if f.label.is_some() {
            sql.push_str(
                " AND EXISTS (SELECT 1 FROM json_each(s.labels_json) j WHERE j.key = ?3 AND j.value = ?4)",
            );
        }
        if f.after.is_some() {
            sql.push_str(
                " AND (created_ms, id) > (SELECT created_ms, id FROM sandboxes WHERE id = ?5)",
            );
        }
        sql.push_str(" ORDER BY created_ms, id LIMIT ?6");
        let (lk, lv) = f.label.clone().unzip();
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&f.workspace)
            .bind(&f.state)
            .bind(lk)
            .bind(lv)
            .bind(&f.after)
            .bind(f.limit as i64)
            .fetch_all(self.sqlite_pool())
            .await?;
        Ok(rows.iter().map(sandbox_row).collect())
    }

    /// Changes the state when it is currently one of `from`; returns whether it did.
    pub async fn transition_sandbox(
        &self,
        id: &str,
        from: &[&str],
        to: &str,
        placement_json: Option<&str>,
        error_json: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let from_list = serde_json::to_string(from).unwrap_or_else(|_| "[]".into());
        let done = sqlx::query(
            "UPDATE sandboxes SET state = ?2,
               placement_json = COALESCE(?3, placement_json),
               error_json = COALESCE(?4, error_json), updated_ms = ?5
             WHERE id = ?1 AND state IN (SELECT value FROM json_each(?6))",
        )
        .bind(id)
        .bind(to)
        .bind(placement_json)
        .bind(error_json)
        .bind(now_ms)
        .bind(from_list)
        .execute(self.sqlite_pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    pub async fn insert_attempt(&self, a: &AttemptRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO attempts (id, sandbox_id, seq, pool, provider, account, state, outcome,
               error_class, message, instance_id, started_ms, finished_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )
        .bind(&a.id)
        .bind(&a.sandbox_id)
        .bind(a.seq)
        .bind(&a.pool)
        .bind(&a.provider)
        .bind(&a.account)
        .bind(&a.state)
        .bind(&a.outcome)
        .bind(&a.error_class)
        .bind(&a.message)
        .bind(&a.instance_id)
        .bind(a.started_ms)
        .bind(a.finished_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    /// Records a new attempt and moves the sandbox from `pending` to `provisioning`, in one
    /// transaction.
    pub async fn start_attempt(&self, a: &AttemptRow, now_ms: i64) -> Result<(), StoreError> {
        let mut tx = self.sqlite_pool().begin().await?;
        sqlx::query(
            "INSERT INTO attempts (id, sandbox_id, seq, pool, provider, account, state, outcome,
               error_class, message, instance_id, started_ms, finished_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, NULL, NULL, NULL, ?8, NULL)",
        )
        .bind(&a.id)
        .bind(&a.sandbox_id)
        .bind(a.seq)
        .bind(&a.pool)
        .bind(&a.provider)
        .bind(&a.account)
        .bind(&a.state)
        .bind(a.started_ms)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE sandboxes SET state = 'provisioning', updated_ms = ?2
             WHERE id = ?1 AND state = 'pending'",
        )
        .bind(&a.sandbox_id)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ends a successful attempt, records its sample and places the sandbox, in one
    /// transaction. Returns false (placement not recorded) when the sandbox is no longer in
    /// flight, e.g. it was deleted meanwhile.
    pub async fn succeed_and_place(&self, s: &Success<'_>) -> Result<bool, StoreError> {
        let Success {
            attempt_id,
            sandbox_id,
            instance_id,
            pool,
            latency_ms,
            placement_json,
            now_ms,
        } = *s;
        let mut tx = self.sqlite_pool().begin().await?;
        sqlx::query(
            "UPDATE attempts SET state = 'succeeded', outcome = 'success', error_class = NULL,
               message = NULL, instance_id = ?2, finished_ms = ?3 WHERE id = ?1",
        )
        .bind(attempt_id)
        .bind(instance_id)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO pool_samples (pool, at_ms, success, latency_ms) VALUES (?1, ?2, 1, ?3)",
        )
        .bind(pool)
        .bind(now_ms)
        .bind(latency_ms)
        .execute(&mut *tx)
        .await?;
        let placed = sqlx::query(
            "UPDATE sandboxes SET state = 'running', placement_json = ?2, updated_ms = ?3
             WHERE id = ?1 AND state IN ('pending', 'provisioning', 'reconciling')",
        )
        .bind(sandbox_id)
        .bind(placement_json)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        tx.commit().await?;
        Ok(placed)
    }

    pub async fn set_attempt_state(&self, id: &str, state: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE attempts SET state = ?2 WHERE id = ?1")
            .bind(id)
            .bind(state)
            .execute(self.sqlite_pool())
            .await?;
        Ok(())
    }

    pub async fn finish_attempt(&self, id: &str, end: &AttemptEnd<'_>) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE attempts SET state = ?2, outcome = ?3, error_class = ?4, message = ?5,
               instance_id = COALESCE(?6, instance_id), finished_ms = ?7 WHERE id = ?1",
        )
        .bind(id)
        .bind(end.state)
        .bind(end.outcome)
        .bind(end.error_class)
        .bind(end.message)
        .bind(end.instance_id)
        .bind(end.finished_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    pub async fn list_attempts(&self, sandbox_id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE sandbox_id = ?1 ORDER BY seq"
        )))
        .bind(sandbox_id)
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows.iter().map(attempt_row).collect())
    }

    /// One creation attempt's result on a pool, for the router's ranking.
    pub async fn record_sample(
        &self,
        pool: &str,
        at_ms: i64,
        success: bool,
        latency_ms: Option<f64>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO pool_samples (pool, at_ms, success, latency_ms) VALUES (?1, ?2, ?3, ?4)",
        )
        .bind(pool)
        .bind(at_ms)
        .bind(success as i64)
        .bind(latency_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    /// Per-pool statistics since `since_ms`: attempt and success counts, and the latencies of
    /// the newest `max_latencies` successful attempts. Aggregated in SQL, so the cost does
    /// not grow with the number of sandboxes in Rust.
    pub async fn pool_samples(
        &self,
        since_ms: i64,
        max_latencies: usize,
    ) -> Result<HashMap<String, PoolSamples>, StoreError> {
        let counts = sqlx::query(
            "SELECT pool, COUNT(*) AS attempts, SUM(success) AS successes FROM pool_samples
             WHERE at_ms >= ?1 GROUP BY pool",
        )
        .bind(since_ms)
        .fetch_all(self.sqlite_pool())
        .await?;
        let mut out: HashMap<String, PoolSamples> = HashMap::new();
        for r in counts {
            let attempts: i64 = r.get("attempts");
            let successes: i64 = r.get("successes");
            out.insert(
                r.get("pool"),
                PoolSamples {
                    latencies_ms: Vec::new(),
                    attempts: attempts as u64,
                    successes: successes as u64,
                },
            );
        }
        let latencies = sqlx::query(
            "SELECT pool, latency_ms FROM (
               SELECT pool, latency_ms,
                 ROW_NUMBER() OVER (PARTITION BY pool ORDER BY at_ms DESC, id DESC) AS rn
               FROM pool_samples
               WHERE at_ms >= ?1 AND success = 1 AND latency_ms IS NOT NULL)
             WHERE rn <= ?2",
        )
        .bind(since_ms)
        .bind(max_latencies as i64)
        .fetch_all(self.sqlite_pool())
        .await?;
        for r in latencies {
            let pool: String = r.get("pool");
            let latency: f64 = r.get("latency_ms");
            out.entry(pool).or_default().latencies_ms.push(latency);
        }
        Ok(out)
    }

    /// Raw samples since `since_ms`, oldest first: (pool, at_ms, success, latency_ms). Read
    /// once at start-up to seed the coordinator's in-memory window.
    pub async fn samples_since(
        &self,
        since_ms: i64,
    ) -> Result<Vec<(String, i64, bool, Option<f64>)>, StoreError> {
        let rows = sqlx::query(
            "SELECT pool, at_ms, success, latency_ms FROM pool_samples WHERE at_ms >= ?1
             ORDER BY at_ms, id",
        )
        .bind(since_ms)
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let success: i64 = r.get("success");
                (
                    r.get("pool"),
                    r.get("at_ms"),
                    success != 0,
                    r.get("latency_ms"),
                )
            })
            .collect())
    }

    pub async fn delete_samples_before(&self, before_ms: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM pool_samples WHERE at_ms < ?1")
            .bind(before_ms)
            .execute(self.sqlite_pool())
            .await?;
        Ok(())
    }

    /// Placed or placing sandboxes, for affinity and spread: (labels_json, placement_json).
    pub async fn live_placements(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT labels_json, placement_json FROM sandboxes
             WHERE state IN ('running', 'paused', 'stopped') AND placement_json IS NOT NULL",
        )
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("labels_json"), r.get("placement_json")))
            .collect())
    }

    /// Live sandboxes (placed and not yet deleted) per pool: what occupies each pool's
    /// capacity now.
    pub async fn live_counts_by_pool(&self) -> Result<HashMap<String, u64>, StoreError> {
        let rows = sqlx::query(
            "SELECT json_extract(placement_json, '$.pool') AS pool, COUNT(*) AS n FROM sandboxes
             WHERE state IN ('running', 'paused', 'stopped') AND placement_json IS NOT NULL
             GROUP BY pool",
        )
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let pool: Option<String> = r.get("pool");
                let n: i64 = r.get("n");
                pool.map(|p| (p, n.max(0) as u64))
            })
            .collect())
    }

    /// Tracks an attempt whose instance may exist or appear later, against its own account.
    pub async fn record_abandoned(
        &self,
        a: &AbandonedRow,
        reason: &str,
        now_ms: i64,
        watch_until_ms: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO abandoned_instances (attempt_id, sandbox_id, pool, account, reason,
               recorded_ms, watch_until_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (attempt_id) DO UPDATE SET watch_until_ms = MAX(watch_until_ms, excluded.watch_until_ms)",
        )
        .bind(&a.attempt_id)
        .bind(&a.sandbox_id)
        .bind(&a.pool)
        .bind(&a.account)
        .bind(reason)
        .bind(now_ms)
        .bind(watch_until_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    /// Abandoned attempts still watched at `now_ms`.
    pub async fn watched_abandoned(&self, now_ms: i64) -> Result<Vec<AbandonedRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT attempt_id, sandbox_id, pool, account FROM abandoned_instances
             WHERE watch_until_ms > ?1 ORDER BY recorded_ms",
        )
        .bind(now_ms)
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| AbandonedRow {
                attempt_id: r.get("attempt_id"),
                sandbox_id: r.get("sandbox_id"),
                pool: r.get("pool"),
                account: r.get("account"),
            })
            .collect())
    }

    pub async fn count_abandoned_deleted(
        &self,
        attempt_id: &str,
        n: u64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE abandoned_instances SET deleted_instances = deleted_instances + ?2 WHERE attempt_id = ?1",
        )
        .bind(attempt_id)
        .bind(n as i64)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    /// Takes over in-flight creates whose lease expired (their coordinator died); returns their
    /// ids. The conditional update makes the claim exclusive among replicas.
    pub async fn claim_expired_creates(
        &self,
        owner: &str,
        now_ms: i64,
        lease_expires_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "UPDATE sandboxes SET lease_owner = ?1, lease_expires_ms = ?3
             WHERE state IN ('pending', 'provisioning', 'reconciling') AND lease_expires_ms <= ?2
             RETURNING id",
        )
        .bind(owner)
        .bind(now_ms)
        .bind(lease_expires_ms)
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows.into_iter().map(|r| r.get("id")).collect())
    }

    /// Extends every lease this coordinator holds on in-flight creates.
    pub async fn renew_leases(&self, owner: &str, lease_expires_ms: i64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE sandboxes SET lease_expires_ms = ?2
             WHERE lease_owner = ?1 AND state IN ('pending', 'provisioning', 'reconciling')",
        )
        .bind(owner)
        .bind(lease_expires_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    /// Gives up this coordinator's lease on a create so that it is resumed (by the janitor
    /// of any coordinator) from `retry_at_ms` on.
    pub async fn release_lease(&self, id: &str, retry_at_ms: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE sandboxes SET lease_owner = NULL, lease_expires_ms = ?2 WHERE id = ?1")
            .bind(id)
            .bind(retry_at_ms)
            .execute(self.sqlite_pool())
            .await?;
        Ok(())
    }

    /// Running sandboxes, whose egress identities must be registered again after a restart.
    pub async fn running_sandboxes(&self) -> Result<Vec<SandboxRow>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE state IN ('running', 'paused', 'stopped')"
        )))
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows.iter().map(sandbox_row).collect())
    }

    pub async fn purge_idempotency_keys(&self, now_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_ms <= ?1")
            .bind(now_ms)
            .execute(self.sqlite_pool())
            .await?;
        Ok(done.rows_affected())
    }
}
