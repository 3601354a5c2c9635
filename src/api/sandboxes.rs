//! `/v1/sandboxes`: create (with `Idempotency-Key`), read, list, delete.
//!
//! The create response is the only place the sandbox's egress token appears, and only the
//! create that made the sandbox: an idempotent replay (same key and body, same workspace)
//! returns the same sandbox with `egress.token_already_shown: true` and no token. `GET`,
//! list, delete and replays show the proxy URL with `{token}` in its place.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::body::JsonBody;
use super::ApiState;
use crate::error::ErrorReply;
use crate::store::sandboxes::ListFilter;

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/sandboxes", get(list).post(create))
        .route("/v1/sandboxes/{id}", get(read).delete(remove))
}

fn not_found(id: &str) -> Response {
    ErrorReply::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no sandbox {id:?} in your workspace"),
    )
    .into_response()
}

/// Create a sandbox: route, admit and provision with failover under one sandbox id.
#[utoipa::path(
    post,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    params(("Idempotency-Key" = Option<String>, Header, description = "Same key and body return the same sandbox, without its egress token (shown once, to the first create); scoped per workspace")),
    request_body(content = Object, description = "Create request: workspace, provider, fallback_providers, source, resources, features, network, regions, labels, credentials, routing", content_type = "application/json"),
    responses(
        (status = 201, description = "Placed and running. The create that made the sandbox carries its egress token (`egress.token`, also in `egress.proxy_url` and the proxy variables of `egress.env` unless `egress.enforcement` is `namespace`) with `egress.token_already_shown: false`; this is the only time it is shown. An idempotent replay has no `egress.token`, `{token}` in its place in the proxy URL, and `egress.token_already_shown: true`", body = Object),
        (status = 202, description = "Accepted; placement continues in the background (pending, provisioning or reconciling). The token is shown as for 201", body = Object),
        (status = 400, description = "invalid_request"),
        (status = 401, description = "unauthenticated"),
        (status = 403, description = "forbidden, policy_denied or billing_refused"),
        (status = 409, description = "idempotency_conflict"),
        (status = 422, description = "no_eligible_provider with details.attempts[] = {provider, pool, unmet_requirements}"),
        (status = 503, description = "creation_failed: every candidate was tried; details.attempts lists each attempt"),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Response {
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v.to_string()),
        Some(Err(_)) => {
            return ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "Idempotency-Key must be visible ASCII",
            )
            .into_response()
        }
    };
    match state.sandboxes.create(&caller, body, key).await {
        Ok((status, body)) => (status, Json(body)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A sandbox: state, placement, every attempt (pool, account, outcome, error class, timings),
/// and the proxy URL and CA its traffic uses (never the token).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox", body = Object), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn read(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    match state.sandboxes.view(&id).await {
        Ok(Some(view)) if caller.may_manage(view["workspace"].as_str().unwrap_or_default()) => {
            Json(view).into_response()
        }
        Ok(_) => not_found(&id),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    workspace: Option<String>,
    state: Option<String>,
    /// `key=value`
    label: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

/// Sandboxes of a workspace (the caller's unless `workspace` is given), oldest first.
#[utoipa::path(
    get,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    params(
        ("workspace" = Option<String>, Query, description = "Defaults to the caller's workspace"),
        ("state" = Option<String>, Query, description = "pending, provisioning, reconciling, running, failed, deleted"),
        ("label" = Option<String>, Query, description = "key=value"),
        ("limit" = Option<u32>, Query, description = "Page size, 1 to 500 (default 100)"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
    ),
    responses((status = 200, description = "{sandboxes: [...], next_cursor}", body = Object)),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return ErrorReply::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "query parameters: workspace, state, label=key=value, limit, cursor",
        )
        .into_response();
    };
    let workspace = q.workspace.unwrap_or_else(|| caller.workspace.clone());
    if !caller.may_manage(&workspace) {
        return ErrorReply::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this principal may not list sandboxes of workspace {workspace:?}"),
        )
        .into_response();
    }
    let label = match q.label.as_deref().map(|l| l.split_once('=')) {
        None => None,
        Some(Some((k, v))) => Some((k.to_string(), v.to_string())),
        Some(None) => {
            return ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "label must be key=value",
            )
            .into_response()
        }
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 500);
    let filter = ListFilter {
        workspace: Some(workspace),
        state: q.state,
        label,
        after: q.cursor,
        limit,
    };
    match state.sandboxes.list(&filter).await {
        Ok(items) => {
            let next = (items.len() as u32 == limit)
                .then(|| {
                    items
                        .last()
                        .and_then(|v| v["id"].as_str().map(str::to_string))
                })
                .flatten();
            Json(json!({"sandboxes": items, "next_cursor": next})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Delete a sandbox: its egress identity is revoked at once, its instance deleted.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox, state deleted", body = Object), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn remove(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    // Any state may be deleted (a failed create included); policy still decides.
    let authorized = super::sandbox_ops::authorize(
        &state,
        &caller,
        &id,
        "lifecycle",
        "delete",
        json!({}),
        super::sandbox_ops::ANY_STATE,
    )
    .await;
    match authorized {
        Ok(_) => {}
        // Not yet placed: no adapter, nothing to ask the provider; deleting is still allowed.
        Err(e) if e.code == "unsupported" => {}
        Err(e) => return e.into_response(),
    }
    match state.sandboxes.delete(&id).await {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => not_found(&id),
        Err(e) => e.into_response(),
    }
}
