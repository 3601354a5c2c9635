//! Ports (`sandgate.action`, operation `ports`): who may open a port a sandbox serves, and
//! whether it is open to anyone (public) or only to a request bearing its token.
//!
//! Two moments are decided, each with `input.port = {"number", "public"}`:
//! - **Granting** ([`grant`]): a principal of the API asks for a port's URL; policy decides
//!   as that principal with `public: false` (a refusal is 403 `policy_denied`), and the
//!   answer carries the port's token. Whether the port is public is then a second
//!   decision, the one a tokenless request would get, so the caller learns whether the URL
//!   works without the token.
//! - **Each request through the ports gateway** ([`admit`]): with a valid token, policy
//!   decides as principal `port-token` of the sandbox's workspace with `public: false`;
//!   without one, as principal `anonymous` (no workspace) with `public: true`. A refused
//!   tokenless request is 401 `port_token_required` (without the policy's reasons, which
//!   only the decision log keeps: anyone may send it); a token
//!   that is not this port's is 401 `port_token_invalid`, before policy. Every decision
//!   is written to the decision log like any other action.
//!
//! A token is derived from the master key, the sandbox id and the port
//! ([`crate::credentials::MasterKey::port_token`]): nothing is stored, every replica
//! agrees, and it cannot be revoked one by one; `blocked_operations: ["ports"]` in the
//! workspace's policy data closes its ports, tokens included, at the next request.

use std::sync::Arc;

use super::authorize::{authorize, authorize_located, instance, op_error};
use super::{Layer, OperationDetail, OpsContext, Principal};
use crate::create::Located;
use crate::error::{Details, Error, Kind};
use crate::providers::Provider;

/// The principal a tokenless request is decided as.
pub const ANONYMOUS: &str = "anonymous";
/// The principal a request bearing a valid port token is decided as.
pub const PORT_TOKEN: &str = "port-token";

/// What a principal opening a port gets.
#[derive(Debug, Clone)]
pub struct PortGrant {
    /// Whether the port also answers requests without a token.
    pub public: bool,
    /// The token that opens this port of this sandbox.
    pub token: String,
}

/// A port number as the API and the gateway take it: 1 to 65535.
pub fn check_port(port: u32) -> Result<u16, Error> {
    match u16::try_from(port) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(Error::new(
            Kind::Invalid,
            "invalid_port",
            "a port is a number from 1 to 65535",
        )
        .field("port")),
    }
}

/// Authorizes `caller` to open `port` of sandbox `id` (which must be running, on a
/// provider whose ports the gateway reaches: else 501) and says whether it is public.
pub async fn grant(
    ctx: &OpsContext,
    caller: &Principal,
    id: &str,
    port: u16,
) -> Result<PortGrant, Error> {
    let detail = OperationDetail::Port {
        number: port,
        public: false,
    };
    let states = &["running"];
    let (located, adapter) =
        authorize(ctx, caller, id, Layer::Action, "ports", detail, states).await?;
    adapter.ports().map_err(op_error)?;
    let public = decide_public(ctx, &located, port);
    Ok(PortGrant {
        public,
        token: ctx.credentials.key().port_token(id, Some(port)),
    })
}

/// Whether a tokenless request for `port` would be let through (a decision of its own,
/// logged as such).
fn decide_public(ctx: &OpsContext, located: &Located, port: u16) -> bool {
    let detail = OperationDetail::Port {
        number: port,
        public: true,
    };
    super::authorize::decide(ctx, &anonymous(), located, Layer::Action, "ports", detail).is_ok()
}

/// Authorizes one request through the ports gateway for `port` of sandbox `id`, bearing
/// `token` or none, and connects to the port inside the sandbox (which must be running):
/// the connection, or the refusal to answer. Nothing listening there is 502 `port_closed`.
pub async fn connect(
    ctx: &OpsContext,
    id: &str,
    port: u16,
    token: Option<&str>,
) -> Result<tokio::net::TcpStream, Error> {
    let (located, adapter) = admit(ctx, id, port, token).await?;
    let connected = adapter.connect_port(instance(&located), port).await;
    match connected.map_err(op_error)? {
        Some(stream) => Ok(stream),
        None => Err(Error::new(
            Kind::Upstream,
            "port_closed",
            format!("nothing listens on port {port} inside sandbox {id}"),
        )),
    }
}

/// The decision of [`connect`].
async fn admit(
    ctx: &OpsContext,
    id: &str,
    port: u16,
    token: Option<&str>,
) -> Result<(Located, Arc<dyn Provider>), Error> {
    let Some(located) = ctx.sandboxes.locate(id).await? else {
        return Err(Error::new(
            Kind::NotFound,
            "not_found",
            format!("no sandbox {id:?}"),
        ));
    };
    let (caller, public) = match token {
        None => (anonymous(), true),
        Some(t) if ctx.credentials.key().port_token_matches(id, port, t) => {
            (token_bearer(&located.row.workspace), false)
        }
        Some(_) => {
            return Err(Error::new(
                Kind::Unauthenticated,
                "port_token_invalid",
                format!("the token presented does not open port {port} of sandbox {id}"),
            ))
        }
    };
    let detail = OperationDetail::Port {
        number: port,
        public,
    };
    let states = &["running"];
    match authorize_located(
        ctx,
        &caller,
        located,
        Layer::Action,
        "ports",
        detail,
        states,
    ) {
        Err(e) if public && e.code == "policy_denied" => {
            // Anyone may send this request: the answer names the layer and operation but
            // not the policy's reasons (they may name workspaces and rules); the decision
            // log keeps them.
            let refusal = Error::new(
                Kind::Unauthenticated,
                "port_token_required",
                format!(
                    "port {port} of sandbox {id} is not public: send its token in the \
                     X-Sandgate-Port-Token header"
                ),
            );
            Err(refusal.with_details(Details {
                layer: e.details.layer,
                operation: e.details.operation.clone(),
                ..Details::default()
            }))
        }
        other => other,
    }
}

fn anonymous() -> Principal {
    Principal {
        principal: ANONYMOUS.into(),
        workspace: String::new(),
        roles: Vec::new(),
        delegation: None,
    }
}

fn token_bearer(workspace: &str) -> Principal {
    Principal {
        principal: PORT_TOKEN.into(),
        workspace: workspace.into(),
        roles: Vec::new(),
        delegation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_one_to_65535() {
        assert_eq!(check_port(1).unwrap(), 1);
        assert_eq!(check_port(65535).unwrap(), 65535);
        for bad in [0, 65536, u32::MAX] {
            let e = check_port(bad).unwrap_err();
            assert_eq!(e.code, "invalid_port");
        }
    }
}
