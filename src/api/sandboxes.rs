//! `/v1/sandboxes`: create (with `Idempotency-Key`), read, list, delete.
//!
//! The create response is the only place the sandbox's egress token appears, and only the
//! create that made the sandbox: an idempotent replay (same key and body, same workspace)
//! returns the same sandbox with `egress.token_already_shown: true` and no token. `GET`,
//! list, delete and replays show the proxy URL with `{token}` in its place.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use super::auth::Caller;
use super::body::JsonBody;
use super::extract::{Path, Query, QueryParams};
use super::ApiState;
use crate::create::Answer;
use crate::error::{Error, Kind};
use crate::store::sandboxes::ListFilter;

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/sandboxes", get(list).post(create))
        .route("/v1/sandboxes/{id}", get(read).delete(remove))
}

fn not_found(id: &str) -> Response {
    Error::new(
        Kind::NotFound,
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
    request_body(content = crate::create::CreateBody, description = "Create request: workspace, provider, fallback_providers, source, resources, features, network, regions, labels, credentials, routing, snapshot, dry_run (plan only: nothing is created, the Idempotency-Key is not used)", content_type = "application/json"),
    responses(
        (status = 200, description = "dry_run: the plan {dry_run, workspace, would_create, first_pool, plan[] {position, pool, provider, account, decision: attempt | skip | refused, reached: first | on_failover | never, layer, error_class, reasons}, refused[] {pool, provider, reasons}, error, placement_record}; nothing was created", body = crate::create::DryRunPlan),
        (status = 201, description = "Placed and running. The create that made the sandbox carries its egress token (`egress.token`, also in `egress.proxy_url` and the proxy variables of `egress.env` unless `egress.enforcement` is `namespace`) with `egress.token_already_shown: false`; this is the only time it is shown. An idempotent replay has no `egress.token`, `{token}` in its place in the proxy URL, and `egress.token_already_shown: true`", body = crate::create::SandboxView),
        (status = 202, description = "Accepted; placement continues in the background (pending, provisioning or reconciling). The token is shown as for 201", body = crate::create::SandboxView),
        (status = 400, description = "invalid_request with details.field = the field path: bytes after the JSON value, a duplicate key, an unknown field at any level, a mistyped value, a resource out of bounds (cpu in (0, 1024], memory_mb 1 to 16777216, disk_gb 1 to 65536, gpu at most 64), a weight or max_skew outside 1 to 1000, a name, label key or value with a control or invisible formatting character or over its length (names and keys 128 bytes, values 256), more than 64 entries in a list or map"),
        (status = 401, description = "unauthenticated"),
        (status = 403, description = "forbidden, policy_denied or billing_refused"),
        (status = 409, description = "idempotency_conflict"),
        (status = 413, description = "payload_too_large: the body is over 1 MiB"),
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
            return Error::new(
                Kind::Invalid,
                "invalid_request",
                "Idempotency-Key must be visible ASCII",
            )
            .into_response()
        }
    };
    match state.ops.sandboxes.create(&caller, body, key).await {
        Ok(answer) => {
            let status = match &answer {
                Answer::Placed(_) => StatusCode::CREATED,
                Answer::Placing(_) => StatusCode::ACCEPTED,
                Answer::Plan(_) => StatusCode::OK,
            };
            (status, Json(answer.into_body())).into_response()
        }
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
    responses((status = 200, description = "The sandbox: state, placement, attempts[] (pool, state, outcome, error_class, message, duration_ms), and placement_record {recorded_ms, source, context, explanation (POST /v1/routes:explain's answer when the create was accepted), candidates, excluded[] {pool, reason}}, null for sandboxes created before records were kept", body = crate::create::SandboxView), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn read(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    match state.ops.sandboxes.view(&id).await {
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

impl QueryParams for ListQuery {
    const PARAMS: &'static str = "workspace, state, label=key=value, limit (1 to 500), cursor";
}

/// Sandbox states a list can filter on.
const STATES: &[&str] = crate::operations::ANY_STATE;

fn invalid(field: &str, message: String) -> Response {
    Error::new(Kind::Invalid, "invalid_request", message)
        .field(field)
        .into_response()
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
        ("limit" = Option<u32>, Query, description = "Page size, 1 to 500 (default 100); outside that range is 400"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
    ),
    responses(
        (status = 200, description = "{sandboxes: [...], next_cursor}", body = crate::create::SandboxPage),
        (status = 400, description = "invalid_request: an unknown, repeated or mistyped parameter, an unknown state, a label that is not key=value, a limit outside 1 to 500"),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Query(q): Query<ListQuery>,
) -> Response {
    use sandgate_router::{check_text, MAX_NAME_BYTES, MAX_VALUE_BYTES};
    if let Some(problem) = q
        .workspace
        .as_deref()
        .and_then(|w| check_text(w, MAX_NAME_BYTES, false))
    {
        return invalid("workspace", format!("`workspace` {problem}"));
    }
    if q.state.as_deref().is_some_and(|s| !STATES.contains(&s)) {
        return invalid(
            "state",
            format!("`state` must be one of {}", STATES.join(", ")),
        );
    }
    if q.limit.is_some_and(|l| !(1..=500).contains(&l)) {
        return invalid("limit", "`limit` must be between 1 and 500".into());
    }
    if let Some(problem) = q
        .cursor
        .as_deref()
        .and_then(|c| check_text(c, MAX_NAME_BYTES, false))
    {
        return invalid("cursor", format!("`cursor` {problem}"));
    }
    let workspace = q.workspace.unwrap_or_else(|| caller.workspace.clone());
    if !caller.may_manage(&workspace) {
        return Error::new(
            Kind::Forbidden,
            "forbidden",
            format!("this principal may not list sandboxes of workspace {workspace:?}"),
        )
        .into_response();
    }
    let label = match q.label.as_deref().map(|l| l.split_once('=')) {
        None => None,
        Some(Some((k, v))) => {
            if let Some(problem) = check_text(k, MAX_NAME_BYTES, false)
                .map(|p| format!("a key {p}"))
                .or_else(|| check_text(v, MAX_VALUE_BYTES, true).map(|p| format!("a value {p}")))
            {
                return invalid("label", format!("`label`: {problem}"));
            }
            Some((k.to_string(), v.to_string()))
        }
        Some(None) => return invalid("label", "`label` must be key=value".into()),
    };
    let limit = q.limit.unwrap_or(100);
    let filter = ListFilter {
        workspace: Some(workspace),
        state: q.state,
        label,
        after: q.cursor,
        limit,
    };
    match state.ops.sandboxes.list(&filter).await {
        Ok(items) => {
            let next = (items.len() as u32 == limit)
                .then(|| {
                    items
                        .last()
                        .and_then(|v| v["id"].as_str().map(str::to_string))
                })
                .flatten();
            Json(crate::create::SandboxPage {
                sandboxes: items,
                next_cursor: next,
            })
            .into_response()
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
    responses((status = 200, description = "The sandbox, state deleted", body = crate::create::SandboxView), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn remove(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    match crate::operations::delete::delete_sandbox(&state.ops, &caller, &id).await {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => not_found(&id),
        Err(e) => e.into_response(),
    }
}
