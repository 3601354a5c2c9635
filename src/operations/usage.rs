//! What a live sandbox uses now (E2B's `get_metrics` through the facade).

use super::authorize::{authorize, instance, op_failed};
use super::{Layer, OperationDetail, OpsContext, Principal, LIVE};
use crate::error::Error;
use crate::providers::Usage;

/// Authorizes (`sandgate.lifecycle`, `metrics`) and reads CPU, memory and disk
/// ([`Provider::usage`](crate::providers::Provider::usage); a provider that cannot tell
/// answers 501 `unsupported`).
pub async fn usage(ctx: &OpsContext, caller: &Principal, id: &str) -> Result<Usage, Error> {
    let (located, adapter) = authorize(
        ctx,
        caller,
        id,
        Layer::Lifecycle,
        "metrics",
        OperationDetail::None,
        LIVE,
    )
    .await?;
    adapter
        .usage(instance(&located))
        .await
        .map_err(|e| op_failed(ctx, id, e))
}
