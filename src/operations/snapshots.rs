//! Snapshots: taking one of a live sandbox (`sandgate.lifecycle`, `snapshot`) and deleting
//! one of the caller's workspace.

use serde::Serialize;

use super::authorize::{authorize, instance, invalid, not_found, op_error, op_failed};
use super::files::MAX_PATH_BYTES;
use super::{Layer, OperationDetail, OpsContext, Principal, LIVE};
use crate::error::{Error, Kind};
use crate::store::snapshots::{SnapshotRow, FILESYSTEM_EXPORT, PROVIDER_SNAPSHOT};

/// Largest filesystem export, in file bytes (the archive is kept in sandgate's database).
pub const MAX_EXPORT_BYTES: u64 = 64 * 1024 * 1024;
/// Most roots a filesystem export may name.
const MAX_EXPORT_ROOTS: usize = 16;

/// What kind of snapshot to take (the default is a provider snapshot).
#[derive(Debug, Clone, Default)]
pub struct SnapshotRequest {
    /// `provider` (default) or `filesystem`.
    pub kind: Option<String>,
    /// Roots of a filesystem export (absolute; default `["/home/user"]`).
    pub paths: Option<Vec<String>>,
}

impl SnapshotRequest {
    /// A known kind, `paths` only for a filesystem export, each an absolute path without
    /// `..` or NUL, at most 16.
    pub fn check(&self) -> Result<(), Error> {
        match self.kind.as_deref() {
            None | Some("provider") if self.paths.is_some() => {
                return Err(invalid(
                    "paths",
                    "`paths` is for a filesystem export (kind = \"filesystem\")",
                ))
            }
            None | Some("provider" | "filesystem") => {}
            Some(_) => return Err(invalid("kind", "`kind` is \"provider\" or \"filesystem\"")),
        }
        let paths = self.paths.as_deref().unwrap_or_default();
        if paths.len() > MAX_EXPORT_ROOTS {
            return Err(invalid("paths", "at most 16 paths"));
        }
        for (i, path) in paths.iter().enumerate() {
            let ok = path.starts_with('/')
                && path.len() <= MAX_PATH_BYTES
                && !path.contains('\0')
                && !path.split('/').any(|c| c == "..");
            if !ok {
                return Err(invalid(
                    &format!("paths[{i}]"),
                    "an absolute path without `..` or NUL",
                ));
            }
        }
        Ok(())
    }

    fn is_filesystem(&self) -> bool {
        self.kind.as_deref() == Some("filesystem")
    }
}

/// The answer to a snapshot: the snapshot, and what a filesystem export moved. The API
/// serializes this type, so the OpenAPI document's schema is what the gateway answers.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SnapshotTaken {
    pub snapshot: SnapshotRow,
    /// A filesystem export's files, directories, bytes and skipped entries (absent for a
    /// provider snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export: Option<crate::providers::export::Summary>,
}

/// Authorizes (`sandgate.lifecycle`, `snapshot` with `input.snapshot`) and takes a snapshot
/// of a live sandbox: `{snapshot: {id, kind, ...}, export?}`. The request is checked first.
pub async fn take_snapshot(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    request: &SnapshotRequest,
) -> Result<SnapshotTaken, Error> {
    request.check()?;
    let detail = OperationDetail::Snapshot {
        kind: request.kind.as_deref().unwrap_or("provider"),
        paths: request.paths.as_deref(),
    };
    let (located, adapter) =
        authorize(ctx, caller, id, Layer::Lifecycle, "snapshot", detail, LIVE).await?;
    let Some(placement) = located.placement.clone() else {
        return Err(not_found(id));
    };
    let mut row = SnapshotRow {
        id: String::new(),
        workspace: located.row.workspace.clone(),
        sandbox_id: id.to_string(),
        pool: placement.pool,
        provider: placement.provider,
        size_bytes: 0,
        created_ms: crate::base::clock::now_ms(),
        kind: PROVIDER_SNAPSHOT.into(),
    };
    let instance = instance(&located);
    if request.is_filesystem() {
        return export(ctx, adapter.as_ref(), instance, request, row).await;
    }
    let info = adapter
        .snapshot(instance)
        .await
        .map_err(|e| op_failed(ctx, id, e))?;
    row.id = info.id.clone();
    row.size_bytes = info.size_bytes as i64;
    if let Err(e) = ctx.sandboxes.store().insert_snapshot(&row, None).await {
        // A snapshot sandgate does not know of would be kept (and billed) at the provider
        // with nothing to delete it by.
        let _ = adapter.delete_snapshot(&info.id).await;
        tracing::warn!(sandbox = %id, snapshot = %info.id, "recording the snapshot failed; the provider's copy was deleted");
        // The store's own error, not a string of it: `internal` answers 503
        // `store_unavailable` when the store is unreachable, 500 otherwise.
        return Err(crate::create::internal(e));
    }
    Ok(SnapshotTaken {
        snapshot: row,
        export: None,
    })
}

/// A filesystem export: the files under the request's roots, read through the files API
/// into an archive the store keeps (restorable on any provider that writes files).
async fn export(
    ctx: &OpsContext,
    adapter: &dyn crate::providers::Provider,
    instance: &str,
    request: &SnapshotRequest,
    mut row: SnapshotRow,
) -> Result<SnapshotTaken, Error> {
    let roots = request
        .paths
        .clone()
        .unwrap_or_else(|| vec!["/home/user".into()]);
    let limits = crate::providers::export::Limits {
        max_bytes: MAX_EXPORT_BYTES,
        ..Default::default()
    };
    let (archive, summary) = crate::providers::export::export(adapter, instance, &roots, limits)
        .await
        .map_err(|e| op_failed(ctx, &row.sandbox_id, e))?;
    row.id = format!("fsx-{}", crate::base::ids::random_hex(12));
    row.kind = FILESYSTEM_EXPORT.into();
    row.size_bytes = archive.len() as i64;
    ctx.sandboxes
        .store()
        .insert_snapshot(&row, Some(&archive))
        .await
        .map_err(|e| {
            tracing::warn!(sandbox = %row.sandbox_id, "recording the filesystem export failed");
            crate::create::internal(e)
        })?;
    Ok(SnapshotTaken {
        snapshot: row,
        export: Some(summary),
    })
}

/// Deletes a snapshot of the caller's workspace (and the provider's copy, for a provider
/// snapshot); another workspace's answers the same 404 as none.
pub async fn delete_snapshot(
    ctx: &OpsContext,
    caller: &Principal,
    snapshot_id: &str,
) -> Result<(), Error> {
    let store = ctx.sandboxes.store();
    let row = match store.get_snapshot(snapshot_id).await {
        Ok(Some(row)) if caller.may_manage(&row.workspace) => row,
        Ok(_) => {
            return Err(Error::new(
                Kind::NotFound,
                "not_found",
                format!("no snapshot {snapshot_id:?} in your workspace"),
            ))
        }
        Err(e) => return Err(crate::create::internal(e)),
    };
    let held_by_provider = row.kind == PROVIDER_SNAPSHOT;
    if let Some(adapter) = ctx
        .sandboxes
        .providers()
        .for_pool(&row.pool)
        .filter(|_| held_by_provider)
    {
        adapter.delete_snapshot(&row.id).await.map_err(op_error)?;
    }
    store
        .delete_snapshot(&row.id)
        .await
        .map(|_| ())
        .map_err(crate::create::internal)
}
