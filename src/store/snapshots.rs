//! Snapshot records: which workspace owns a snapshot and which pool holds its archive, or,
//! for a filesystem export (`kind = "filesystem"`), the archive itself.

use super::{Store, StoreError, StoreRow};

/// A snapshot as the API shows it (in the answer to `POST /v1/sandboxes/{id}/snapshot`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[schema(as = SnapshotView)]
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

fn snapshot_row(r: &impl StoreRow) -> Result<SnapshotRow, sqlx::Error> {
    Ok(SnapshotRow {
        id: r.col("id")?,
        workspace: r.col("workspace")?,
        sandbox_id: r.col("sandbox_id")?,
        pool: r.col("pool")?,
        provider: r.col("provider")?,
        size_bytes: r.col("size_bytes")?,
        created_ms: r.col("created_ms")?,
        kind: r.col("kind")?,
    })
}

impl Store {
    /// Records a snapshot; `archive` is a filesystem export's archive (BLOB on SQLite,
    /// BYTEA on Postgres).
    pub async fn insert_snapshot(
        &self,
        row: &SnapshotRow,
        archive: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO snapshots (id, workspace, sandbox_id, pool, provider,
               size_bytes, created_ms, kind, archive)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
        with_pool!(self, pool => sqlx::query(SQL)
            .bind(&row.id)
            .bind(&row.workspace)
            .bind(&row.sandbox_id)
            .bind(&row.pool)
            .bind(&row.provider)
            .bind(row.size_bytes)
            .bind(row.created_ms)
            .bind(&row.kind)
            .bind(archive)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// A snapshot's record (without its archive).
    pub async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, StoreError> {
        const SQL: &str = "SELECT id, workspace, sandbox_id, pool, provider, size_bytes,
               created_ms, kind
             FROM snapshots WHERE id = $1";
        Ok(
            with_pool!(self, pool => match sqlx::query(SQL).bind(id).fetch_optional(pool).await? {
                Some(r) => Some(snapshot_row(&r)?),
                None => None,
            }),
        )
    }

    /// A filesystem export's archive (`None` for a provider snapshot or no snapshot).
    pub async fn snapshot_archive(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        const SQL: &str = "SELECT archive FROM snapshots WHERE id = $1";
        Ok(
            with_pool!(self, pool => match sqlx::query(SQL).bind(id).fetch_optional(pool).await? {
                Some(r) => r.col::<Option<Vec<u8>>>("archive")?,
                None => None,
            }),
        )
    }

    /// Deletes a snapshot record (and its archive); `false` when there was none.
    pub async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        const SQL: &str = "DELETE FROM snapshots WHERE id = $1";
        let affected = with_pool!(self, pool => sqlx::query(SQL)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(affected > 0)
    }
}
