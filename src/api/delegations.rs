//! Delegated capabilities: a principal mints a token that lets an agent perform some of the
//! principal's own actions on one sandbox, until a deadline.
//!
//! - `POST /v1/sandboxes/{id}/delegations` `{"agent", "actions": [...], "ttl_secs"}` answers
//!   201 with the token (`sgd_…`, shown only here). Every action must be one the delegator
//!   may perform on that sandbox *now* (the same policy layer as the action itself
//!   decides); otherwise 403 and nothing is minted.
//! - The token is accepted only by that sandbox's operation endpoints, only for the named
//!   actions (else 403 `delegation_scope`). At each use the delegator's current authority is
//!   re-read (its configured roles) and the action's policy layer decides again, with
//!   `input.principal` the delegator and `input.delegation` the delegation; so a delegation
//!   never exceeds what its delegator may do at that moment.
//! - `DELETE /v1/delegations/{id}` revokes at once (every use reads the store); expiry is
//!   checked at every use too. `GET /v1/sandboxes/{id}/delegations` lists them, never the
//!   tokens. Only the token's SHA-256 is stored.
//! - Delegable: `exec`, `files.read`, `files.write`, `files.list`, `files.delete`,
//!   `files.mkdir`, `stop`, `start`, `pause`, `resume`, `snapshot`. Deleting the sandbox,
//!   creating sandboxes, credentials and delegating further are not.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::auth::Caller;
use super::body::JsonBody;
use super::extract::Path;
use super::ApiState;
use crate::callers::{token_hash, DELEGATION_TOKEN_PREFIX};
use crate::error::{Error, Kind};
use crate::store::delegations::DelegationRow;

/// Longest delegation.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/sandboxes/{id}/delegations", post(mint).get(list))
        .route("/v1/delegations/{delegation_id}", delete(revoke))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MintBody {
    /// Who the token is for (recorded, shown in decision inputs): 1 to 128 bytes, no
    /// control or invisible formatting characters.
    agent: String,
    /// The operations the agent may perform, e.g. `["exec"]` (at most 64 entries).
    actions: Vec<String>,
    /// Lifetime in seconds (default 3600, at most 7 days).
    ttl_secs: Option<u64>,
}

/// The answer to a mint: the delegation and its token, shown only here.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = MintedDelegation)]
pub struct Minted {
    pub delegation: DelegationRow,
    /// The bearer token an agent uses (`sgd_...`); shown once.
    pub token: String,
}

/// A sandbox's delegations (never their tokens).
#[derive(Serialize, utoipa::ToSchema)]
pub struct DelegationList {
    pub delegations: Vec<DelegationRow>,
}

/// Mint a delegated capability for one sandbox.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/delegations",
    tag = "delegations",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = MintBody, content_type = "application/json"),
    responses(
        (status = 201, description = "{delegation, token}: the token is shown only here", body = Minted),
        (status = 400, description = "invalid_request"),
        (status = 403, description = "policy_denied: the delegator may not perform one of the actions itself"),
        (status = 404, description = "not_found"),
    ),
    security(("bearer" = []))
)]
pub async fn mint(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<MintBody>,
) -> Response {
    let invalid = |field: &str, message: String| {
        Error::new(Kind::Invalid, "invalid_request", message)
            .field(field)
            .into_response()
    };
    if body.agent.trim().is_empty()
        || sandgate_router::check_text(&body.agent, 128, false).is_some()
    {
        return invalid(
            "agent",
            "`agent` must be 1 to 128 bytes without control or invisible formatting characters"
                .into(),
        );
    }
    if body.actions.is_empty() || body.actions.len() > sandgate_router::MAX_ENTRIES {
        return invalid(
            "actions",
            format!(
                "`actions` must name 1 to {} operations",
                sandgate_router::MAX_ENTRIES
            ),
        );
    }
    let ttl = Duration::from_secs(body.ttl_secs.unwrap_or(3600));
    if ttl.is_zero() || ttl > MAX_TTL {
        return invalid("ttl_secs", "`ttl_secs` must be between 1 and 604800".into());
    }
    let actions =
        crate::operations::delegation::delegable_actions(&state.ops, &caller, &id, &body.actions)
            .await;
    let actions = match actions {
        Ok(actions) => actions,
        Err(e) => return e.into_response(),
    };
    let token = format!(
        "{DELEGATION_TOKEN_PREFIX}{}",
        crate::base::ids::random_hex(24)
    );
    let now = crate::base::clock::now_ms();
    let row = DelegationRow {
        id: format!("dg-{}", crate::base::ids::random_hex(8)),
        token_hash: token_hash(&token),
        sandbox_id: id.clone(),
        workspace: caller.workspace.clone(),
        delegator: caller.principal.clone(),
        agent: body.agent.clone(),
        actions,
        created_ms: now,
        expires_ms: now + ttl.as_millis() as i64,
        revoked_ms: None,
    };
    if let Err(e) = state.ops.sandboxes.store().insert_delegation(&row).await {
        return crate::create::internal(e).into_response();
    }
    tracing::info!(sandbox = %id, delegation = %row.id, agent = %row.agent, actions = ?row.actions, principal = %caller.principal, "delegation minted");
    (
        StatusCode::CREATED,
        Json(Minted {
            delegation: row,
            token,
        }),
    )
        .into_response()
}

/// The delegations of a sandbox (never their tokens).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/delegations",
    tag = "delegations",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "{delegations: [...]}", body = DelegationList)),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    match state.ops.sandboxes.locate(&id).await {
        Ok(Some(l)) if caller.may_manage(&l.row.workspace) => {}
        Ok(_) => {
            return Error::new(
                Kind::NotFound,
                "not_found",
                format!("no sandbox {id:?} in your workspace"),
            )
            .into_response()
        }
        Err(e) => return e.into_response(),
    }
    match state.ops.sandboxes.store().list_delegations(&id).await {
        Ok(rows) => Json(DelegationList { delegations: rows }).into_response(),
        Err(e) => crate::create::internal(e).into_response(),
    }
}

/// Revoke a delegation; its token stops working at once.
#[utoipa::path(
    delete,
    path = "/v1/delegations/{delegation_id}",
    tag = "delegations",
    params(("delegation_id" = String, Path, description = "Delegation id")),
    responses((status = 204, description = "Revoked"), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn revoke(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(delegation_id): Path<String>,
) -> Response {
    let store = state.ops.sandboxes.store();
    match store.get_delegation(&delegation_id).await {
        Ok(Some(row)) if caller.may_manage(&row.workspace) => {}
        Ok(_) => {
            return Error::new(
                Kind::NotFound,
                "not_found",
                format!("no delegation {delegation_id:?} in your workspace"),
            )
            .into_response()
        }
        Err(e) => return crate::create::internal(e).into_response(),
    }
    match store
        .revoke_delegation(&delegation_id, crate::base::clock::now_ms())
        .await
    {
        Ok(_) => {
            tracing::info!(delegation = %delegation_id, principal = %caller.principal, "delegation revoked");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => crate::create::internal(e).into_response(),
    }
}
