//! Durable state. SQLite is the embedded default (one file, WAL); the schema lives in
//! `migrations/` and is applied at start-up. Callers use `Store`'s methods only, never SQL,
//! so a Postgres implementation can sit behind the same methods for replicas.

pub mod attempt_stats;
pub mod delegations;
pub mod replicas;
pub mod sandboxes;
pub mod snapshots;

use std::path::Path;
use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("database migration failed: {0}")]
    Migrate(String),
    #[error("database error: {0}")]
    Query(#[from] sqlx::Error),
}

/// How durable a committed write is before it is acknowledged (SQLite `synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Synced to disk at every commit: a power loss loses nothing acknowledged.
    Full,
    /// Synced at checkpoints (WAL): a power loss may drop the last commits.
    Normal,
}

#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
}

pub struct CredentialRow {
    pub workspace: String,
    pub name: String,
    pub meta_json: String,
    pub sealed: Vec<u8>,
    pub version: i64,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

impl Store {
    /// Opens (creating) the database with `synchronous=FULL`.
    pub async fn open_sqlite(path: &Path) -> Result<Store, StoreError> {
        Store::open_sqlite_with(path, Durability::Full).await
    }

    pub async fn open_sqlite_with(
        path: &Path,
        durability: Durability,
    ) -> Result<Store, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.display().to_string(),
            reason,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| open_err(e.to_string()))?;
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(|e| open_err(e.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                Durability::Full => SqliteSynchronous::Full,
                Durability::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(std::time::Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StoreError::Migrate(e.to_string()))?;
        Ok(Store { pool })
    }

    /// One round trip to the database (`GET /readyz`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub fn sqlite_pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub async fn list_credentials(&self) -> Result<Vec<CredentialRow>, StoreError> {
        let rows = sqlx::query("SELECT workspace, name, meta_json, sealed, version FROM credentials ORDER BY workspace, name")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| CredentialRow {
                workspace: r.get("workspace"),
                name: r.get("name"),
                meta_json: r.get("meta_json"),
                sealed: r.get("sealed"),
                version: r.get("version"),
            })
            .collect())
    }

    /// Inserts a new credential; `Ok(None)` when one of that name exists already (a race
    /// between two creates has exactly one winner). Returns the version.
    pub async fn insert_credential(
        &self,
        workspace: &str,
        name: &str,
        meta_json: &str,
        sealed: &[u8],
    ) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(
            "INSERT INTO credentials (workspace, name, meta_json, sealed) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (workspace, name) DO NOTHING
             RETURNING version",
        )
        .bind(workspace)
        .bind(name)
        .bind(meta_json)
        .bind(sealed)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.get("version")))
    }

    /// Inserts or replaces; returns the new version.
    pub async fn upsert_credential(
        &self,
        workspace: &str,
        name: &str,
        meta_json: &str,
        sealed: &[u8],
    ) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO credentials (workspace, name, meta_json, sealed) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (workspace, name) DO UPDATE SET meta_json = excluded.meta_json,
               sealed = excluded.sealed, version = credentials.version + 1,
               updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
             RETURNING version",
        )
        .bind(workspace)
        .bind(name)
        .bind(meta_json)
        .bind(sealed)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.get("version"))
    }

    pub async fn delete_credential(&self, workspace: &str, name: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM credentials WHERE workspace = ?1 AND name = ?2")
            .bind(workspace)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
