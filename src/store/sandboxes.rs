//! Sandbox creation state: sandboxes, attempts, idempotency keys, per-pool samples, abandoned
//! instances and coordinator leases. Every statement lives here; the coordinator and the API
//! only call these methods, so a Postgres implementation can follow behind the same surface.

use std::collections::HashMap;

use super::{Dialect, Store, StoreError, StoreRow};

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
    /// When the sandbox's lifetime ends (the janitor deletes it then); `None`: no lifetime.
    pub expires_ms: Option<i64>,
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
    /// Each retry on the attempt's pool and why: a JSON array of `{at_ms, error_class,
    /// message, wait_ms}` (see `Store::set_attempt_retries`); `None` without retries.
    pub retries_json: Option<String>,
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
    /// The walk's hold on the lease (see [`Fence`]).
    pub fence: &'a Fence,
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

const SANDBOX_COLUMNS: &str = "id, workspace, principal_json, state, request_json, labels_json, candidates_json, placement_json, placement_record_json, error_json, token_sealed, created_ms, updated_ms, expires_ms";
const ATTEMPT_COLUMNS: &str = "id, sandbox_id, seq, pool, provider, account, state, outcome, error_class, message, instance_id, started_ms, finished_ms, retries_json";

fn sandbox_row(r: &impl StoreRow) -> Result<SandboxRow, sqlx::Error> {
    Ok(SandboxRow {
        id: r.col("id")?,
        workspace: r.col("workspace")?,
        principal_json: r.col("principal_json")?,
        state: r.col("state")?,
        request_json: r.col("request_json")?,
        labels_json: r.col("labels_json")?,
        candidates_json: r.col("candidates_json")?,
        placement_json: r.col("placement_json")?,
        placement_record_json: r.col("placement_record_json")?,
        error_json: r.col("error_json")?,
        token_sealed: r.col("token_sealed")?,
        created_ms: r.col("created_ms")?,
        updated_ms: r.col("updated_ms")?,
        expires_ms: r.col("expires_ms")?,
    })
}

fn attempt_row(r: &impl StoreRow) -> Result<AttemptRow, sqlx::Error> {
    Ok(AttemptRow {
        id: r.col("id")?,
        sandbox_id: r.col("sandbox_id")?,
        seq: r.col("seq")?,
        pool: r.col("pool")?,
        provider: r.col("provider")?,
        account: r.col("account")?,
        state: r.col("state")?,
        outcome: r.col("outcome")?,
        error_class: r.col("error_class")?,
        message: r.col("message")?,
        instance_id: r.col("instance_id")?,
        started_ms: r.col("started_ms")?,
        finished_ms: r.col("finished_ms")?,
        retries_json: r.col("retries_json")?,
    })
}

fn abandoned_row(r: &impl StoreRow) -> Result<AbandonedRow, sqlx::Error> {
    Ok(AbandonedRow {
        attempt_id: r.col("attempt_id")?,
        sandbox_id: r.col("sandbox_id")?,
        pool: r.col("pool")?,
        account: r.col("account")?,
    })
}

/// `list_sandboxes`' statement: the conditions `f` sets, each with the next placeholder
/// number, and their arguments in that order (the limit follows them).
fn list_query(f: &ListFilter, dialect: Dialect) -> (String, Vec<String>) {
    let mut sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes s WHERE 1 = 1");
    let mut args: Vec<String> = Vec::new();
    let next = |args: &mut Vec<String>, value: &str| {
        args.push(value.to_string());
        format!("${}", args.len())
    };
    if let Some(workspace) = &f.workspace {
        let p = next(&mut args, workspace);
        sql.push_str(&format!(" AND workspace = {p}"));
    }
    if let Some(state) = &f.state {
        let p = next(&mut args, state);
        sql.push_str(&format!(" AND state = {p}"));
    }
    if let Some((key, value)) = &f.label {
        let k = next(&mut args, key);
        let v = next(&mut args, value);
        // Labels are a JSON object of strings.
        sql.push_str(&match dialect {
            Dialect::Sqlite => format!(
                " AND EXISTS (SELECT 1 FROM json_each(s.labels_json) j WHERE j.key = {k} AND j.value = {v})"
            ),
            Dialect::Postgres => format!(" AND (s.labels_json::jsonb ->> {k}) = {v}"),
        });
    }
    if let Some(after) = &f.after {
        let p = next(&mut args, after);
        sql.push_str(&format!(
            " AND (created_ms, id) > (SELECT created_ms, id FROM sandboxes WHERE id = {p})"
        ));
    }
    // The limit is bound too (as the last argument), so the statement texts, which each
    // connection prepares and caches, are one per combination of conditions.
    sql.push_str(&format!(
        " ORDER BY created_ms, id LIMIT ${}",
        args.len() + 1
    ));
    (sql, args)
}

/// A create's lease as its walk holds it: the owning coordinator and the epoch of its
/// claim. Every write the walk makes carries it and matches no row once another coordinator
/// has taken the create over (the epoch went up), which the store reports as
/// [`StoreError::Fenced`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub owner: String,
    pub epoch: i64,
}

/// `Ok` when a fenced write touched its row, else [`StoreError::Fenced`].
fn fenced(affected: u64, id: &str) -> Result<(), StoreError> {
    match affected {
        0 => Err(StoreError::Fenced {
            sandbox_id: id.to_string(),
        }),
        _ => Ok(()),
    }
}

impl Store {
    /// A condition that holds while the sandbox `sandbox` (a parameter or a column) is
    /// leased to the owner and epoch bound as parameters `$first` and `$first+1`. On
    /// Postgres it share-locks the sandbox row, so a takeover waits for this write's
    /// transaction and this write, after a takeover's commit, re-checks against it.
    fn fence_sql(&self, sandbox: &str, first: u8) -> String {
        let lock = match self.dialect() {
            Dialect::Postgres => " FOR SHARE",
            Dialect::Sqlite => "",
        };
        format!(
            "EXISTS (SELECT 1 FROM sandboxes f WHERE f.id = {sandbox} AND f.lease_owner = ${first} AND f.lease_epoch = ${second}{lock})",
            second = first + 1
        )
    }

    /// The unexpired holder of an idempotency key: `(body_hash, sandbox_id)`.
    pub async fn find_idempotency_key(
        &self,
        workspace: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<(String, String)>, StoreError> {
        const SQL: &str = "SELECT body_hash, sandbox_id FROM idempotency_keys
             WHERE workspace = $1 AND key = $2 AND expires_ms > $3";
        Ok(with_pool!(self, pool => match sqlx::query(SQL)
            .bind(workspace)
            .bind(key)
            .bind(now_ms)
            .fetch_optional(pool)
            .await?
        {
            Some(r) => Some((r.col("body_hash")?, r.col("sandbox_id")?)),
            None => None,
        }))
    }

    /// Inserts a new sandbox and, atomically with it, claims its idempotency key. When the key
    /// is already held (a concurrent or earlier identical request), nothing is inserted and the
    /// holder is returned. A key whose hold expired (`expires_ms <= now_ms`) is taken over.
    ///
    /// Exactly one of any number of concurrent inserts with the same key wins, on either
    /// backend: SQLite serialises writers (the first statement takes the write lock); on
    /// Postgres the key's `ON CONFLICT` upsert waits for a concurrent claimant's transaction
    /// to end and then re-checks its condition against the committed row, and the holder is
    /// read by a later statement, which (at READ COMMITTED, which every store connection
    /// uses: see `Store::open_postgres`) sees that commit.
    pub async fn insert_sandbox(
        &self,
        row: &SandboxRow,
        lease_owner: &str,
        lease_expires_ms: i64,
        claim: Option<IdempotencyClaim<'_>>,
        now_ms: i64,
    ) -> Result<InsertOutcome, StoreError> {
        const INSERT: &str = "INSERT INTO sandboxes (id, workspace, principal_json, state,
               request_json, labels_json, candidates_json, placement_json, error_json,
               token_sealed, lease_owner, lease_expires_ms, created_ms, updated_ms,
               placement_record_json, expires_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15)";
        const CLAIM: &str =
            "INSERT INTO idempotency_keys (workspace, key, body_hash, sandbox_id, expires_ms)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (workspace, key) DO UPDATE SET body_hash = excluded.body_hash,
               sandbox_id = excluded.sandbox_id, expires_ms = excluded.expires_ms
             WHERE idempotency_keys.expires_ms <= $6";
        const HOLDER: &str =
            "SELECT body_hash, sandbox_id FROM idempotency_keys WHERE workspace = $1 AND key = $2";
        with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            // The first statement writes, so a SQLite transaction takes the write lock at
            // once (no read-to-write upgrade that SQLite would refuse under contention).
            sqlx::query(INSERT)
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
                .bind(row.expires_ms)
                .execute(&mut *tx)
                .await?;
            if let Some(claim) = claim {
                sqlx::query(CLAIM)
                    .bind(&row.workspace)
                    .bind(claim.key)
                    .bind(claim.body_hash)
                    .bind(&row.id)
                    .bind(claim.expires_ms)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await?;
                let holder = sqlx::query(HOLDER)
                    .bind(&row.workspace)
                    .bind(claim.key)
                    .fetch_one(&mut *tx)
                    .await?;
                let sandbox_id: String = holder.col("sandbox_id")?;
                if sandbox_id != row.id {
                    let body_hash: String = holder.col("body_hash")?;
                    tx.rollback().await?;
                    return Ok(InsertOutcome::Existing {
                        sandbox_id,
                        body_hash,
                    });
                }
            }
            tx.commit().await?;
        });
        Ok(InsertOutcome::Created)
    }

    /// Sandboxes whose lifetime has ended by `now_ms` and that are not deleted yet, oldest
    /// expiry first (at most `limit`).
    pub async fn expired_sandboxes(
        &self,
        now_ms: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        const SQL: &str = "SELECT id FROM sandboxes
             WHERE expires_ms IS NOT NULL AND expires_ms <= $1 AND state <> 'deleted'
             ORDER BY expires_ms LIMIT $2";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .bind(now_ms)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| r.col("id"))
            .collect::<Result<_, _>>()?))
    }

    /// Sets when a sandbox's lifetime ends; false when there is no such sandbox that is not
    /// deleted.
    pub async fn set_sandbox_expiry(
        &self,
        id: &str,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        const SQL: &str = "UPDATE sandboxes SET expires_ms = $2, updated_ms = $3
             WHERE id = $1 AND state <> 'deleted'";
        let changed = with_pool!(self, pool => sqlx::query(SQL)
            .bind(id)
            .bind(expires_ms)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(changed > 0)
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1");
        Ok(
            with_pool!(self, pool => match sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .fetch_optional(pool)
                .await?
            {
                Some(r) => Some(sandbox_row(&r)?),
                None => None,
            }),
        )
    }

    /// Sandboxes ordered by creation, filtered, one page of at most `limit` at a time.
    pub async fn list_sandboxes(&self, f: &ListFilter) -> Result<Vec<SandboxRow>, StoreError> {
        // Only the conditions set are in the statement (and only their arguments bound):
        // Postgres refuses arguments a statement does not use.
        let (sql, args) = list_query(f, self.dialect());
        Ok(with_pool!(self, pool => {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for arg in args {
                query = query.bind(arg);
            }
            query
                .bind(i64::from(f.limit))
                .fetch_all(pool)
                .await?
                .iter()
                .map(sandbox_row)
                .collect::<Result<_, _>>()?
        }))
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
        self.transition_sandbox_if(id, from, to, placement_json, error_json, now_ms, None)
            .await
    }

    /// The one state-change statement, with the lease condition when `fence` is given.
    #[allow(clippy::too_many_arguments)]
    async fn transition_sandbox_if(
        &self,
        id: &str,
        from: &[&str],
        to: &str,
        placement_json: Option<&str>,
        error_json: Option<&str>,
        now_ms: i64,
        fence: Option<&Fence>,
    ) -> Result<bool, StoreError> {
        // `from` travels as one JSON array argument, expanded by each dialect's JSON function.
        let from_list = serde_json::to_string(from).unwrap_or_else(|_| "[]".into());
        let states = match self.dialect() {
            Dialect::Sqlite => "SELECT value FROM json_each($6)",
            Dialect::Postgres => "SELECT json_array_elements_text($6::json)",
        };
        // The row's own lease columns (an UPDATE re-checks them against a concurrent
        // takeover's commit on Postgres).
        let lease = match fence {
            Some(_) => " AND lease_owner = $7 AND lease_epoch = $8",
            None => "",
        };
        let sql = format!(
            "UPDATE sandboxes SET state = $2,
               placement_json = COALESCE($3, placement_json),
               error_json = COALESCE($4, error_json), updated_ms = $5
             WHERE id = $1 AND state IN ({states}){lease}"
        );
        let (owner, epoch) = fence.map_or((None, None), |f| (Some(&f.owner), Some(f.epoch)));
        // Between in-flight states no identity appears or goes: nothing for the followers.
        // Otherwise the change row commits with the state, in one transaction.
        let in_flight = |state: &str| matches!(state, "pending" | "provisioning" | "reconciling");
        let announce = !(in_flight(to) && from.iter().all(|f| in_flight(f)));
        let affected = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let query = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(id)
                .bind(to)
                .bind(placement_json)
                .bind(error_json)
                .bind(now_ms)
                .bind(&from_list);
            let query = match fence {
                Some(_) => query.bind(owner).bind(epoch),
                None => query,
            };
            let affected = query.execute(&mut *tx).await?.rows_affected();
            if affected > 0 && announce {
                sqlx::query(super::changes::RECORD)
                    .bind(super::changes::SANDBOX)
                    .bind(id)
                    .bind(&*self.origin)
                    .bind(crate::base::clock::now_ms())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            affected
        });
        Ok(affected > 0)
    }

    /// [`Store::transition_sandbox`] for a create's walk: only while `fence` holds the
    /// lease. `Ok(false)` when the state was not one of `from` (e.g. deleted meanwhile);
    /// [`StoreError::Fenced`] when the lease is another's.
    #[allow(clippy::too_many_arguments)]
    pub async fn transition_fenced(
        &self,
        id: &str,
        from: &[&str],
        to: &str,
        placement_json: Option<&str>,
        error_json: Option<&str>,
        now_ms: i64,
        fence: &Fence,
    ) -> Result<bool, StoreError> {
        let moved = self
            .transition_sandbox_if(
                id,
                from,
                to,
                placement_json,
                error_json,
                now_ms,
                Some(fence),
            )
            .await?;
        // No row moved: a state outside `from`, or a lease lost. Only the first is an answer;
        // the walk must not act on "deleted meanwhile" for a create it no longer owns.
        if !moved && self.lease_fence(id).await?.as_ref() != Some(fence) {
            return Err(StoreError::Fenced {
                sandbox_id: id.to_string(),
            });
        }
        Ok(moved)
    }

    /// Records an attempt as given (its end included, if any), while `fence` holds the
    /// sandbox's lease.
    pub async fn insert_attempt(&self, a: &AttemptRow, fence: &Fence) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO attempts (id, sandbox_id, seq, pool, provider, account,
               state, outcome, error_class, message, instance_id, started_ms, finished_ms)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13
             WHERE {}",
            self.fence_sql("$2", 14)
        );
        let inserted = with_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
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
            .bind(&fence.owner)
            .bind(fence.epoch)
            .execute(pool)
            .await?
            .rows_affected());
        fenced(inserted, &a.sandbox_id)
    }

    /// Records a new attempt and moves the sandbox from `pending` to `provisioning`, in one
    /// transaction, while `fence` holds the sandbox's lease.
    pub async fn start_attempt(
        &self,
        a: &AttemptRow,
        now_ms: i64,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let insert = format!(
            "INSERT INTO attempts (id, sandbox_id, seq, pool, provider, account,
               state, outcome, error_class, message, instance_id, started_ms, finished_ms)
             SELECT $1, $2, $3, $4, $5, $6, $7, NULL, NULL, NULL, NULL, $8, NULL
             WHERE {}",
            self.fence_sql("$2", 9)
        );
        const PROVISIONING: &str = "UPDATE sandboxes SET state = 'provisioning', updated_ms = $2
             WHERE id = $1 AND state = 'pending'";
        let inserted = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let inserted = sqlx::query(sqlx::AssertSqlSafe(insert))
                .bind(&a.id)
                .bind(&a.sandbox_id)
                .bind(a.seq)
                .bind(&a.pool)
                .bind(&a.provider)
                .bind(&a.account)
                .bind(&a.state)
                .bind(a.started_ms)
                .bind(&fence.owner)
                .bind(fence.epoch)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if inserted == 0 {
                tx.rollback().await?;
            } else {
                sqlx::query(PROVISIONING)
                    .bind(&a.sandbox_id)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            inserted
        });
        fenced(inserted, &a.sandbox_id)
    }

    /// Ends a successful attempt, records its sample and places the sandbox, in one
    /// transaction. Returns false (placement not recorded) when the sandbox is no longer in
    /// flight, e.g. it was deleted meanwhile.
    pub async fn succeed_and_place(&self, s: &Success<'_>) -> Result<bool, StoreError> {
        let Success {
            attempt_id,
            sandbox_id,
            instance_id,
            pool: sample_pool,
            latency_ms,
            placement_json,
            now_ms,
            fence,
        } = *s;
        let succeed = format!(
            "UPDATE attempts SET state = 'succeeded', outcome = 'success',
               error_class = NULL, message = NULL, instance_id = $2, finished_ms = $3
             WHERE id = $1 AND {}",
            self.fence_sql("attempts.sandbox_id", 4)
        );
        const SAMPLE: &str =
            "INSERT INTO pool_samples (pool, at_ms, success, latency_ms) VALUES ($1, $2, 1, $3)";
        const PLACE: &str = "UPDATE sandboxes SET state = 'running', placement_json = $2,
               updated_ms = $3
             WHERE id = $1 AND state IN ('pending', 'provisioning', 'reconciling')
               AND lease_owner = $4 AND lease_epoch = $5";
        let placed = with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let succeeded = sqlx::query(sqlx::AssertSqlSafe(succeed))
                .bind(attempt_id)
                .bind(instance_id)
                .bind(now_ms)
                .bind(&fence.owner)
                .bind(fence.epoch)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if succeeded == 0 {
                tx.rollback().await?;
                return Err(StoreError::Fenced { sandbox_id: sandbox_id.to_string() });
            }
            sqlx::query(SAMPLE)
                .bind(sample_pool)
                .bind(now_ms)
                .bind(latency_ms)
                .execute(&mut *tx)
                .await?;
            let placed = sqlx::query(PLACE)
                .bind(sandbox_id)
                .bind(placement_json)
                .bind(now_ms)
                .bind(&fence.owner)
                .bind(fence.epoch)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                > 0;
            if placed {
                // The followers' change row commits with the placement.
                sqlx::query(super::changes::RECORD)
                    .bind(super::changes::SANDBOX)
                    .bind(sandbox_id)
                    .bind(&*self.origin)
                    .bind(crate::base::clock::now_ms())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            placed
        });
        Ok(placed)
    }

    /// Sets an attempt's state while `fence` holds its sandbox's lease.
    pub async fn set_attempt_state(
        &self,
        id: &str,
        state: &str,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        self.set_attempt_text("state", id, state, fence).await
    }

    /// Records an attempt's retries so far (a JSON array, replaced whole) while `fence` holds
    /// its sandbox's lease.
    pub async fn set_attempt_retries(
        &self,
        id: &str,
        retries_json: &str,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        self.set_attempt_text("retries_json", id, retries_json, fence)
            .await
    }

    /// Sets one text column of an attempt while `fence` holds its sandbox's lease. `column`
    /// is one of this file's constants, never caller input.
    async fn set_attempt_text(
        &self,
        column: &'static str,
        id: &str,
        value: &str,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "UPDATE attempts SET {column} = $2 WHERE id = $1 AND {}",
            self.fence_sql("attempts.sandbox_id", 3)
        );
        let updated = with_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(value)
            .bind(&fence.owner)
            .bind(fence.epoch)
            .execute(pool)
            .await?
            .rows_affected());
        fenced(updated, id)
    }

    /// Ends an attempt while `fence` holds its sandbox's lease; an instance id already
    /// recorded is kept when `end` has none.
    pub async fn finish_attempt(
        &self,
        id: &str,
        end: &AttemptEnd<'_>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "UPDATE attempts SET state = $2, outcome = $3, error_class = $4,
               message = $5, instance_id = COALESCE($6, instance_id), finished_ms = $7
             WHERE id = $1 AND {}",
            self.fence_sql("attempts.sandbox_id", 8)
        );
        let updated = with_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(end.state)
            .bind(end.outcome)
            .bind(end.error_class)
            .bind(end.message)
            .bind(end.instance_id)
            .bind(end.finished_ms)
            .bind(&fence.owner)
            .bind(fence.epoch)
            .execute(pool)
            .await?
            .rows_affected());
        fenced(updated, id)
    }

    /// A sandbox's attempts in order.
    pub async fn list_attempts(&self, sandbox_id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let sql =
            format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE sandbox_id = $1 ORDER BY seq");
        Ok(
            with_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(sandbox_id)
            .fetch_all(pool)
            .await?
            .iter()
            .map(attempt_row)
            .collect::<Result<_, _>>()?),
        )
    }

    /// One creation attempt's result on a pool, for the router's ranking.
    pub async fn record_sample(
        &self,
        pool: &str,
        at_ms: i64,
        success: bool,
        latency_ms: Option<f64>,
    ) -> Result<(), StoreError> {
        const SQL: &str =
            "INSERT INTO pool_samples (pool, at_ms, success, latency_ms) VALUES ($1, $2, $3, $4)";
        let sample_pool = pool;
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(sample_pool)
            .bind(at_ms)
            .bind(success as i64)
            .bind(latency_ms)
            .execute(pool)
            .await?
            .rows_affected());
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
        // Postgres sums a BIGINT into a NUMERIC; the cast keeps both backends' answer an
        // integer.
        const COUNTS: &str = "SELECT pool, COUNT(*) AS attempts,
               CAST(SUM(success) AS BIGINT) AS successes
             FROM pool_samples WHERE at_ms >= $1 GROUP BY pool";
        // Postgres (before 16) wants the subquery named.
        const LATENCIES: &str = "SELECT pool, latency_ms FROM (
               SELECT pool, latency_ms,
                 ROW_NUMBER() OVER (PARTITION BY pool ORDER BY at_ms DESC, id DESC) AS rn
               FROM pool_samples
               WHERE at_ms >= $1 AND success = 1 AND latency_ms IS NOT NULL) AS newest
             WHERE rn <= $2";
        let max_latencies = i64::try_from(max_latencies).unwrap_or(i64::MAX);
        let mut out: HashMap<String, PoolSamples> = HashMap::new();
        with_pool!(self, pool => {
            for r in sqlx::query(COUNTS).bind(since_ms).fetch_all(pool).await? {
                let attempts: i64 = r.col("attempts")?;
                let successes: i64 = r.col("successes")?;
                out.insert(
                    r.col("pool")?,
                    PoolSamples {
                        latencies_ms: Vec::new(),
                        attempts: attempts.max(0) as u64,
                        successes: successes.max(0) as u64,
                    },
                );
            }
            for r in sqlx::query(LATENCIES)
                .bind(since_ms)
                .bind(max_latencies)
                .fetch_all(pool)
                .await?
            {
                let name: String = r.col("pool")?;
                let latency: f64 = r.col("latency_ms")?;
                out.entry(name).or_default().latencies_ms.push(latency);
            }
        });
        Ok(out)
    }

    /// Raw samples since `since_ms`, oldest first: (pool, at_ms, success, latency_ms). Read
    /// once at start-up to seed the coordinator's in-memory window.
    pub async fn samples_since(
        &self,
        since_ms: i64,
    ) -> Result<Vec<(String, i64, bool, Option<f64>)>, StoreError> {
        const SQL: &str = "SELECT pool, at_ms, success, latency_ms FROM pool_samples
             WHERE at_ms >= $1 ORDER BY at_ms, id";
        let mut out = Vec::new();
        with_pool!(self, pool => {
            for r in sqlx::query(SQL).bind(since_ms).fetch_all(pool).await? {
                let success: i64 = r.col("success")?;
                out.push((
                    r.col("pool")?,
                    r.col("at_ms")?,
                    success != 0,
                    r.col("latency_ms")?,
                ));
            }
        });
        Ok(out)
    }

    pub async fn delete_samples_before(&self, before_ms: i64) -> Result<(), StoreError> {
        const SQL: &str = "DELETE FROM pool_samples WHERE at_ms < $1";
        with_pool!(self, pool => sqlx::query(SQL).bind(before_ms).execute(pool).await?.rows_affected());
        Ok(())
    }

    /// Placed or placing sandboxes, for affinity and spread: (labels_json, placement_json).
    pub async fn live_placements(&self) -> Result<Vec<(String, String)>, StoreError> {
        const SQL: &str = "SELECT labels_json, placement_json FROM sandboxes
             WHERE state IN ('running', 'paused', 'stopped') AND placement_json IS NOT NULL";
        let mut out = Vec::new();
        with_pool!(self, pool => {
            for r in sqlx::query(SQL).fetch_all(pool).await? {
                out.push((r.col("labels_json")?, r.col("placement_json")?));
            }
        });
        Ok(out)
    }

    /// Live sandboxes (placed and not yet deleted) per pool: what occupies each pool's
    /// capacity now.
    pub async fn live_counts_by_pool(&self) -> Result<HashMap<String, u64>, StoreError> {
        let sql = match self.dialect() {
            Dialect::Sqlite => {
                "SELECT json_extract(placement_json, '$.pool') AS pool, COUNT(*) AS n
                 FROM sandboxes
                 WHERE state IN ('running', 'paused', 'stopped') AND placement_json IS NOT NULL
                 GROUP BY 1"
            }
            Dialect::Postgres => {
                "SELECT placement_json::jsonb ->> 'pool' AS pool, COUNT(*) AS n
                 FROM sandboxes
                 WHERE state IN ('running', 'paused', 'stopped') AND placement_json IS NOT NULL
                 GROUP BY 1"
            }
        };
        let mut out = HashMap::new();
        with_pool!(self, pool => {
            for r in sqlx::query(sql).fetch_all(pool).await? {
                let name: Option<String> = r.col("pool")?;
                let n: i64 = r.col("n")?;
                if let Some(name) = name {
                    out.insert(name, n.max(0) as u64);
                }
            }
        });
        Ok(out)
    }

    /// Tracks an attempt whose instance may exist or appear later, against its own account.
    /// Recording the same attempt again only extends its watch (never shortens it).
    pub async fn record_abandoned(
        &self,
        a: &AbandonedRow,
        reason: &str,
        now_ms: i64,
        watch_until_ms: i64,
    ) -> Result<(), StoreError> {
        // A CASE rather than two-argument MAX (SQLite) or GREATEST (Postgres): one text.
        const SQL: &str = "INSERT INTO abandoned_instances (attempt_id, sandbox_id, pool, account,
               reason, recorded_ms, watch_until_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (attempt_id) DO UPDATE SET watch_until_ms =
               CASE WHEN excluded.watch_until_ms > abandoned_instances.watch_until_ms
                 THEN excluded.watch_until_ms ELSE abandoned_instances.watch_until_ms END";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(&a.attempt_id)
            .bind(&a.sandbox_id)
            .bind(&a.pool)
            .bind(&a.account)
            .bind(reason)
            .bind(now_ms)
            .bind(watch_until_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// Abandoned attempts still watched at `now_ms` whose next check is due (see
    /// [`Store::abandoned_checked`]), oldest first.
    pub async fn watched_abandoned(&self, now_ms: i64) -> Result<Vec<AbandonedRow>, StoreError> {
        const SQL: &str = "SELECT attempt_id, sandbox_id, pool, account FROM abandoned_instances
             WHERE watch_until_ms > $1 AND next_check_ms <= $1 ORDER BY recorded_ms, attempt_id";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .bind(now_ms)
            .fetch_all(pool)
            .await?
            .iter()
            .map(abandoned_row)
            .collect::<Result<_, _>>()?))
    }

    /// Counts one more check of an abandoned attempt at `now_ms` and puts its next one off:
    /// `base_ms` after the first check, doubling with each one after it, at most `max_ms`.
    /// Returns when the next check is due (`None`: not tracked).
    pub async fn abandoned_checked(
        &self,
        attempt_id: &str,
        now_ms: i64,
        base_ms: i64,
        max_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        const COUNT: &str = "UPDATE abandoned_instances SET checks = checks + 1
             WHERE attempt_id = $1 RETURNING checks";
        const NEXT: &str =
            "UPDATE abandoned_instances SET next_check_ms = $2 WHERE attempt_id = $1";
        let checks: Option<i64> = with_pool!(self, pool => match sqlx::query(COUNT)
            .bind(attempt_id)
            .fetch_optional(pool)
            .await?
        {
            Some(r) => Some(r.col::<i64>("checks")?),
            None => None,
        });
        let Some(checks) = checks else {
            return Ok(None);
        };
        let next = now_ms.saturating_add(backoff_ms(checks, base_ms, max_ms));
        with_pool!(self, pool => sqlx::query(NEXT)
            .bind(attempt_id)
            .bind(next)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(Some(next))
    }

    /// Counts `n` more instances of an abandoned attempt deleted by the janitor.
    pub async fn count_abandoned_deleted(
        &self,
        attempt_id: &str,
        n: u64,
    ) -> Result<(), StoreError> {
        const SQL: &str = "UPDATE abandoned_instances
             SET deleted_instances = deleted_instances + $2 WHERE attempt_id = $1";
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(attempt_id)
            .bind(n)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// How many instances of an abandoned attempt the janitor deleted (`None`: not tracked).
    pub async fn abandoned_deleted_count(
        &self,
        attempt_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        const SQL: &str = "SELECT deleted_instances FROM abandoned_instances WHERE attempt_id = $1";
        Ok(with_pool!(self, pool => match sqlx::query(SQL)
            .bind(attempt_id)
            .fetch_optional(pool)
            .await?
        {
            Some(r) => Some(r.col::<i64>("deleted_instances")?.max(0) as u64),
            None => None,
        }))
    }

    /// Takes over in-flight creates whose lease expired (their coordinator died); returns their
    /// ids. The conditional update makes the claim exclusive among replicas: on Postgres a
    /// concurrent claimant waits for the row and re-checks the expiry against the new lease.
    pub async fn claim_expired_creates(
        &self,
        owner: &str,
        now_ms: i64,
        lease_expires_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        // Each takeover is a new epoch: the previous owner's fenced writes stop matching.
        const SQL: &str = "UPDATE sandboxes SET lease_owner = $1, lease_expires_ms = $3,
               lease_epoch = lease_epoch + 1
             WHERE state IN ('pending', 'provisioning', 'reconciling') AND lease_expires_ms <= $2
             RETURNING id";
        let mut out = Vec::new();
        with_pool!(self, pool => {
            for r in sqlx::query(SQL)
                .bind(owner)
                .bind(now_ms)
                .bind(lease_expires_ms)
                .fetch_all(pool)
                .await?
            {
                out.push(r.col("id")?);
            }
        });
        Ok(out)
    }

    /// Extends every lease this coordinator holds on in-flight creates.
    pub async fn renew_leases(&self, owner: &str, lease_expires_ms: i64) -> Result<(), StoreError> {
        const SQL: &str = "UPDATE sandboxes SET lease_expires_ms = $2
             WHERE lease_owner = $1 AND state IN ('pending', 'provisioning', 'reconciling')";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(owner)
            .bind(lease_expires_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// Gives up this coordinator's lease on a create so that it is resumed (by the janitor
    /// of any coordinator) from `retry_at_ms` on. Only while `fence` still holds it: a
    /// coordinator that lost the lease must not release its successor's.
    pub async fn release_lease(
        &self,
        id: &str,
        retry_at_ms: i64,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        const SQL: &str = "UPDATE sandboxes SET lease_owner = NULL, lease_expires_ms = $2
             WHERE id = $1 AND lease_owner = $3 AND lease_epoch = $4";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(id)
            .bind(retry_at_ms)
            .bind(&fence.owner)
            .bind(fence.epoch)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// The lease on a sandbox as a fence: who holds it and in which epoch (`None` when the
    /// sandbox does not exist or nobody holds it).
    pub async fn lease_fence(&self, id: &str) -> Result<Option<Fence>, StoreError> {
        const SQL: &str = "SELECT lease_owner, lease_epoch FROM sandboxes WHERE id = $1";
        Ok(
            with_pool!(self, pool => match sqlx::query(SQL).bind(id).fetch_optional(pool).await? {
                Some(r) => r.col::<Option<String>>("lease_owner")?.map(|owner| Ok::<_, sqlx::Error>(Fence {
                    owner,
                    epoch: r.col("lease_epoch")?,
                })).transpose()?,
                None => None,
            }),
        )
    }

    /// The lease on a sandbox: `(owner, expires_ms)`; `None` when there is no such sandbox.
    pub async fn lease(&self, id: &str) -> Result<Option<(Option<String>, i64)>, StoreError> {
        const SQL: &str = "SELECT lease_owner, lease_expires_ms FROM sandboxes WHERE id = $1";
        Ok(
            with_pool!(self, pool => match sqlx::query(SQL).bind(id).fetch_optional(pool).await? {
                Some(r) => Some((r.col("lease_owner")?, r.col("lease_expires_ms")?)),
                None => None,
            }),
        )
    }

    /// Running sandboxes, whose egress identities must be registered again after a restart.
    pub async fn running_sandboxes(&self) -> Result<Vec<SandboxRow>, StoreError> {
        let sql = format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes
             WHERE state IN ('running', 'paused', 'stopped') ORDER BY created_ms, id"
        );
        Ok(
            with_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await?
            .iter()
            .map(sandbox_row)
            .collect::<Result<_, _>>()?),
        )
    }

    /// Deletes the idempotency keys whose hold expired; returns how many.
    pub async fn purge_idempotency_keys(&self, now_ms: i64) -> Result<u64, StoreError> {
        const SQL: &str = "DELETE FROM idempotency_keys WHERE expires_ms <= $1";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected()))
    }
}

/// The pause after the `checks`-th check (1-based): `base_ms`, doubling each time, at most
/// `max_ms`.
pub fn backoff_ms(checks: i64, base_ms: i64, max_ms: i64) -> i64 {
    let doublings = checks.saturating_sub(1).clamp(0, 40) as u32;
    base_ms
        .max(1)
        .saturating_mul(1i64 << doublings)
        .min(max_ms.max(1))
}
