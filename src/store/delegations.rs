//! Delegated capability records (see `api::delegations`).

use super::{Store, StoreError, StoreRow};

/// A delegated capability as the API shows it (never its token, only its hash is kept).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[schema(as = DelegationView)]
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

fn from_row(r: &impl StoreRow) -> Result<DelegationRow, sqlx::Error> {
    let actions: String = r.col("actions_json")?;
    Ok(DelegationRow {
        id: r.col("id")?,
        token_hash: r.col("token_hash")?,
        sandbox_id: r.col("sandbox_id")?,
        workspace: r.col("workspace")?,
        delegator: r.col("delegator")?,
        agent: r.col("agent")?,
        // Written by `insert_delegation` from a list of strings; anything else reads as no
        // actions (the delegation then allows nothing).
        actions: serde_json::from_str(&actions).unwrap_or_default(),
        created_ms: r.col("created_ms")?,
        expires_ms: r.col("expires_ms")?,
        revoked_ms: r.col("revoked_ms")?,
    })
}

impl Store {
    /// Records a delegation (not revoked). Its id and token hash are unique: a duplicate is
    /// an error.
    pub async fn insert_delegation(&self, row: &DelegationRow) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO delegations (id, token_hash, sandbox_id, workspace,
               delegator, agent, actions_json, created_ms, expires_ms, revoked_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL)";
        let actions = serde_json::to_string(&row.actions).unwrap_or_else(|_| "[]".into());
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(&row.id)
            .bind(&row.token_hash)
            .bind(&row.sandbox_id)
            .bind(&row.workspace)
            .bind(&row.delegator)
            .bind(&row.agent)
            .bind(&actions)
            .bind(row.created_ms)
            .bind(row.expires_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    pub async fn delegation_by_token_hash(
        &self,
        hash: &str,
    ) -> Result<Option<DelegationRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM delegations WHERE token_hash = $1");
        self.one_delegation(sql, hash).await
    }

    pub async fn get_delegation(&self, id: &str) -> Result<Option<DelegationRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM delegations WHERE id = $1");
        self.one_delegation(sql, id).await
    }

    async fn one_delegation(
        &self,
        sql: String,
        arg: &str,
    ) -> Result<Option<DelegationRow>, StoreError> {
        Ok(
            with_pool!(self, pool => match sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(arg)
                .fetch_optional(pool)
                .await?
            {
                Some(r) => Some(from_row(&r)?),
                None => None,
            }),
        )
    }

    /// A sandbox's delegations, oldest first.
    pub async fn list_delegations(
        &self,
        sandbox_id: &str,
    ) -> Result<Vec<DelegationRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM delegations WHERE sandbox_id = $1 ORDER BY created_ms, id"
        );
        Ok(
            with_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(sandbox_id)
            .fetch_all(pool)
            .await?
            .iter()
            .map(from_row)
            .collect::<Result<_, _>>()?),
        )
    }

    /// Marks a delegation revoked; `false` when it did not exist or was already revoked.
    pub async fn revoke_delegation(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        const SQL: &str =
            "UPDATE delegations SET revoked_ms = $2 WHERE id = $1 AND revoked_ms IS NULL";
        let affected = with_pool!(self, pool => sqlx::query(SQL)
            .bind(id)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(affected > 0)
    }
}
