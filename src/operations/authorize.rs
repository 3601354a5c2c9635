//! Steps 1 to 3 of every operation (see the module contract): find the sandbox, ask the
//! policy layer, check its state; and how a provider's failure becomes the reply.

use std::sync::Arc;

use super::{OpsContext, Principal};
use crate::create::Located;
use crate::error::{Blame, Details, Error, Kind, Retry};
pub use crate::policy::input::OperationDetail;
use crate::policy::input::{operation_input, SandboxFacts};
use crate::policy::Layer;
use crate::providers::{OpError, OpErrorKind, Provider};

/// States an operation on the instance itself accepts.
pub const LIVE: &[&str] = &["running", "paused", "stopped"];
/// Every state (for decisions that do not act on the instance, such as minting).
pub const ANY_STATE: &[&str] = &[
    "pending",
    "provisioning",
    "reconciling",
    "running",
    "paused",
    "stopped",
    "failed",
    "deleted",
];

/// The same 404 for a sandbox that does not exist and one the caller may not manage, so
/// ids of other workspaces stay private.
pub fn not_found(id: &str) -> Error {
    Error::new(
        Kind::NotFound,
        "not_found",
        format!("no sandbox {id:?} in your workspace"),
    )
}

/// A 400 naming the request field at fault (messages never quote a value).
pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::new(Kind::Invalid, "invalid_request", message.into()).field(field)
}

/// An operation on sandbox `id` failed at its provider: the sandbox is checked at once in
/// case the provider ended it (see `create::liveness`), and the error becomes the reply.
pub(crate) fn op_failed(ctx: &OpsContext, id: &str, e: OpError) -> Error {
    // Not for "unsupported": that is the adapter's own answer, whatever the instance's state
    // (a provider that ended an instance answers 400, 404, 409 or 410, depending on which).
    if e.kind != OpErrorKind::Unsupported {
        ctx.sandboxes.suspect_lost(id);
    }
    op_error(e)
}

/// A provider's error as the reply: its kind picks the status, its code and message pass.
/// A provider that did not answer in time is 504 `upstream_timeout`, not 502: the provider
/// is to blame and a later retry may succeed, but whether it applied the operation is
/// unknown, so a caller resends only what is safe to do twice.
pub(crate) fn op_error(e: OpError) -> Error {
    let kind = match e.kind {
        OpErrorKind::NotFound => Kind::NotFound,
        OpErrorKind::Invalid => Kind::Invalid,
        OpErrorKind::Conflict => Kind::Conflict,
        OpErrorKind::Unsupported => Kind::Unsupported,
        OpErrorKind::Provider => Kind::Upstream,
        OpErrorKind::TimedOut => {
            return Error::new(Kind::UpstreamTimeout, e.code(), e.message)
                .blame(Blame::Upstream)
                .retry(Retry::Yes)
        }
    };
    Error::new(kind, e.code(), e.message)
}

/// The provider's instance id of a located sandbox.
pub(crate) fn instance(located: &Located) -> &str {
    located
        .placement
        .as_ref()
        .map(|p| p.instance_id.as_str())
        .unwrap_or_default()
}

/// Steps 1 to 3 of the module contract; returns the sandbox and its adapter. `detail` is
/// what the policy input says about the operation beyond its name.
pub async fn authorize(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    layer: Layer,
    operation: &str,
    detail: OperationDetail<'_>,
    states: &[&str],
) -> Result<(Located, Arc<dyn Provider>), Error> {
    check_delegation_scope(caller, id, operation)?;
    let located = match ctx.sandboxes.locate(id).await? {
        Some(l) if caller.may_manage(&l.row.workspace) => l,
        _ => return Err(not_found(id)),
    };
    authorize_located(ctx, caller, located, layer, operation, detail, states)
}

/// Steps 2 and 3 on a sandbox already found, for a caller that is no principal of the
/// API (the ports gateway's requests, see [`super::ports`]).
pub(crate) fn authorize_located(
    ctx: &OpsContext,
    caller: &Principal,
    located: Located,
    layer: Layer,
    operation: &str,
    detail: OperationDetail<'_>,
    states: &[&str],
) -> Result<(Located, Arc<dyn Provider>), Error> {
    let id = located.row.id.as_str();
    decide(ctx, caller, &located, layer, operation, detail)?;
    let row = &located.row;
    if !states.contains(&row.state.as_str()) {
        return Err(Error::new(
            Kind::Conflict,
            "sandbox_state",
            format!(
                "sandbox {id} is {}; {operation} needs it {}",
                row.state,
                states.join(" or ")
            ),
        )
        .with_details(Details {
            state: Some(row.state.clone()),
            ..Details::default()
        }));
    }
    let Some(adapter) = located.adapter.clone() else {
        return Err(Error::new(
            Kind::Unsupported,
            "unsupported",
            format!("sandbox {id} has no provider adapter for {operation}"),
        ));
    };
    Ok((located, adapter))
}

/// A delegated caller may perform only the actions it names, on its one sandbox.
fn check_delegation_scope(caller: &Principal, id: &str, operation: &str) -> Result<(), Error> {
    let Some(d) = &caller.delegation else {
        return Ok(());
    };
    if d.sandbox_id == id && d.actions.iter().any(|a| a == operation) {
        return Ok(());
    }
    Err(Error::new(
        Kind::Forbidden,
        "delegation_scope",
        format!(
            "this delegated token allows {} on sandbox {}, not {operation} on {id}",
            d.actions.join(", "),
            d.sandbox_id
        ),
    )
    .with_details(Details {
        delegation: Some(d.id.clone()),
        operation: Some(operation.to_string()),
        ..Details::default()
    }))
}

/// Step 2: the policy layer's decision on `operation`; a refusal is 403 `policy_denied`.
pub(crate) fn decide(
    ctx: &OpsContext,
    caller: &Principal,
    located: &Located,
    layer: Layer,
    operation: &str,
    detail: OperationDetail<'_>,
) -> Result<(), Error> {
    let input = operation_input(operation, caller, &sandbox_facts(located), &detail);
    let decision = ctx.policy.decide(layer, input);
    if decision.allowed {
        return Ok(());
    }
    let id = &located.row.id;
    Err(Error::new(
        Kind::Refused,
        "policy_denied",
        format!("policy ({layer}) refused {operation} on sandbox {id}"),
    )
    .with_details(Details {
        layer: Some(layer),
        operation: Some(operation.to_string()),
        reasons: Some(decision.reasons),
        generation: Some(decision.generation),
        ..Details::default()
    }))
}

/// What policy is told about a located sandbox.
fn sandbox_facts(located: &Located) -> SandboxFacts<'_> {
    let row = &located.row;
    let placement = located.placement.as_ref();
    SandboxFacts {
        id: &row.id,
        workspace: &row.workspace,
        labels_json: &row.labels_json,
        state: &row.state,
        pool: placement.map(|p| p.pool.as_str()),
        provider: placement.map(|p| p.provider.as_str()),
        account: placement.map(|p| p.account.as_str()),
    }
}
