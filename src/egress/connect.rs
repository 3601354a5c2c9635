//! The proxy-facing side: who is asking (407 otherwise), and what they ask for — a CONNECT
//! tunnel or one absolute-form request.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tracing::Instrument;

use super::forward::{self, Outcome, Target};
use super::{reply, tunnel, EgressState, ProxyBody};
use crate::error::ErrorReply;
use crate::identity::Identity;
use crate::net::ResolveError;
use crate::policy::input::{destination_value, egress_input, Destination};

pub(crate) async fn proxy_request(
    state: Arc<EgressState>,
    peer: SocketAddr,
    fixed: Option<Arc<str>>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let auth = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .map(|v| v.as_bytes());
    let identity = match &fixed {
        Some(id) => state.identities.get(id),
        None => state.identities.authenticate(auth),
    };
    let Some(identity) = identity else {
        if let Some(id) = &fixed {
            // The sandbox's own listener, but its identity is gone (deleted) or not yet
            // registered: nothing goes out, and no credentials would help.
            tracing::debug!(%peer, sandbox = %id, "sandbox listener without an active identity");
            return reply(&ErrorReply::new(
                StatusCode::FORBIDDEN,
                "sandbox_inactive",
                format!("sandbox {id} has no active egress identity (deleted, or not running yet)"),
            ));
        }
        let host = req.uri().host().unwrap_or("").to_string();
        let port = req.uri().port_u16().unwrap_or(0);
        forward::record_unidentified(&state, &host, port, req.method().as_str(), started);
        tracing::debug!(%peer, "proxy request without valid credentials");
        let mut response = reply(&ErrorReply::new(
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "proxy_auth_required",
            "sandgate needs the sandbox's proxy credentials: use HTTP_PROXY=http://<sandbox-id>:<token>@host:port",
        ));
        response.headers_mut().insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"sandgate\""),
        );
        return response;
    };

    let span = tracing::info_span!(
        "egress",
        sandbox = %identity.id,
        workspace = %identity.workspace,
        request_id = %super::next_request_id(),
    );
    dispatch(state, identity, req, started)
        .instrument(span)
        .await
}

async fn dispatch(
    state: Arc<EgressState>,
    identity: Arc<Identity>,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        let Some((host, port)) = req.uri().authority().and_then(|a| split_authority(a, 443)) else {
            return reply(&ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "CONNECT needs a host:port target",
            ));
        };
        let target = Arc::new(Target::new(identity, host, port));
        return connect(state, target, req, started).await;
    }

    let scheme = req.uri().scheme_str().map(str::to_ascii_lowercase);
    let default_port = match scheme.as_deref() {
        Some("http") => 80,
        Some("https") => 443,
        _ => {
            return reply(&ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "sandgate is a forward proxy: send CONNECT or an absolute-form http:// request",
            ))
        }
    };
    let Some((host, port)) = req
        .uri()
        .authority()
        .and_then(|a| split_authority(a, default_port))
    else {
        return reply(&ErrorReply::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the request URI has no host",
        ));
    };
    let target = Arc::new(Target::new(identity, host, port));
    let scheme = if default_port == 443 { "https" } else { "http" };
    forward::handle(state, target, scheme, None, req).await
}

/// Host (lower-case, IPv6 without brackets) and port of an authority.
fn split_authority(authority: &http::uri::Authority, default_port: u16) -> Option<(String, u16)> {
    let host = authority.host();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((
        crate::domain::normalize_host(host),
        authority.port_u16().unwrap_or(default_port),
    ))
}

async fn connect(
    state: Arc<EgressState>,
    target: Arc<Target>,
    mut req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    // Decide on the name before resolving it: a refused name is never looked up.
    let literal_ip = target.host.parse::<IpAddr>().ok();
    let input = egress_input(
        "connect",
        target.sandbox.clone(),
        destination_value(&Destination {
            host: &target.host,
            port: target.port,
            ip: literal_ip,
            scheme: "connect",
        }),
        None,
    );
    let decision = state.policy.evaluate("egress", input);
    let mut outcome = Outcome::new("connect", "connect", "CONNECT", None);
    outcome.generation = decision.generation;
    if !decision.allowed {
        let error = forward::egress_denied(&target, &decision.reasons);
        outcome.deny(&error, decision.reasons.clone());
        forward::record(&state, &target, outcome, started);
        return reply(&error);
    }
    let ips = match state.resolver.resolve(&target.host, target.port).await {
        Ok(ips) => ips,
        Err(e) => {
            let error = resolve_error(&target, &e);
            outcome.deny(&error, vec![e.to_string()]);
            forward::record(&state, &target, outcome, started);
            return reply(&error);
        }
    };
    outcome.ip = Some(ips[0]);
    outcome.action = Some(decision.action.clone());
    forward::record(&state, &target, outcome, started);

    let on_upgrade = hyper::upgrade::on(&mut req);
    let action = decision.action;
    // The tunnel keeps the CONNECT's span (sandbox, workspace, request id).
    tokio::spawn(
        async move {
            match on_upgrade.await {
                Ok(upgraded) => tunnel::run(state, target, ips, action, upgraded).await,
                Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
            }
        }
        .instrument(tracing::Span::current()),
    );
    Response::new(super::full(bytes::Bytes::new()))
}

pub(crate) fn resolve_error(target: &Target, e: &ResolveError) -> ErrorReply {
    match e {
        ResolveError::Forbidden { ip, why, .. } => ErrorReply::new(
            StatusCode::FORBIDDEN,
            "destination_forbidden",
            format!(
                "{} resolves to {ip}, a {} address that sandboxes may not reach",
                target.host,
                why.as_str()
            ),
        )
        .with_details(json!({
            "host": target.host, "port": target.port, "ip": ip.to_string(),
            "reasons": [format!("{} address", why.as_str())],
        })),
        ResolveError::Lookup { reason, .. } => ErrorReply::new(
            StatusCode::BAD_GATEWAY,
            "dns_failed",
            format!("cannot resolve {}: {reason}", target.host),
        )
        .with_details(json!({"host": target.host, "port": target.port})),
    }
}
