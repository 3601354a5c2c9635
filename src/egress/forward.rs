//! One HTTP request from a sandbox, as named phases that run in this order (the way
//! pingora's `ProxyHttp` names the steps of its request path). Each phase either hands the
//! request on or stops it with the answer the sandbox gets; a stop is recorded once.
//!
//! 1. [`admit`] — runs first, before anything is decided: the identity is still live,
//!    `Host`/`:authority` name the tunnel's destination, `TRACE`/`TRACK` are refused. The
//!    path was already put in canonical form ([`super::path`]); everything after sees only
//!    that form, and an h2 WebSocket (extended CONNECT) is seen as the `GET` handshake it
//!    is forwarded as.
//! 2. [`request_policy`] — the `sandgate.egress` layer on this request.
//! 3. [`resolve`] — absolute-form requests only (a tunnel's destination was resolved and
//!    vetted at CONNECT): resolve and vet, and take the pools that dial exactly those
//!    addresses.
//! 4. [`credentials`] — a credentialed destination needs an unambiguous path; placeholders
//!    only in their declared slots; the `sandgate.credential` layer; secrets written into
//!    their slots. Last before anything leaves: the identity and the applied credentials
//!    are checked still live, so nothing is forwarded with a credential once a revocation
//!    has returned.
//! 5. [`upstream_request`] — the upstream request (canonical URI, hop-by-hop headers
//!    removed, trailers guarded), sent over
//!    the vetted pool; the address actually dialed goes into the record.
//! 6. [`response`] — the answer to the sandbox: the WebSocket accept checked, an upgrade
//!    spliced, hop-by-hop headers removed, secrets scrubbed from headers, trailers and (when
//!    a credential asks) text bodies, on every path including 101 and extended CONNECT.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Either};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpInfo;
use tracing::Instrument;

use super::body::{
    full, reply, BoxError, GuardedRequest, ProxyBody, ResignedChunks, ScrubbedResponse,
};
use super::by_address;
use super::decision::{egress_refusal, record, resolve_error, sandbox_inactive, Outcome};
use super::hop::{check_authority, strip_hop_by_hop};
use super::limits::Hold;
use super::path;
use super::state::EgressState;
use super::target::Target;
use super::upstream::UpstreamPair;
use super::websocket;
use crate::credentials::apply::{
    apply, credentialed_destination, Applied, AwsSigning, RequestView,
};
use crate::credentials::scrub::scrub_headers;
use crate::decision_log::SharedObject;
use crate::error::{Blame, Details, Error, Kind};
use crate::policy::input::{
    destination_value, egress_input, request_value, Destination, RequestFacts,
};

/// What every request of a CONNECT tunnel shares once its destination is vetted: the
/// addresses resolved and checked at CONNECT, the destination part of the policy input
/// (built once per tunnel: it was ~5% of the proxy's CPU per request), and the pools that
/// dial exactly those addresses.
pub(crate) struct Vetted {
    pub ips: Arc<[IpAddr]>,
    /// Also rendered for the decision log once per tunnel ([`SharedObject`]).
    pub destination: Arc<SharedObject>,
    pub upstream: Arc<UpstreamPair>,
}

impl Vetted {
    pub fn new(
        state: &EgressState,
        target: &Target,
        scheme: &'static str,
        ips: Arc<[IpAddr]>,
    ) -> Vetted {
        let destination = SharedObject::new(destination_value(&Destination {
            host: &target.host,
            port: target.port,
            ips: &ips,
            scheme,
        }));
        let upstream = state.upstreams.for_addrs(&ips, target.port);
        Vetted {
            ips,
            destination,
            upstream,
        }
    }
}

/// Why a phase ended the request.
pub(crate) enum Stop {
    /// Refused: nothing was forwarded. The reasons go to the decision log.
    Deny(Error, Vec<String>),
    /// Allowed, but the upstream could not be reached or answered wrongly.
    Fail(Error),
}

impl Stop {
    fn deny(error: Error) -> Stop {
        let reasons = error.reasons_or_message();
        Stop::Deny(error, reasons)
    }
}

type Phase<T> = Result<T, Stop>;

/// One request and what the phases learned about it.
struct Ctx {
    state: Arc<EgressState>,
    target: Arc<Target>,
    scheme: &'static str,
    vetted: Option<Arc<Vetted>>,
    started: Instant,
    outcome: Outcome,
    /// The canonical path and query; credentials may add their query parameter.
    path: String,
    ambiguous: Option<&'static str>,
    /// The limits this request counts against; an upgraded stream keeps them.
    hold: Hold,
}

impl Ctx {
    /// Writes the decision record (once: later calls write nothing).
    fn record(&mut self) {
        let mut outcome = std::mem::replace(&mut self.outcome, Outcome::new("", "", "", None));
        if !outcome.phase.is_empty() {
            outcome.destination = self.vetted.as_ref().map(|v| v.destination.clone());
            record(&self.state, &self.target, outcome, self.started);
        }
    }

    fn stop(mut self, stop: Stop) -> Response<ProxyBody> {
        let error = match stop {
            Stop::Deny(error, reasons) => {
                self.outcome.deny(&error, reasons);
                error
            }
            Stop::Fail(error) => {
                self.outcome.fail(&error);
                error
            }
        };
        self.record();
        reply(&error)
    }
}

/// Handles one request. `vetted` is the tunnel's vetted destination; `None` for
/// absolute-form requests, which are resolved here once the policy has allowed them.
pub(crate) async fn handle(
    state: Arc<EgressState>,
    target: Arc<Target>,
    scheme: &'static str,
    vetted: Option<Arc<Vetted>>,
    hold: Hold,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let raw_path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let canonical = path::canonicalize(raw_path);
    let mut outcome = Outcome::new(
        "request",
        protocol_of(req.version(), scheme),
        req.method().as_str(),
        Some(canonical.path_and_query.clone()),
    );
    // A tunnel's vetted address, or an absolute-form IP literal's own.
    outcome.ip = match &vetted {
        Some(v) => Some(v.ips[0]),
        None => by_address::literal(&target.host),
    };
    outcome.generation = state.policy.generation();
    let mut ctx = Ctx {
        state,
        target,
        scheme,
        vetted,
        started: Instant::now(),
        outcome,
        path: canonical.path_and_query,
        ambiguous: canonical.ambiguous,
        hold,
    };
    match run(&mut ctx, req).await {
        Ok(response) => response,
        Err(stop) => ctx.stop(stop),
    }
}

async fn run(ctx: &mut Ctx, mut req: Request<Incoming>) -> Phase<Response<ProxyBody>> {
    admit(ctx, &req)?;
    let destination = request_policy(ctx, &req)
        .instrument(tracing::info_span!("egress.policy"))
        .await?;
    let vetted = resolve(ctx).await?;
    let h2 = websocket::is_h2_websocket(&req);
    // The client side of an upgrade (h1 `Upgrade` or h2 extended CONNECT).
    let upgrade = (h2 || websocket::is_upgrade(&req)).then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    // An h2 WebSocket is the HTTP/1.1 handshake it stands for from here on, so credentials
    // see the method that is forwarded.
    let ws_key = h2.then(|| websocket::to_h1_handshake(&mut parts));
    let applied = credentials(ctx, &mut parts, destination)
        .instrument(tracing::info_span!("egress.credential"))
        .await?;
    let upstream = upstream_request(ctx, parts, body, &vetted, &upgrade, &applied)
        .instrument(tracing::info_span!("egress.upstream"))
        .await?;
    ctx.record();
    response(ctx, upstream, applied, upgrade, ws_key)
}

/// Phase 1.
fn admit(ctx: &Ctx, req: &Request<Incoming>) -> Phase<()> {
    if ctx.target.identity.is_revoked() {
        return Err(Stop::deny(sandbox_inactive(&ctx.target.identity.id)));
    }
    check_authority(req, &ctx.target).map_err(Stop::deny)?;
    let method = req.method().as_str();
    if method.eq_ignore_ascii_case("TRACE") || method.eq_ignore_ascii_case("TRACK") {
        return Err(Stop::deny(Error::new(
            Kind::MethodNotAllowed,
            "method_not_allowed",
            format!("{method} is refused: it reflects request headers back"),
        )));
    }
    Ok(())
}

/// Phase 2. Returns the destination part of the input, which credential decisions reuse.
/// An absolute-form request to a name is decided on the name alone, unless the sandbox may
/// reach addresses (`network.cidrs`): then a name refused for want of an allow is resolved
/// (phase 3 early) and decided again with its addresses (see `by_address`).
async fn request_policy(ctx: &mut Ctx, req: &Request<Incoming>) -> Phase<regorus::Value> {
    let literal = match &ctx.vetted {
        Some(_) => None,
        None => by_address::literal(&ctx.target.host),
    };
    let destination = destination_so_far(ctx, literal);
    let mut decision = evaluate_request(ctx, req, destination.clone());
    let destination = if ctx.vetted.is_none()
        && by_address::ask_again_with_addresses(&ctx.target.identity, literal, &decision)
    {
        let vetted = resolve(ctx).await?;
        decision = evaluate_request(ctx, req, vetted.destination.value().clone());
        vetted.destination.value().clone()
    } else {
        destination
    };
    ctx.outcome.generation = decision.generation;
    ctx.outcome.policy = decision.logged.clone();
    if !decision.allowed {
        let error = egress_refusal(&ctx.target, &decision);
        return Err(Stop::Deny(error, decision.reasons));
    }
    Ok(destination)
}

/// The destination part of the input with what is known before resolving: a tunnel's
/// vetted addresses, an IP literal's own, or none.
fn destination_so_far(ctx: &Ctx, literal: Option<IpAddr>) -> regorus::Value {
    match &ctx.vetted {
        Some(v) => v.destination.value().clone(),
        None => {
            let ips: Vec<IpAddr> = literal.into_iter().collect();
            destination_value(&Destination {
                host: &ctx.target.host,
                port: ctx.target.port,
                ips: &ips,
                scheme: ctx.scheme,
            })
        }
    }
}

fn evaluate_request(
    ctx: &Ctx,
    req: &Request<Incoming>,
    destination: regorus::Value,
) -> crate::policy::Decision {
    let input = egress_input(
        "request",
        ctx.target.sandbox.value().clone(),
        destination,
        Some(request_value(&RequestFacts {
            method: websocket::forwarded_method(req),
            path: &ctx.path,
            headers: req.headers(),
        })),
    );
    ctx.state.policy.decide(crate::policy::Layer::Egress, input)
}

/// Phase 3.
async fn resolve(ctx: &mut Ctx) -> Phase<Arc<Vetted>> {
    if let Some(vetted) = &ctx.vetted {
        return Ok(vetted.clone());
    }
    let target = &ctx.target;
    let ips = match ctx.state.resolver.resolve(&target.host, target.port).await {
        Ok(ips) => ips,
        Err(e) => {
            if let crate::net::ResolveError::Forbidden { ip, .. } = &e {
                ctx.outcome.ip = Some(*ip);
            }
            return Err(Stop::Deny(resolve_error(target, &e), vec![e.to_string()]));
        }
    };
    let vetted = Arc::new(Vetted::new(&ctx.state, target, ctx.scheme, ips));
    ctx.outcome.ip = Some(vetted.ips[0]);
    // Kept, so phase 3 proper does not resolve again.
    ctx.vetted = Some(vetted.clone());
    Ok(vetted)
}

/// Phase 4.
async fn credentials(
    ctx: &mut Ctx,
    parts: &mut http::request::Parts,
    destination: regorus::Value,
) -> Phase<Applied> {
    let state = &ctx.state;
    let identity = &ctx.target.identity;
    let view = RequestView {
        host: &ctx.target.host,
        port: ctx.target.port,
        scheme: ctx.scheme,
        method: parts.method.as_str(),
        destination,
        sandbox: ctx.target.sandbox.value().clone(),
    };
    if let Some(why) = ctx.ambiguous {
        if credentialed_destination(&state.credentials, identity, &view) {
            return Err(Stop::deny(ambiguous_path(&ctx.target, why)));
        }
    }
    let applied = apply(
        &state.credentials,
        &state.policy,
        identity,
        &view,
        &mut parts.headers,
        &mut ctx.path,
    )
    .await;
    let names = applied.as_ref().map(|a| &a.names[..]).unwrap_or_default();
    let path = ctx.path.split('?').next().unwrap_or_default();
    ctx.outcome.credential_notes = crate::credentials::notes::not_applied(
        &state.credentials,
        identity,
        &view,
        path,
        names,
        applied.as_ref().err(),
    );
    let applied = applied.map_err(Stop::deny)?;
    ctx.outcome.credentials = applied.names.clone();
    ctx.outcome.credential_types = applied.types();
    if identity.is_revoked() {
        return Err(Stop::deny(sandbox_inactive(&identity.id)));
    }
    if applied.retired() {
        return Err(Stop::deny(Error::new(
            Kind::Unavailable,
            "credential_changed",
            "a credential this request needs was deleted or replaced while it was being applied; retry",
        )));
    }
    Ok(applied)
}

fn ambiguous_path(target: &Target, why: &str) -> Error {
    let reason = format!(
        "the path contains {why}, which origins read differently; a credential may be attached to requests for {}, so the path must be unambiguous",
        target.authority
    );
    Error::new(Kind::Invalid, "path_not_canonical", reason.clone())
        .blame(Blame::Sandbox)
        .with_details(Details::destination(&target.host, target.port).with_reasons(vec![reason]))
}

/// Phase 5.
async fn upstream_request(
    ctx: &mut Ctx,
    mut parts: http::request::Parts,
    body: Incoming,
    vetted: &Vetted,
    upgrade: &Option<hyper::upgrade::OnUpgrade>,
    applied: &Applied,
) -> Phase<Response<Incoming>> {
    let target = ctx.target.clone();
    parts.uri = target.upstream_uri(ctx.scheme, &ctx.path).ok_or_else(|| {
        Stop::deny(Error::new(
            Kind::Invalid,
            "bad_request",
            "malformed request target",
        ))
    })?;
    let websocket = upgrade.is_some();
    strip_hop_by_hop(&mut parts.headers, websocket);
    // The client sets Host (h1) or :authority (h2) from the URI, which is the vetted target
    // (and what an AWS signature covers: `sign_headers`).
    parts.headers.remove(header::HOST);
    let body = match &applied.aws {
        Some(signing) => sign_aws(ctx, &mut parts, body, signing).await?,
        None => Either::Left(body),
    };
    parts.version = Version::HTTP_11;
    if applied.scrub_body {
        // A compressed body could not be scrubbed.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    let body = GuardedRequest::new(body, trailer_refusal(ctx, parts.method.as_str())).boxed();
    let client = if websocket {
        &vetted.upstream.h1
    } else {
        &vetted.upstream.any
    };
    let wait = Duration::from_secs(ctx.state.config.idle_timeout_secs);
    let response =
        match tokio::time::timeout(wait, client.request(Request::from_parts(parts, body))).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                return Err(Stop::Fail(
                    Error::new(
                        Kind::Upstream,
                        "upstream_failed",
                        format!(
                            "cannot reach {}: {}",
                            target.authority,
                            crate::error::chain(&e)
                        ),
                    )
                    .destination(&target.host, target.port),
                ))
            }
            Err(_) => {
                return Err(Stop::Fail(
                    Error::new(
                        Kind::UpstreamTimeout,
                        "upstream_timeout",
                        format!(
                            "{} did not answer within {}s",
                            target.authority,
                            wait.as_secs()
                        ),
                    )
                    .destination(&target.host, target.port),
                ))
            }
        };
    if let Some(info) = response.extensions().get::<HttpInfo>() {
        ctx.outcome.ip = Some(info.remote_addr().ip());
    }
    Ok(response)
}

/// The largest body hashed for an AWS signature that covers it (services other than S3
/// sign the body itself); a larger one is refused rather than held in memory.
const MAX_SIGNED_BODY: usize = 16 * 1024 * 1024;

/// Phase 5, for a request an AWS credential applies to: signs it again with the real key
/// for the URI and headers it is forwarded with. When the signature must cover the body,
/// the body (at most [`MAX_SIGNED_BODY`]) is read and hashed first.
async fn sign_aws(
    ctx: &Ctx,
    parts: &mut http::request::Parts,
    body: Incoming,
    signing: &AwsSigning,
) -> Phase<Either<Incoming, ProxyBody>> {
    if signing.needs_body_hash() {
        let (bytes, hash) = hash_body(ctx, body).await?;
        sign_headers(ctx, parts, signing, Some(&hash))?;
        return Ok(Either::Right(full(bytes)));
    }
    Ok(match sign_headers(ctx, parts, signing, None)? {
        // A signed streaming upload: each chunk is signed again as it passes.
        Some(resigner) => Either::Right(ResignedChunks::new(body, resigner).boxed()),
        None => Either::Left(body),
    })
}

/// The whole body (at most [`MAX_SIGNED_BODY`]) and its SHA-256, hex.
async fn hash_body(ctx: &Ctx, body: Incoming) -> Phase<(Bytes, String)> {
    let collected = http_body_util::Limited::new(body, MAX_SIGNED_BODY)
        .collect()
        .await
        .map_err(|e| Stop::deny(signed_body_error(&ctx.target, e)))?;
    if collected
        .trailers()
        .is_some_and(crate::credentials::apply::trailers_mention_placeholder)
    {
        return Err(Stop::deny(Error::new(
            Kind::Forbidden,
            "credential_destination_mismatch",
            "the request's trailers carry a credential placeholder; it was not forwarded",
        )));
    }
    let bytes = collected.to_bytes();
    let hash = hex::encode(ring::digest::digest(&ring::digest::SHA256, &bytes));
    Ok((bytes, hash))
}

fn sign_headers(
    ctx: &Ctx,
    parts: &mut http::request::Parts,
    signing: &AwsSigning,
    body_sha256: Option<&str>,
) -> Phase<Option<crate::credentials::aws_chunked::ChunkResigner>> {
    // The Host the client will send for this URI: the port only when it is not 443.
    let host_header = match ctx.target.port {
        443 => ctx.target.authority.trim_end_matches(":443").to_string(),
        _ => ctx.target.authority.clone(),
    };
    let uri = parts.uri.to_string();
    signing
        .sign(
            &parts.method,
            &mut parts.headers,
            &uri,
            &host_header,
            body_sha256,
        )
        .map_err(Stop::deny)
}

fn signed_body_error(target: &Target, e: BoxError) -> Error {
    let too_large = e.is::<http_body_util::LengthLimitError>();
    let (kind, code, message) = match too_large {
        true => (
            Kind::TooLarge,
            "aws_body_too_large",
            format!(
                "the body is larger than {MAX_SIGNED_BODY} bytes: an AWS signature that covers the body is computed over the whole of it; use a payload the service accepts unsigned (S3: UNSIGNED-PAYLOAD)"
            ),
        ),
        false => (
            Kind::Invalid,
            "bad_request",
            format!("the request body could not be read: {e}"),
        ),
    };
    Error::new(kind, code, message)
        .blame(Blame::Sandbox)
        .destination(&target.host, target.port)
}

/// What a request whose trailers carry a placeholder leaves in the decision log.
fn trailer_refusal(ctx: &Ctx, method: &str) -> super::body::OnRefusal {
    let state = ctx.state.clone();
    let target = ctx.target.clone();
    let protocol = ctx.outcome.protocol;
    let method = method.to_string();
    let path = ctx.outcome.path.clone();
    let started = ctx.started;
    Box::new(move || {
        let reason = "a request trailer carries a credential placeholder; the request was aborted before the trailer was forwarded";
        let mut outcome = Outcome::new("trailers", protocol, &method, path);
        outcome.generation = state.policy.generation();
        outcome.decision = "deny";
        outcome.code = Some("credential_destination_mismatch");
        outcome.reasons = vec![reason.into()];
        record(&state, &target, outcome, started);
    })
}

/// Phase 6.
fn response(
    ctx: &Ctx,
    mut upstream: Response<Incoming>,
    applied: Applied,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
    ws_key: Option<String>,
) -> Phase<Response<ProxyBody>> {
    let switching = upstream.status() == StatusCode::SWITCHING_PROTOCOLS;
    if let (Some(key), true) = (&ws_key, switching) {
        if !websocket::accepted(upstream.headers(), key) {
            return Err(Stop::Fail(Error::new(
                Kind::Upstream,
                "upstream_failed",
                format!(
                    "{} answered the WebSocket handshake with a wrong Sec-WebSocket-Accept",
                    ctx.target.authority
                ),
            )));
        }
    }
    if let (Some(client), true) = (upgrade, switching) {
        let server = hyper::upgrade::on(&mut upstream);
        let max = Duration::from_secs(ctx.state.config.tunnel_max_secs);
        websocket::splice(
            client,
            server,
            max,
            ctx.target.identity.revocation(),
            ctx.hold.clone(),
        );
        let (mut parts, body) = upstream.into_parts();
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
        scrub_headers(&mut parts.headers, &applied.scrubbers);
        return Ok(Response::from_parts(parts, boxed(body)));
    }
    let (mut parts, body) = upstream.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    if applied.scrubbers.is_empty() {
        return Ok(Response::from_parts(parts, boxed(body)));
    }
    scrub_headers(&mut parts.headers, &applied.scrubbers);
    let scrub_data = applied.scrub_body && is_text(&parts.headers);
    if scrub_data {
        if is_encoded(&parts.headers) {
            return Err(Stop::Fail(unscrubbable(&ctx.target)));
        }
        // Replacements change the length.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let body = ScrubbedResponse::new(body, applied.scrubbers, scrub_data);
    Ok(Response::from_parts(parts, body.boxed()))
}

fn boxed(body: Incoming) -> ProxyBody {
    body.map_err(|e| Box::new(e) as BoxError).boxed()
}

fn unscrubbable(target: &Target) -> Error {
    Error::new(
        Kind::Upstream,
        "response_unscrubbable",
        format!(
            "{} answered with a compressed text body although sandgate asked for none; a credential with scrub_response_body cannot let it through unscrubbed",
            target.authority
        ),
    )
    .destination(&target.host, target.port)
}

/// Text content types, whose bodies `scrub_response_body` applies to (no type: text).
fn is_text(headers: &http::HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return true;
    };
    let mime = String::from_utf8_lossy(value.as_bytes())
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime.starts_with("text/")
        || mime.ends_with("+json")
        || mime.ends_with("+xml")
        || matches!(
            mime.as_str(),
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-www-form-urlencoded"
                | "application/x-ndjson"
        )
}

fn is_encoded(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}

fn protocol_of(version: Version, scheme: &str) -> &'static str {
    match (scheme, version) {
        ("https", Version::HTTP_2) => "https/h2",
        ("https", _) => "https/h1",
        (_, Version::HTTP_2) => "http/h2",
        _ => "http/h1",
    }
}
