//! `GET /v1/identities/{id}/env`: what to put in a sandbox's environment so its traffic goes
//! through sandgate: the proxy variables (the token part left as `{token}`: the token is
//! shown once, when a sandbox is created, never again), the CA variables, and one
//! placeholder variable per bound credential.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::auth::Caller;
use super::extract::Path;
use super::ApiState;
use crate::error::{Error, Kind};
use crate::localbox::{CA_ENV_VARS, NO_PROXY, PROXY_ENV_VARS};

pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/identities/{id}/env", get(env))
}

/// The proxy and CA environment a sandbox identity is given (its token shown as `{token}`).
#[utoipa::path(
    get,
    path = "/v1/identities/{id}/env",
    tag = "identities",
    params(("id" = String, Path, description = "Sandbox identity id")),
    responses((status = 200, description = "{identity, env: {HTTP_PROXY, HTTPS_PROXY, NO_PROXY, SSL_CERT_FILE, ...}}", body = Object), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn env(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Response {
    let identity = match state.ops.identities.get(&id) {
        Some(identity) if caller.may_manage(&identity.workspace) => identity,
        // The same answer for "absent" and "not yours": ids of other workspaces stay private.
        _ => {
            return Error::new(
                Kind::NotFound,
                "not_found",
                format!("no identity {id:?} in your workspace"),
            )
            .into_response()
        }
    };
    let proxy = format!("http://{}:{{token}}@{}", identity.id, state.proxy_addr);
    let mut env = BTreeMap::new();
    for var in PROXY_ENV_VARS {
        env.insert(var.to_string(), proxy.clone());
    }
    env.insert("NO_PROXY".into(), NO_PROXY.into());
    env.insert("no_proxy".into(), NO_PROXY.into());
    let ca = state.ca_cert_path.display().to_string();
    for var in CA_ENV_VARS {
        env.insert(var.to_string(), ca.clone());
    }
    let mut placeholders = BTreeMap::new();
    for binding in &identity.bindings {
        placeholders.insert(binding.name.clone(), binding.placeholder.clone());
        if let Some(credential) = state
            .ops
            .credentials
            .get(&identity.workspace, &binding.name)
        {
            env.extend(credential.meta.placeholder_vars(&binding.placeholder));
        }
    }
    Json(json!({"id": identity.id, "workspace": identity.workspace, "env": env, "placeholders": placeholders}))
        .into_response()
}
