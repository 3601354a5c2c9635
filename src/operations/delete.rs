//! Deleting a sandbox, decided by `sandgate.lifecycle` (`delete`).

use serde_json::Value;

use super::{authorize, Layer, OperationDetail, OpsContext, Principal, ANY_STATE};
use crate::error::Error;

/// Authorizes (`sandgate.lifecycle`, `delete`) and deletes a sandbox in any state (a failed
/// create included); `None` when there is no such sandbox.
pub async fn delete_sandbox(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
) -> Result<Option<Value>, Error> {
    let authorized = authorize(
        ctx,
        caller,
        id,
        Layer::Lifecycle,
        "delete",
        OperationDetail::None,
        ANY_STATE,
    )
    .await;
    match authorized {
        Ok(_) => {}
        // Not yet placed: no adapter, nothing to ask the provider; deleting is still allowed.
        Err(e) if e.code == "unsupported" => {}
        Err(e) => return Err(e),
    }
    ctx.sandboxes.delete(id).await
}
