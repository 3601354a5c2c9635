//! Files: each operation checks its paths, authorizes (`sandgate.action`, `files.*` with
//! `input.file`) and runs on a live sandbox.

use super::authorize::{authorize, instance, invalid, op_failed};
use super::{Layer, OperationDetail, OpsContext, Principal, LIVE};
use crate::error::Error;
use crate::providers::ops::WatchStream;
use crate::providers::{BoxFuture, OpError, Provider};

/// Largest file a front end accepts for writing.
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;
/// Longest file path or working directory, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// A path is 1 to 4096 bytes without NUL (other bytes are legal in Linux file names, so a
/// file with a newline in its name can still be read or removed).
pub fn check_path(field: &str, path: &str) -> Result<(), Error> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES || path.contains('\0') {
        return Err(invalid(
            field,
            format!("`{field}` must be 1 to {MAX_PATH_BYTES} bytes without a NUL character"),
        ));
    }
    Ok(())
}

/// Authorizes (`sandgate.action`, `operation` with `input.file.path`) and runs one file
/// operation on a live sandbox: shared by every front end.
/// `op` gets the adapter, the instance and `with` (what it needs borrowed, such as paths).
pub async fn file_action<C, F, T>(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    operation: &'static str,
    path: &str,
    with: &C,
    op: F,
) -> Result<T, Error>
where
    C: ?Sized,
    F: for<'a> FnOnce(&'a dyn Provider, &'a str, &'a C) -> BoxFuture<'a, Result<T, OpError>>,
{
    check_path("path", path)?;
    let detail = OperationDetail::File {
        path,
        destination: None,
    };
    let (located, adapter) =
        authorize(ctx, caller, id, Layer::Action, operation, detail, LIVE).await?;
    op(adapter.as_ref(), instance(&located), with)
        .await
        .map_err(|e| op_failed(ctx, id, e))
}

/// Authorizes `files.move` (`input.file.path` and `input.file.destination`) and moves a
/// file or directory.
pub async fn move_path(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    from: &str,
    to: &str,
) -> Result<(), Error> {
    check_path("path", from)?;
    check_path("destination", to)?;
    let detail = OperationDetail::File {
        path: from,
        destination: Some(to),
    };
    let (located, adapter) =
        authorize(ctx, caller, id, Layer::Action, "files.move", detail, LIVE).await?;
    adapter
        .rename(instance(&located), from, to)
        .await
        .map_err(|e| op_failed(ctx, id, e))
}

/// Authorizes `watch` (`input.file.path` and `input.file.recursive`) and starts watching a
/// directory: refusals (403, 404, 400, 409, 501) are decided here, before any event flows.
pub async fn watch_dir(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    path: &str,
    recursive: bool,
) -> Result<WatchStream, Error> {
    check_path("path", path)?;
    let detail = OperationDetail::Watch { path, recursive };
    let (located, adapter) =
        authorize(ctx, caller, id, Layer::Action, "watch", detail, LIVE).await?;
    adapter
        .watch(instance(&located), path, recursive)
        .await
        .map_err(|e| op_failed(ctx, id, e))
}
