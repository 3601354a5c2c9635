//! `/v1/workspaces/{ws}/credentials[/{name}]`: create, list, read, replace (rotate), delete.
//! Responses carry metadata only; a secret goes in and never comes out.
//!
//! Before anything is stored the body is checked beyond what the credential store checks
//! (see [`check_body`]): the workspace, `user`, header template, Basic username, query
//! parameter and path prefixes carry no control characters (a CR/LF in a template would
//! otherwise end up in a request header), ports are 1 to 65535, methods are HTTP tokens, and
//! lists are bounded. The name rule itself is the store's (`credentials::valid_name`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::auth::Caller;
use super::body::JsonBody;
use super::extract::Path;
use super::ApiState;
use crate::credentials::{Apply, CredentialError, CredentialMeta, DestinationRule, Secret};
use crate::error::{Error, Kind};

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/workspaces/{ws}/credentials", get(list).post(create))
        .route(
            "/v1/workspaces/{ws}/credentials/{name}",
            get(read).put(replace).delete(remove),
        )
}

/// A workspace's credentials (metadata only).
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct CredentialList {
    credentials: Vec<CredentialMeta>,
}

/// A credential as created or replaced (`name` comes from the path on replace).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CredentialBody {
    /// 1-64 of a-z, 0-9, '-', '_', '.', starting with a letter or digit (create only).
    #[serde(default)]
    name: Option<String>,
    /// The principal the credential belongs to (none: the workspace's).
    #[serde(default)]
    user: Option<String>,
    /// Required on create; optional on replace (absent keeps the current secret). Write
    /// only: never returned.
    #[serde(default)]
    #[schema(value_type = Option<String>, write_only)]
    secret: Option<Secret>,
    destinations: Vec<DestinationRule>,
    apply: Apply,
    #[serde(default)]
    placeholder_env: Option<String>,
    #[serde(default)]
    scrub_response_body: bool,
}

/// Most destinations, ports or methods per credential.
const MAX_LIST: usize = 64;
/// Longest header template, path prefix or username, in bytes.
const MAX_TEXT_BYTES: usize = 1024;

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Error {
    let field = field.into();
    let message = message.into();
    Error::new(
        Kind::Invalid,
        "invalid_request",
        format!("`{field}`: {message}"),
    )
    .field(field)
}

fn text(field: impl Into<String>, value: &str, max: usize) -> Result<(), Error> {
    match sandgate_router::check_text(value, max, false) {
        Some(problem) => Err(invalid(field, problem)),
        None => Ok(()),
    }
}

fn bounded(field: &str, len: usize) -> Result<(), Error> {
    if len > MAX_LIST {
        return Err(invalid(
            field,
            format!("must have at most {MAX_LIST} entries"),
        ));
    }
    Ok(())
}

/// The checks of the module documentation, made before anything is stored; messages name
/// the field and never quote the value.
fn check_body(ws: &str, body: &CredentialBody) -> Result<(), Error> {
    text("workspace", ws, sandgate_router::MAX_NAME_BYTES)?;
    if let Some(user) = &body.user {
        text("user", user, sandgate_router::MAX_NAME_BYTES)?;
    }
    bounded("destinations", body.destinations.len())?;
    for (i, d) in body.destinations.iter().enumerate() {
        let at = format!("destinations[{i}]");
        text(format!("{at}.host"), &d.host, 253)?;
        bounded(&format!("{at}.ports"), d.ports.len())?;
        if let Some(j) = d.ports.iter().position(|p| *p == 0) {
            return Err(invalid(format!("{at}.ports[{j}]"), "must be 1 to 65535"));
        }
        bounded(&format!("{at}.methods"), d.methods.len())?;
        for (j, m) in d.methods.iter().enumerate() {
            if m.is_empty() || m.len() > 32 || http::Method::from_bytes(m.as_bytes()).is_err() {
                return Err(invalid(
                    format!("{at}.methods[{j}]"),
                    "must be an HTTP method name (a token such as GET)",
                ));
            }
        }
        if let Some(prefix) = &d.path_prefix {
            text(format!("{at}.path_prefix"), prefix, MAX_TEXT_BYTES)?;
        }
    }
    match &body.apply {
        Apply::Header { name, template } => {
            text("apply.name", name, sandgate_router::MAX_NAME_BYTES)?;
            text("apply.template", template, MAX_TEXT_BYTES)?;
        }
        Apply::Basic { username } => text("apply.username", username, MAX_TEXT_BYTES)?,
        Apply::Query { param } => text("apply.param", param, sandgate_router::MAX_NAME_BYTES)?,
        Apply::AwsSigv4 {
            service,
            region,
            endpoint,
        } => {
            text("apply.service", service, sandgate_router::MAX_NAME_BYTES)?;
            text("apply.region", region, sandgate_router::MAX_NAME_BYTES)?;
            if let Some(endpoint) = endpoint {
                text("apply.endpoint", endpoint, MAX_TEXT_BYTES)?;
            }
        }
        Apply::Oauth2 {
            token_url,
            client_id,
            scopes,
            ..
        } => {
            text("apply.token_url", token_url, MAX_TEXT_BYTES)?;
            text("apply.client_id", client_id, MAX_TEXT_BYTES)?;
            bounded("apply.scopes", scopes.len())?;
            for (i, scope) in scopes.iter().enumerate() {
                text(format!("apply.scopes[{i}]"), scope, MAX_TEXT_BYTES)?;
            }
        }
        Apply::GithubApp { api_url, .. } => text("apply.api_url", api_url, MAX_TEXT_BYTES)?,
    }
    if let Some(env) = &body.placeholder_env {
        text("placeholder_env", env, sandgate_router::MAX_NAME_BYTES)?;
    }
    Ok(())
}

fn forbidden(ws: &str) -> Error {
    Error::new(
        Kind::Forbidden,
        "forbidden",
        format!("this principal may not manage credentials of workspace {ws:?}"),
    )
}

fn error_reply(e: CredentialError) -> Error {
    match e {
        CredentialError::Invalid { field, message } => Error::new(
            Kind::Invalid,
            "invalid_request",
            format!("`{field}`: {message}"),
        )
        .field(field),
        CredentialError::Exists { .. } => {
            Error::new(Kind::Conflict, "already_exists", e.to_string())
        }
        CredentialError::NotFound { .. } => Error::new(Kind::NotFound, "not_found", e.to_string()),
        other => {
            tracing::error!(error = %other, "credential operation failed");
            Error::new(
                Kind::Internal,
                "internal",
                "the credential could not be stored",
            )
        }
    }
}

/// The workspace's credentials (metadata only: a secret is never returned).
#[utoipa::path(
    get,
    path = "/v1/workspaces/{ws}/credentials",
    tag = "credentials",
    params(("ws" = String, Path, description = "Workspace")),
    responses(
        (status = 200, description = "{credentials: [{workspace, name, destinations, apply, placeholder_env, ...}]}", body = CredentialList),
        (status = 403, description = "forbidden: not your workspace")
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(ws): Path<String>,
) -> Response {
    if !caller.may_manage(&ws) {
        return forbidden(&ws).into_response();
    }
    Json(CredentialList {
        credentials: state.ops.credentials.list(&ws),
    })
    .into_response()
}

/// One credential's metadata (never its secret).
#[utoipa::path(
    get,
    path = "/v1/workspaces/{ws}/credentials/{name}",
    tag = "credentials",
    params(("ws" = String, Path, description = "Workspace"), ("name" = String, Path, description = "Credential name")),
    responses((status = 200, description = "The credential's metadata, version and type; for a minted one (oauth2, github_app) also `token: {expires_at, last_refresh_at, last_refresh_outcome, last_refresh_error, ended, refreshes}` (never the token)", body = crate::credentials::CredentialView), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub(crate) async fn read(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path((ws, name)): Path<(String, String)>,
) -> Response {
    if !caller.may_manage(&ws) {
        return forbidden(&ws).into_response();
    }
    match state.ops.credentials.get(&ws, &name) {
        Some(c) => Json(c.view()).into_response(),
        None => error_reply(CredentialError::NotFound {
            workspace: ws,
            name,
        })
        .into_response(),
    }
}

/// Store a credential: `{name, secret, destinations: [{host, ports?, methods?, path_prefixes?}], apply: {type: header|basic|query|aws_sigv4|oauth2|github_app, ...}, placeholder_env?, user?, scrub_response_body?}`. The secret is sealed at rest and only ever applied outside the sandbox, in its declared slot, to the destinations it is bound to.
#[utoipa::path(
    post,
    path = "/v1/workspaces/{ws}/credentials",
    tag = "credentials",
    params(("ws" = String, Path, description = "Workspace")),
    request_body(content = CredentialBody, description = "The credential, with its secret"),
    responses(
        (status = 201, description = "The stored credential's metadata", body = CredentialMeta),
        (status = 400, description = "invalid_request, naming the field"),
        (status = 409, description = "already_exists")
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(ws): Path<String>,
    JsonBody(body): JsonBody<CredentialBody>,
) -> Response {
    if !caller.may_manage(&ws) {
        return forbidden(&ws).into_response();
    }
    if let Err(e) = check_body(&ws, &body) {
        return e.into_response();
    }
    let Some(name) = body.name.clone() else {
        return error_reply(CredentialError::Invalid {
            field: "name".into(),
            message: "required".into(),
        })
        .into_response();
    };
    let meta = CredentialMeta {
        workspace: ws,
        user: body.user,
        name,
        destinations: body.destinations,
        apply: body.apply,
        placeholder_env: body.placeholder_env,
        scrub_response_body: body.scrub_response_body,
    };
    if body.secret.is_none() {
        return error_reply(CredentialError::Invalid {
            field: "secret".into(),
            message: "required".into(),
        })
        .into_response();
    }
    match state.ops.credentials.put(meta, body.secret, false).await {
        Ok(meta) => (StatusCode::CREATED, Json(meta)).into_response(),
        Err(e) => error_reply(e).into_response(),
    }
}

/// Replace a credential (the secret may be omitted to keep it); it cannot be renamed.
#[utoipa::path(
    put,
    path = "/v1/workspaces/{ws}/credentials/{name}",
    tag = "credentials",
    params(("ws" = String, Path, description = "Workspace"), ("name" = String, Path, description = "Credential name")),
    request_body(content = CredentialBody, description = "The credential, as for create"),
    responses((status = 200, description = "The stored credential's metadata", body = CredentialMeta), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub(crate) async fn replace(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path((ws, name)): Path<(String, String)>,
    JsonBody(body): JsonBody<CredentialBody>,
) -> Response {
    if !caller.may_manage(&ws) {
        return forbidden(&ws).into_response();
    }
    if body.name.as_deref().is_some_and(|n| n != name) {
        return error_reply(CredentialError::Invalid {
            field: "name".into(),
            message: "does not match the URL; credentials cannot be renamed".into(),
        })
        .into_response();
    }
    if let Err(e) = check_body(&ws, &body) {
        return e.into_response();
    }
    if state.ops.credentials.get(&ws, &name).is_none() {
        return error_reply(CredentialError::NotFound {
            workspace: ws,
            name,
        })
        .into_response();
    }
    let meta = CredentialMeta {
        workspace: ws,
        user: body.user,
        name,
        destinations: body.destinations,
        apply: body.apply,
        placeholder_env: body.placeholder_env,
        scrub_response_body: body.scrub_response_body,
    };
    match state.ops.credentials.put(meta, body.secret, true).await {
        Ok(meta) => Json(meta).into_response(),
        Err(e) => error_reply(e).into_response(),
    }
}

/// Delete a credential; it stops being applied at once, also on open tunnels.
#[utoipa::path(
    delete,
    path = "/v1/workspaces/{ws}/credentials/{name}",
    tag = "credentials",
    params(("ws" = String, Path, description = "Workspace"), ("name" = String, Path, description = "Credential name")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub(crate) async fn remove(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path((ws, name)): Path<(String, String)>,
) -> Response {
    if !caller.may_manage(&ws) {
        return forbidden(&ws).into_response();
    }
    match state.ops.credentials.delete(&ws, &name).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error_reply(e).into_response(),
    }
}
