//! One HTTP request from a sandbox: checked (authority, method, policy), then forwarded to
//! the vetted upstream, streaming both ways (trailers and upgrades included).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{header, HeaderMap, HeaderName, Method, Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::json;

use super::connect::resolve_error;
use super::{reply, EgressState, ProxyBody};
use crate::credentials::apply::{apply as apply_credentials, scrub_response_headers, RequestView};
use crate::decision_log::{now_rfc3339, redact_query, DecisionRecord};
use crate::error::ErrorReply;
use crate::identity::Identity;
use crate::policy::input::{
    destination_value, egress_input, request_value, sandbox_value, Destination, RequestFacts,
};

/// Where a sandbox asked to go: the CONNECT authority or the absolute URI's authority.
pub(crate) struct Target {
    pub identity: Arc<Identity>,
    /// Lower-case; IPv6 literals without brackets.
    pub host: String,
    pub port: u16,
    /// `host:port` as it goes into an upstream URI.
    pub authority: String,
    /// The sandbox part of every policy input, built once per tunnel.
    pub sandbox: regorus::Value,
}

impl Target {
    pub fn new(identity: Arc<Identity>, host: String, port: u16) -> Target {
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let sandbox = sandbox_value(&identity);
        Target {
            identity,
            host,
            port,
            authority,
            sandbox,
        }
    }
}

/// What is written to the decision log for one decision.
pub(crate) struct Outcome {
    pub phase: &'static str,
    pub protocol: &'static str,
    pub method: String,
    pub path: Option<String>,
    pub ip: Option<IpAddr>,
    pub decision: &'static str,
    pub code: Option<&'static str>,
    pub reasons: Vec<String>,
    pub action: Option<String>,
    pub credentials: Vec<String>,
    pub generation: u64,
}

impl Outcome {
    pub fn new(
        phase: &'static str,
        protocol: &'static str,
        method: &str,
        path: Option<String>,
    ) -> Outcome {
        Outcome {
            phase,
            protocol,
            method: method.to_string(),
            path,
            ip: None,
            decision: "allow",
            code: None,
            reasons: Vec::new(),
            action: None,
            credentials: Vec::new(),
            generation: 0,
        }
    }

    pub fn deny(&mut self, error: &ErrorReply, reasons: Vec<String>) {
        self.decision = "deny";
        self.code = Some(error.code);
        self.reasons = reasons;
    }
}

pub(crate) fn record(state: &EgressState, target: &Target, outcome: Outcome, started: Instant) {
    let latency = started.elapsed();
    metrics::histogram!("sandgate_proxy_decision_seconds", "phase" => outcome.phase)
        .record(latency.as_secs_f64());
    metrics::counter!(
        "sandgate_egress_decisions_total",
        "phase" => outcome.phase,
        "decision" => outcome.decision
    )
    .increment(1);
    // Inside the request's span, so diagnostics carry sandbox, workspace and request id.
    tracing::debug!(
        phase = outcome.phase,
        host = %target.host,
        port = target.port,
        decision = outcome.decision,
        code = outcome.code.unwrap_or(""),
        "egress decision"
    );
    if !state.log.enabled() {
        return;
    }
    state.log.record(DecisionRecord {
        ts: now_rfc3339(),
        kind: "egress",
        sandbox: Some(target.identity.id.clone()),
        workspace: Some(target.identity.workspace.clone()),
        phase: outcome.phase,
        protocol: outcome.protocol,
        host: target.host.clone(),
        port: target.port,
        ip: outcome.ip.map(|ip| ip.to_string()),
        method: Some(outcome.method),
        path: outcome.path.map(|p| redact_query(&p)),
        decision: outcome.decision,
        code: outcome.code,
        reasons: outcome.reasons,
        action: outcome.action,
        credentials: outcome.credentials,
        policy_generation: outcome.generation,
        latency_us: latency.as_micros() as u64,
    });
}

pub(crate) fn record_unidentified(
    state: &EgressState,
    host: &str,
    port: u16,
    method: &str,
    started: Instant,
) {
    metrics::counter!(
        "sandgate_egress_decisions_total",
        "phase" => "identify",
        "decision" => "deny"
    )
    .increment(1);
    if !state.log.enabled() {
        return;
    }
    state.log.record(DecisionRecord {
        ts: now_rfc3339(),
        kind: "egress",
        sandbox: None,
        workspace: None,
        phase: "identify",
        protocol: "proxy",
        host: host.to_string(),
        port,
        ip: None,
        method: Some(method.to_string()),
        path: None,
        decision: "deny",
        code: Some("proxy_auth_required"),
        reasons: vec!["missing or invalid proxy credentials".into()],
        action: None,
        credentials: Vec::new(),
        policy_generation: state.policy.generation(),
        latency_us: started.elapsed().as_micros() as u64,
    });
}

pub(crate) fn egress_denied(target: &Target, reasons: &[String]) -> ErrorReply {
    ErrorReply::new(
        StatusCode::FORBIDDEN,
        "egress_denied",
        format!(
            "egress to {}:{} is denied by policy: {}",
            target.host,
            target.port,
            reasons.join("; ")
        ),
    )
    .with_details(json!({"host": target.host, "port": target.port, "reasons": reasons}))
}

fn protocol_of(version: Version, scheme: &str) -> &'static str {
    match (scheme, version) {
        ("https", Version::HTTP_2) => "https/h2",
        ("https", _) => "https/h1",
        (_, Version::HTTP_2) => "http/h2",
        _ => "http/h1",
    }
}

/// What every request of a CONNECT tunnel shares once its destination is vetted: the
/// addresses resolved and checked at CONNECT, and the destination part of the policy input,
/// built once per tunnel rather than per request (it was ~5% of the proxy's CPU per request).
pub(crate) struct Vetted {
    pub ips: Arc<[IpAddr]>,
    pub destination: regorus::Value,
}

impl Vetted {
    pub fn new(target: &Target, scheme: &'static str, ips: Arc<[IpAddr]>) -> Vetted {
        let destination = destination_value(&Destination {
            host: &target.host,
            port: target.port,
            ip: Some(ips[0]),
            scheme,
        });
        Vetted { ips, destination }
    }
}

/// Handles one request. `vetted` is the tunnel's vetted destination; `None` for
/// absolute-form requests, which are resolved here once the policy has allowed them.
pub(crate) async fn handle(
    state: Arc<EgressState>,
    target: Arc<Target>,
    scheme: &'static str,
    vetted: Option<Arc<Vetted>>,
    mut req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut outcome = Outcome::new(
        "request",
        protocol_of(req.version(), scheme),
        req.method().as_str(),
        Some(path.clone()),
    );
    outcome.ip = vetted.as_ref().map(|v| v.ips[0]);
    outcome.generation = state.policy.generation();

    if let Err(error) = check_authority(&req, &target) {
        outcome.deny(&error, vec![error.message.clone()]);
        record(&state, &target, outcome, started);
        return reply(&error);
    }
    if req.method().as_str().eq_ignore_ascii_case("TRACE")
        || req.method().as_str().eq_ignore_ascii_case("TRACK")
    {
        let error = ErrorReply::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!(
                "{} is refused: it reflects request headers back",
                req.method()
            ),
        );
        outcome.deny(&error, vec![error.message.clone()]);
        record(&state, &target, outcome, started);
        return reply(&error);
    }

    let destination = match &vetted {
        Some(v) => v.destination.clone(),
        None => destination_value(&Destination {
            host: &target.host,
            port: target.port,
            ip: None,
            scheme,
        }),
    };
    let input = egress_input(
        "request",
        target.sandbox.clone(),
        destination.clone(),
        Some(request_value(&RequestFacts {
            method: req.method().as_str(),
            path: &path,
            headers: req.headers(),
        })),
    );
    let decision = state.policy.evaluate("egress", input);
    outcome.generation = decision.generation;
    if !decision.allowed {
        let error = egress_denied(&target, &decision.reasons);
        outcome.deny(&error, decision.reasons);
        record(&state, &target, outcome, started);
        return reply(&error);
    }

    if vetted.is_none() {
        match state.resolver.resolve(&target.host, target.port).await {
            Ok(resolved) => outcome.ip = Some(resolved[0]),
            Err(e) => {
                let error = resolve_error(&target, &e);
                outcome.deny(&error, vec![e.to_string()]);
                record(&state, &target, outcome, started);
                return reply(&error);
            }
        }
    }

    let h2_websocket = is_h2_websocket(&req);
    let websocket = is_upgrade(&req) || h2_websocket;
    let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let mut path = path;
    let view = RequestView {
        host: &target.host,
        port: target.port,
        scheme,
        method: parts.method.as_str(),
        destination: destination.clone(),
        sandbox: target.sandbox.clone(),
    };
    let applied = match apply_credentials(
        &state.credentials,
        &state.policy,
        &target.identity,
        &view,
        &mut parts.headers,
        &mut path,
    ) {
        Ok(applied) => applied,
        Err(error) => {
            outcome.deny(
                &error,
                error.details["reasons"]
                    .as_array()
                    .map(|r| {
                        r.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            );
            record(&state, &target, outcome, started);
            return reply(&error);
        }
    };
    outcome.credentials = applied.names.clone();
    parts.uri = match format!("{scheme}://{}{path}", target.authority).parse() {
        Ok(uri) => uri,
        Err(_) => {
            let error = ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "malformed request target",
            );
            outcome.deny(&error, vec![error.message.clone()]);
            record(&state, &target, outcome, started);
            return reply(&error);
        }
    };
    strip_hop_by_hop(&mut parts.headers, websocket);
    // The client sets Host (h1) or :authority (h2) from the URI, which is the vetted target.
    parts.headers.remove(header::HOST);
    parts.version = Version::HTTP_11;
    // An h2 WebSocket (RFC 8441) goes upstream as the HTTP/1.1 handshake it stands for;
    // sandgate makes the key and checks the origin's answer to it.
    let ws_key = h2_websocket.then(|| {
        let key = websocket_key();
        parts.method = Method::GET;
        parts.extensions.remove::<hyper::ext::Protocol>();
        let headers = &mut parts.headers;
        headers.insert(
            header::CONNECTION,
            http::HeaderValue::from_static("upgrade"),
        );
        headers.insert(header::UPGRADE, http::HeaderValue::from_static("websocket"));
        if let Ok(value) = http::HeaderValue::from_str(&key) {
            headers.insert(header::SEC_WEBSOCKET_KEY, value);
        }
        headers
            .entry(header::SEC_WEBSOCKET_VERSION)
            .or_insert(http::HeaderValue::from_static("13"));
        key
    });
    let upstream_req = Request::from_parts(parts, body.boxed());

    let wait = Duration::from_secs(state.config.idle_timeout_secs);
    let client = if websocket {
        &state.client_h1
    } else {
        &state.client
    };
    let response = match tokio::time::timeout(wait, client.request(upstream_req)).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            let error = ErrorReply::new(
                StatusCode::BAD_GATEWAY,
                "upstream_failed",
                format!("cannot reach {}: {}", target.authority, error_chain(&e)),
            )
            .with_details(json!({"host": target.host, "port": target.port}));
            outcome.code = Some(error.code);
            outcome.reasons = vec![error.message.clone()];
            record(&state, &target, outcome, started);
            return reply(&error);
        }
        Err(_) => {
            let error = ErrorReply::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!(
                    "{} did not answer within {}s",
                    target.authority,
                    wait.as_secs()
                ),
            )
            .with_details(json!({"host": target.host, "port": target.port}));
            outcome.code = Some(error.code);
            outcome.reasons = vec![error.message.clone()];
            record(&state, &target, outcome, started);
            return reply(&error);
        }
    };
    record(&state, &target, outcome, started);

    let (mut parts, body) = response.into_parts();
    if let (Some(key), true) = (&ws_key, parts.status == StatusCode::SWITCHING_PROTOCOLS) {
        let accepted = parts
            .headers
            .get(header::SEC_WEBSOCKET_ACCEPT)
            .is_some_and(|v| v.as_bytes() == websocket_accept(key).as_bytes());
        if !accepted {
            let error = ErrorReply::new(
                StatusCode::BAD_GATEWAY,
                "upstream_failed",
                format!(
                    "{} answered the WebSocket handshake with a wrong Sec-WebSocket-Accept",
                    target.authority
                ),
            );
            return reply(&error);
        }
    }
    if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let mut upstream = Response::from_parts(parts.clone(), ());
            let upstream_upgrade = hyper::upgrade::on(&mut upstream);
            let max = Duration::from_secs(state.config.tunnel_max_secs);
            tokio::spawn(async move {
                let (Ok(client), Ok(server)) = (client_upgrade.await, upstream_upgrade.await)
                else {
                    tracing::debug!("upgrade did not complete on both sides");
                    return;
                };
                let mut client = TokioIo::new(client);
                let mut server = TokioIo::new(server);
                let _ = tokio::time::timeout(
                    max,
                    tokio::io::copy_bidirectional(&mut client, &mut server),
                )
                .await;
            });
            if ws_key.is_some() {
                // h2 accepts an extended CONNECT with 200; the handshake headers are h1's.
                parts.status = StatusCode::OK;
                for name in [
                    header::CONNECTION,
                    header::UPGRADE,
                    header::SEC_WEBSOCKET_ACCEPT,
                ] {
                    parts.headers.remove(name);
                }
            }
            return Response::from_parts(parts, body.boxed());
        }
    }
    strip_hop_by_hop(&mut parts.headers, false);
    scrub_response_headers(&mut parts.headers, &applied.secrets);
    Response::from_parts(parts, body.boxed())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Host and `:authority` must name the CONNECT/URI destination: a request that names another
/// host would reach it on a connection vetted for this one (domain fronting).
fn check_authority(req: &Request<Incoming>, target: &Target) -> Result<(), ErrorReply> {
    let mut seen = false;
    if let Some(authority) = req.uri().authority() {
        seen = true;
        same_destination(authority.as_str(), target)?;
    }
    if let Some(host) = req.headers().get(header::HOST) {
        seen = true;
        let host = host
            .to_str()
            .map_err(|_| misdirected(target, "<non-ascii>"))?;
        same_destination(host, target)?;
    }
    if !seen {
        return Err(ErrorReply::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the request names no host (Host header or :authority)",
        ));
    }
    Ok(())
}

fn same_destination(authority: &str, target: &Target) -> Result<(), ErrorReply> {
    let parsed: http::uri::Authority = authority
        .parse()
        .map_err(|_| misdirected(target, authority))?;
    let host =
        crate::domain::normalize_host(parsed.host().trim_start_matches('[').trim_end_matches(']'));
    if host != target.host {
        return Err(misdirected(target, authority));
    }
    if let Some(port) = parsed.port_u16() {
        if port != target.port {
            return Err(misdirected(target, authority));
        }
    }
    Ok(())
}

fn misdirected(target: &Target, named: &str) -> ErrorReply {
    ErrorReply::new(
        StatusCode::MISDIRECTED_REQUEST,
        "misdirected_request",
        format!(
            "request names {named:?} but the tunnel is to {}",
            target.authority
        ),
    )
    .with_details(json!({"host": target.host, "port": target.port, "named": named}))
}

/// An RFC 8441 extended CONNECT for a WebSocket.
fn is_h2_websocket(req: &Request<Incoming>) -> bool {
    req.version() == Version::HTTP_2
        && req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64.
fn websocket_key() -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; 16];
    crate::tls::ca::rand_bytes(&mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `Sec-WebSocket-Accept` an origin must answer `key` with (RFC 6455 section 4.2.2).
fn websocket_accept(key: &str) -> String {
    use base64::Engine as _;
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.version() == Version::HTTP_11
        && req.method() == Method::GET
        && req.headers().contains_key(header::UPGRADE)
        && req.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.to_ascii_lowercase().contains("upgrade"))
        })
}

/// Removes headers that describe this hop only, plus those the Connection header names.
/// `TE: trailers` survives (gRPC needs it); an upgrade keeps `Connection`/`Upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| !(keep_upgrade && name == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    let te_trailers = headers
        .get(header::TE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    for name in [
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRANSFER_ENCODING,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
    if te_trailers {
        headers.insert(header::TE, http::HeaderValue::from_static("trailers"));
    }
    if !keep_upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    } else {
        headers.insert(
            header::CONNECTION,
            http::HeaderValue::from_static("upgrade"),
        );
    }
}
