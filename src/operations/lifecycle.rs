//! Lifecycle transitions (`start`, `stop`, `pause`, `resume`) and the sandbox's lifetime
//! (`set_timeout`), decided by `sandgate.lifecycle`.

use serde_json::Value;

use super::authorize::{authorize, instance, op_failed};
use super::{Layer, OperationDetail, OpsContext, Principal};
use crate::error::{Error, Kind};
use crate::providers::ops::Lifecycle;

/// States whose lifetime can still be changed (not `failed` or `deleted`).
const LIFETIME_STATES: &[&str] = &[
    "pending",
    "provisioning",
    "reconciling",
    "running",
    "paused",
    "stopped",
];

/// Authorizes (`sandgate.lifecycle`) and performs one transition; the sandbox after it
/// (`None` when it is gone).
pub async fn lifecycle(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    op: Lifecycle,
) -> Result<Option<Value>, Error> {
    let (located, adapter) = authorize(
        ctx,
        caller,
        id,
        Layer::Lifecycle,
        op.as_str(),
        OperationDetail::None,
        op.from_states(),
    )
    .await?;
    adapter
        .lifecycle(instance(&located), op)
        .await
        .map_err(|e| op_failed(ctx, id, e))?;
    ctx.sandboxes
        .set_state(id, op.from_states(), op.resulting_state())
        .await?;
    tracing::info!(sandbox = %id, operation = op.as_str(), principal = %caller.principal, "sandbox lifecycle");
    ctx.sandboxes.view(id).await
}

/// Authorizes (`sandgate.lifecycle`, `set_timeout`) and sets the sandbox's end `ttl_secs`
/// from now; the sandbox after it.
pub async fn set_lifetime(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    ttl_secs: u64,
) -> Result<Option<Value>, Error> {
    let max = crate::create::body::MAX_TTL_SECS;
    if ttl_secs == 0 || ttl_secs > max {
        return Err(Error::new(
            Kind::Invalid,
            "invalid_request",
            format!("`ttl_secs`: must be 1 to {max} seconds"),
        )
        .field("ttl_secs"));
    }
    let detail = OperationDetail::Timeout { ttl_secs };
    authorize(
        ctx,
        caller,
        id,
        Layer::Lifecycle,
        "set_timeout",
        detail,
        LIFETIME_STATES,
    )
    .await?;
    tracing::info!(sandbox = %id, ttl_secs, principal = %caller.principal, "sandbox lifetime set");
    ctx.sandboxes.set_timeout(id, ttl_secs).await
}
