//! Delegation checks: which operations a delegated capability may carry, that its
//! delegator holds them now, and what a presented delegated token stands for.

use std::sync::Arc;

use super::authorize::invalid;
use super::{authorize, Layer, OperationDetail, OpsContext, Principal, ANY_STATE};
use crate::base::DelegationScope;
use crate::error::{Error, Kind};
/// Every action-layer operation may be delegated.
pub use crate::policy::input::ACTION_OPERATIONS;
use crate::policy::input::LIFECYCLE_OPERATIONS;

/// Lifecycle operations a delegation may carry: all but `delete`, which stays with the
/// sandbox's own principals.
pub fn delegable_lifecycle() -> impl Iterator<Item = &'static str> {
    LIFECYCLE_OPERATIONS
        .iter()
        .copied()
        .filter(|op| *op != "delete")
}

/// The policy layer that decides a delegable operation (`None`: not delegable).
pub fn layer_of(operation: &str) -> Option<Layer> {
    if ACTION_OPERATIONS.contains(&operation) {
        Some(Layer::Action)
    } else if delegable_lifecycle().any(|op| op == operation) {
        Some(Layer::Lifecycle)
    } else {
        None
    }
}

/// The actions a delegation of sandbox `id` will carry (in order, without repeats): each
/// must be delegable (else 400 naming `actions[i]`) and one the delegator may perform on
/// that sandbox now, as its own policy layer decides (else that refusal).
pub async fn delegable_actions(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    requested: &[String],
) -> Result<Vec<String>, Error> {
    let mut actions = Vec::new();
    for (i, action) in requested.iter().enumerate() {
        let Some(layer) = layer_of(action) else {
            return Err(invalid(
                &format!("actions[{i}]"),
                format!(
                    "`actions[{i}]`: not a delegable operation; use {} or {}",
                    ACTION_OPERATIONS.join(", "),
                    delegable_lifecycle().collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        // The delegator must hold the authority it hands on, now.
        authorize(
            ctx,
            caller,
            id,
            layer,
            action,
            OperationDetail::None,
            ANY_STATE,
        )
        .await?;
        if !actions.contains(action) {
            actions.push(action.clone());
        }
    }
    Ok(actions)
}

/// A 401 for a delegated token that stands for no one (any more).
fn unauthenticated(message: &str) -> Error {
    Error::new(Kind::Unauthenticated, "unauthenticated", message)
}

/// Resolves a delegated token: live (not expired, not revoked) and its delegator still
/// configured; the principal returned carries the delegator's current roles, narrowed by
/// the delegation. Refusals are 401 `unauthenticated` (the store failing is 500).
pub async fn resolve_delegated(ctx: &OpsContext, token: &str) -> Result<Arc<Principal>, Error> {
    let hash = crate::callers::token_hash(token);
    let row = match ctx.sandboxes.store().delegation_by_token_hash(&hash).await {
        Ok(Some(row)) => row,
        Ok(None) => return Err(unauthenticated("unknown delegated token")),
        Err(e) => return Err(crate::create::internal(e)),
    };
    if row.revoked_ms.is_some() {
        return Err(unauthenticated("this delegated token was revoked"));
    }
    if crate::base::clock::now_ms() >= row.expires_ms {
        return Err(unauthenticated("this delegated token has expired"));
    }
    let Some(delegator) = ctx.auth.principal_named(&row.delegator, &row.workspace) else {
        return Err(unauthenticated(
            "the principal that delegated this token no longer exists",
        ));
    };
    Ok(Arc::new(Principal {
        principal: delegator.principal.clone(),
        workspace: delegator.workspace.clone(),
        roles: delegator.roles.clone(),
        delegation: Some(DelegationScope {
            id: row.id,
            agent: row.agent,
            sandbox_id: row.sandbox_id,
            actions: row.actions,
            expires_ms: row.expires_ms,
        }),
    }))
}
