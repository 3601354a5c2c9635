//! Delegated capability records (see `api::delegations`).

use sqlx::Row;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DelegationRow {
    pub id: String,
    #[serde(skip)]
    pub token_hash: String,
    pub sandbox_id: String,
    pub workspace: String,
    pub delegator: String,
    pub agent: String,
    pub actions: Vec<String>,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub revoked_ms: Option<i64>,
}

const COLUMNS: &str = "id, token_hash, sandbox_id, workspace, delegator, agent, actions_json, created_ms, expires_ms, revoked_ms";

fn from_row(r: sqlx::sqlite::SqliteRow) -> DelegationRow {
    let actions: String = r.get("actions_json");
    DelegationRow {
        id: r.get("id"),
        token_hash: r.get("token_hash"),
        sandbox_id: r.get("sandbox_id"),
        workspace: r.get("workspace"),
        delegator: r.get("delegator"),
        agent: r.get("agent"),
        actions: serde_json::from_str(&actions).unwrap_or_default(),
        created_ms: r.get("created_ms"),
        expires_ms: r.get("expires_ms"),
        revoked_ms: r.get("revoked_ms"),
    }
}

impl Store {
    pub async fn insert_delegation(&self, row: &DelegationRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO delegations (id, token_hash, sandbox_id, workspace, delegator, agent,
               actions_json, created_ms, expires_ms, revoked_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL)",
        )
        .bind(&row.id)
        .bind(&row.token_hash)
        .bind(&row.sandbox_id)
        .bind(&row.workspace)
        .bind(&row.delegator)
        .bind(&row.agent)
        .bind(serde_json::to_string(&row.actions).unwrap_or_else(|_| "[]".into()))
        .bind(row.created_ms)
        .bind(row.expires_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    pub async fn delegation_by_token_hash(
        &self,
        hash: &str,
    ) -> Result<Option<DelegationRow>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM delegations WHERE token_hash = ?1"
        )))
        .bind(hash)
        .fetch_optional(self.sqlite_pool())
        .await?;
        Ok(row.map(from_row))
    }

    pub async fn get_delegation(&self, id: &str) -> Result<Option<DelegationRow>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM delegations WHERE id = ?1"
        )))
        .bind(id)
        .fetch_optional(self.sqlite_pool())
        .await?;
        Ok(row.map(from_row))
    }

    pub async fn list_delegations(
        &self,
        sandbox_id: &str,
    ) -> Result<Vec<DelegationRow>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM delegations WHERE sandbox_id = ?1 ORDER BY created_ms, id"
        )))
        .bind(sandbox_id)
        .fetch_all(self.sqlite_pool())
        .await?;
        Ok(rows.into_iter().map(from_row).collect())
    }

    /// Marks a delegation revoked; `false` when it did not exist or was already revoked.
    pub async fn revoke_delegation(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE delegations SET revoked_ms = ?2 WHERE id = ?1 AND revoked_ms IS NULL",
        )
        .bind(id)
        .bind(now_ms)
        .execute(self.sqlite_pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }
}
