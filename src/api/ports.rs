//! `GET /v1/sandboxes/{id}/ports/{port}`: the URL a port of a sandbox is reached at through
//! the ports gateway ([`crate::ports`]), whether it is public, and its token. Authorized as
//! `sandgate.action` operation `ports` ([`crate::operations::ports::grant`]).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::auth::ActionCaller;
use super::extract::Path;
use super::ApiState;
use crate::error::{Error, Kind};
use crate::operations::ports::{check_port, grant};

pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/sandboxes/{id}/ports/{port}", get(port))
}

/// How to reach one port of a sandbox.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PortAccess {
    /// `https://{port}-{sandbox id}.{domain}`, with the gateway's port unless 443.
    pub url: String,
    /// The URL's authority (E2B's `get_host(port)`).
    pub host: String,
    pub port: u16,
    /// Whether the URL answers requests without the token (the action policy's
    /// `public_ports`); otherwise send `token` in the `token_header` header.
    pub public: bool,
    /// Opens this port of this sandbox (derived from the gateway's master key; closed for
    /// everyone by policy, e.g. `blocked_operations: ["ports"]`). Never logged by sandgate.
    pub token: String,
    /// `X-Sandgate-Port-Token` (`E2b-Traffic-Access-Token` is also accepted).
    pub token_header: String,
}

/// The URL of a port the sandbox serves, its token and whether it is public. The sandbox
/// must be running on a pool whose ports the gateway serves (`features.public_ports`).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/ports/{port}",
    tag = "sandboxes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u32, Path, description = "Port inside the sandbox, 1 to 65535"),
    ),
    responses(
        (status = 200, description = "How to reach the port", body = PortAccess),
        (status = 400, description = "invalid_port"),
        (status = 403, description = "policy_denied (layer sandgate.action, operation ports)"),
        (status = 404, description = "not_found"),
        (status = 409, description = "sandbox_state: the sandbox is not running"),
        (status = 501, description = "unsupported: the pool's provider cannot serve ports, or the ports gateway is off"),
    ),
    security(("bearer" = []))
)]
pub async fn port(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path((id, port)): Path<(String, String)>,
) -> Response {
    let port = match port
        .parse::<u32>()
        .map_err(|_| ())
        .and_then(|p| check_port(p).map_err(|_| ()))
    {
        Ok(p) => p,
        Err(()) => return check_port(0).unwrap_err().into_response(),
    };
    let granted = match grant(&state.ops, &caller, &id, port).await {
        Ok(granted) => granted,
        Err(e) => return e.into_response(),
    };
    let Some(urls) = &state.ports else {
        return Error::new(
            Kind::Unsupported,
            "unsupported",
            "the ports gateway is not serving on this replica ([ports])",
        )
        .into_response();
    };
    Json(PortAccess {
        url: urls.url(&id, port),
        host: urls.host(&id, port),
        port,
        public: granted.public,
        token: granted.token,
        token_header: "X-Sandgate-Port-Token".into(),
    })
    .into_response()
}
