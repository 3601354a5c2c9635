//! Snapshot records: which workspace owns a snapshot and which pool holds its archive, or,
//! for a filesystem export (`kind = "filesystem"`), the archive itself.

use sqlx::Row;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotRow {
    pub id: String,
    pub workspace: String,
    pub sandbox_id: String,
    pub pool: String,
    pub provider: String,
    pub size_bytes: i64,
    pub created_ms: i64,
    /// `provider` (restorable on `pool` only) or `filesystem` (on any pool writing files).
    pub kind: String,
}

/// The kinds of snapshot.
pub const PROVIDER_SNAPSHOT: &str = "provider";
pub const FILESYSTEM_EXPORT: &str = "filesystem";

impl Store {
    /// Records a snapshot; `archive` is a filesystem export's archive.
    pub async fn insert_snapshot(
        &self,
        row: &SnapshotRow,
        archive: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO snapshots (id, workspace, sandbox_id, pool, provider, size_bytes, created_ms, kind, archive)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .bind(&row.id)
        .bind(&row.workspace)
        .bind(&row.sandbox_id)
        .bind(&row.pool)
        .bind(&row.provider)
        .bind(row.size_bytes)
        .bind(row.created_ms)
        .bind(&row.kind)
        .bind(archive)
        .execute(self.sqlite_pool())
        .await?;
        Ok(())
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, workspace, sandbox_id, pool, provider, size_bytes, created_ms, kind
             FROM snapshots WHERE id = ?1",
        )
        .bind(id)
        .fetch_optional(self.sqlite_pool())
        .await?;
        Ok(row.map(|r| SnapshotRow {
            id: r.get("id"),
            workspace: r.get("workspace"),
            sandbox_id: r.get("sandbox_id"),
            pool: r.get("pool"),
            provider: r.get("provider"),
            size_bytes: r.get("size_bytes"),
            created_ms: r.get("created_ms"),
            kind: r.get("kind"),
        }))
    }

    /// A filesystem export's archive (`None` for a provider snapshot or no snapshot).
    pub async fn snapshot_archive(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let row = sqlx::query("SELECT archive FROM snapshots WHERE id = ?1")
            .bind(id)
            .fetch_optional(self.sqlite_pool())
            .await?;
        Ok(row.and_then(|r| r.get::<Option<Vec<u8>>, _>("archive")))
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM snapshots WHERE id = ?1")
            .bind(id)
            .execute(self.sqlite_pool())
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
