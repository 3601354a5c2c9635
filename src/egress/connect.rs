//! The proxy-facing side: who is asking (407 otherwise), and what they ask for — a CONNECT
//! tunnel or one absolute-form request.
//!
//! CONNECT phases, in order: the destination host may not carry a placeholder (refused
//! before any lookup) → `sandgate.egress` on the name, unresolved (a refused name is never
//! looked up; an IP literal is its own address), and for a sandbox with `network.cidrs`
//! whose name was refused for want of an allow, once more with its resolved addresses
//! ([`super::by_address`]) → resolve once and vet every address with the real port → record
//! → the tunnel ([`super::tunnel`]) with those vetted addresses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{header, HeaderValue, Method, Request, Response};
use hyper::body::Incoming;
use tracing::Instrument;

use super::body::{full, reply, ProxyBody};
use super::by_address;
use super::decision::{
    egress_refusal, placeholder_in_destination, record, record_unidentified, resolve_error,
    sandbox_inactive, Outcome,
};
use super::deny_tunnel::{self, NotInTunnel};
use super::limits::Hold;
use super::state::{next_request_id, EgressState};
use super::target::{split_authority, Target};
use super::{forward, tunnel};
use crate::credentials::scan;
use crate::error::{Error, Kind, Retry};
use crate::identity::Identity;
use crate::net::ResolveError;
use crate::policy::input::{destination_value, egress_input, Destination};
use crate::policy::Decision;

pub(crate) async fn proxy_request(
    state: Arc<EgressState>,
    peer: SocketAddr,
    fixed: Option<Arc<str>>,
    hold: Hold,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let auth = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .map(|v| v.as_bytes());
    let identity = match &fixed {
        Some(id) => state.identities.get(id),
        None => state.identities.authenticate_or_look_up(auth).await,
    };
    let Some(identity) = identity else {
        if let Some(id) = &fixed {
            // The sandbox's own listener, but its identity is gone (deleted) or not yet
            // registered: nothing goes out, and no credentials would help.
            tracing::debug!(%peer, sandbox = %id, "sandbox listener without an active identity");
            return reply(&sandbox_inactive(id));
        }
        return unidentified(&state, peer, &req, started);
    };
    let span = tracing::info_span!(
        "egress",
        sandbox = %identity.id,
        workspace = %identity.workspace,
        request_id = %next_request_id(),
    );
    dispatch(state, identity, hold, req, started)
        .instrument(span)
        .await
}

fn unidentified(
    state: &EgressState,
    peer: SocketAddr,
    req: &Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    let host = req.uri().host().unwrap_or("");
    let port = req.uri().port_u16().unwrap_or(0);
    record_unidentified(state, host, port, req.method().as_str(), started);
    tracing::debug!(%peer, "proxy request without valid credentials");
    let mut response = reply(&Error::new(
        Kind::Unauthenticated,
        "proxy_auth_required",
        "sandgate needs the sandbox's proxy credentials: use HTTP_PROXY=http://<sandbox-id>:<token>@host:port",
    ));
    response.headers_mut().insert(
        header::PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"sandgate\""),
    );
    response
}

fn bad_request(message: &'static str) -> Response<ProxyBody> {
    reply(&Error::new(Kind::Invalid, "bad_request", message))
}

async fn dispatch(
    state: Arc<EgressState>,
    identity: Arc<Identity>,
    hold: Hold,
    req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        let Some((host, port)) = req.uri().authority().and_then(|a| split_authority(a, 443)) else {
            return bad_request("CONNECT needs a host:port target");
        };
        let target = Arc::new(Target::new(identity, host, port));
        return connect(state, target, hold, req, started).await;
    }
    let default_port = match req
        .uri()
        .scheme_str()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("http") => 80,
        Some("https") => 443,
        _ => {
            return bad_request(
                "sandgate is a forward proxy: send CONNECT or an absolute-form http:// request",
            )
        }
    };
    let Some((host, port)) = req
        .uri()
        .authority()
        .and_then(|a| split_authority(a, default_port))
    else {
        return bad_request("the request URI has no host");
    };
    if scan::mentions_placeholder(host.as_bytes()) {
        let target = Target::new(identity, host, port);
        return refuse_placeholder_host(&state, &target, req.method().as_str(), started);
    }
    let target = Arc::new(Target::new(identity, host, port));
    let scheme = if default_port == 443 { "https" } else { "http" };
    forward::handle(state, target, scheme, None, hold, req).await
}

fn refuse_placeholder_host(
    state: &EgressState,
    target: &Target,
    method: &str,
    started: Instant,
) -> Response<ProxyBody> {
    let error = placeholder_in_destination(target.port);
    let mut outcome = Outcome::new("connect", "connect", method, None);
    outcome.generation = state.policy.generation();
    outcome.deny(&error, vec![error.message.clone()]);
    record(state, target, outcome, started);
    reply(&error)
}

async fn connect(
    state: Arc<EgressState>,
    target: Arc<Target>,
    hold: Hold,
    mut req: Request<Incoming>,
    started: Instant,
) -> Response<ProxyBody> {
    if scan::mentions_placeholder(target.host.as_bytes()) {
        return refuse_placeholder_host(&state, &target, "CONNECT", started);
    }
    // Decide on the name before resolving it: a refused name is never looked up, unless
    // the sandbox may reach addresses (`network.cidrs`) and only a missing allow refused it
    // (see `by_address`).
    let literal_ip = by_address::literal(&target.host);
    let literal_ips: Vec<IpAddr> = literal_ip.into_iter().collect();
    let mut decision = evaluate_connect(&state, &target, &literal_ips);
    let mut outcome = Outcome::new("connect", "connect", "CONNECT", None);
    // An IP literal is the address from the start, refused or not.
    outcome.ip = literal_ip;
    outcome.generation = decision.generation;
    outcome.policy = decision.logged.clone();
    let mut resolved = None;
    if by_address::ask_again_with_addresses(&target.identity, literal_ip, &decision) {
        let ips = match state.resolver.resolve(&target.host, target.port).await {
            Ok(ips) => ips,
            Err(e) => return refuse_resolve(&state, &target, outcome, &e, started),
        };
        decision = evaluate_connect(&state, &target, &ips);
        outcome.ip = Some(ips[0]);
        outcome.generation = decision.generation;
        outcome.policy = decision.logged.clone();
        resolved = Some(ips);
    }
    if !decision.allowed {
        return refuse(state, target, hold, req, decision, outcome, started);
    }
    let ips = match resolved {
        Some(ips) => ips,
        None => match state.resolver.resolve(&target.host, target.port).await {
            Ok(ips) => ips,
            Err(e) => return refuse_resolve(&state, &target, outcome, &e, started),
        },
    };
    outcome.ip = Some(ips[0]);
    outcome.action = Some(decision.action.clone());
    let max = state.config.tunnels_per_identity();
    let Some(tunnel_slot) = target.identity.open_tunnel(max) else {
        metrics::counter!("sandgate_proxy_tunnels_refused_total", "limit" => "per_identity")
            .increment(1);
        let error = too_many_tunnels(&target, max);
        outcome.deny(&error, vec![error.message.clone()]);
        record(&state, &target, outcome, started);
        return reply(&error);
    };
    record(&state, &target, outcome, started);
    let hold = hold.with_tunnel(tunnel_slot);

    let on_upgrade = hyper::upgrade::on(&mut req);
    let action = decision.action;
    // The tunnel keeps the CONNECT's span (sandbox, workspace, request id).
    tokio::spawn(
        async move {
            match on_upgrade.await {
                Ok(upgraded) => tunnel::run(state, target, ips, action, hold, upgraded).await,
                Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
            }
        }
        .instrument(tracing::Span::current()),
    );
    Response::new(full(bytes::Bytes::new()))
}

/// A CONNECT the policy refused: answered inside the tunnel when [`deny_tunnel::admit`]
/// lets it (the client then shows the reason), else with the CONNECT 403. Either way the
/// name is not resolved and nothing is dialed.
fn refuse(
    state: Arc<EgressState>,
    target: Arc<Target>,
    hold: Hold,
    mut req: Request<Incoming>,
    decision: Decision,
    mut outcome: Outcome,
    started: Instant,
) -> Response<ProxyBody> {
    let error = egress_refusal(&target, &decision);
    let mut reasons = decision.reasons.clone();
    let admitted = deny_tunnel::admit(&state, &target, &decision);
    outcome.deny_mode = Some(match &admitted {
        Ok(_) => "in_tunnel",
        Err(_) => "connect",
    });
    if let Err(NotInTunnel::Because(why)) = &admitted {
        reasons.push(why.clone());
    }
    outcome.deny(&error, reasons);
    record(&state, &target, outcome, started);
    let Ok(slot) = admitted else {
        return reply(&error);
    };
    let hold = hold.with_tunnel(slot);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let error = Arc::new(error);
    tokio::spawn(
        async move {
            if let Ok(upgraded) = on_upgrade.await {
                deny_tunnel::run(state, target, error, hold, upgraded).await;
            }
        }
        .instrument(tracing::Span::current()),
    );
    deny_tunnel::established()
}

/// `sandgate.egress` at the connect phase, on the name and the addresses known so far
/// (none for a name not yet resolved).
fn evaluate_connect(state: &EgressState, target: &Target, ips: &[IpAddr]) -> Decision {
    let input = egress_input(
        "connect",
        target.sandbox.value().clone(),
        destination_value(&Destination {
            host: &target.host,
            port: target.port,
            ips,
            scheme: "connect",
        }),
        None,
    );
    state.policy.decide(crate::policy::Layer::Egress, input)
}

/// A destination that does not resolve, or resolves to an address the guard refuses.
fn refuse_resolve(
    state: &EgressState,
    target: &Target,
    mut outcome: Outcome,
    e: &ResolveError,
    started: Instant,
) -> Response<ProxyBody> {
    let error = resolve_error(target, e);
    if let ResolveError::Forbidden { ip, .. } = e {
        outcome.ip = Some(*ip);
    }
    outcome.deny(&error, vec![e.to_string()]);
    record(state, target, outcome, started);
    reply(&error)
}

fn too_many_tunnels(target: &Target, max: usize) -> Error {
    Error::new(
        Kind::RateLimited,
        "too_many_tunnels",
        format!(
            "sandbox {} already holds {max} open tunnels ([proxy] max_tunnels_per_identity); close one and retry",
            target.identity.id
        ),
    )
    .limit(max as u64)
    .retry(Retry::After(Duration::from_secs(1)))
}
