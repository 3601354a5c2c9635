//! Refusals a client can read: a CONNECT to a destination the egress policy refused is
//! accepted (`200`) and every request inside the tunnel is answered with the refusal, so
//! curl, Python requests, git and agent frameworks (which all drop a CONNECT's 403 body)
//! show why.
//!
//! Contract:
//! - The refused name is never resolved and nothing is dialed: the tunnel ends here.
//! - The first bytes decide: a TLS ClientHello is terminated with a leaf for the CONNECT
//!   host, offering ALPN `h2` and `http/1.1` (a client that insists on h2 would otherwise
//!   fail the handshake and show no reason at all); an HTTP/1 request line is served as is;
//!   anything else (h2 without TLS included) closes the tunnel. A ClientHello naming
//!   another server closes it too (no leaf is minted for that name).
//! - Every request gets `403` with the proxy's error body (`egress_denied`, message,
//!   `details.{host, port, layer, reasons, decision_id, reason}`), `X-Sandgate-Error`, and
//!   the one-line `details.reason` as the HTTP/1 reason phrase (Python's `HTTPError` text).
//!   A git client (`User-Agent: git/…`) gets the same JSON as `text/plain`, the only type
//!   git prints (`remote: …`). On h2 streams the answer is the same minus the reason
//!   phrase, which HTTP/2 does not have.
//! - A tunnel answers at most [`MAX_REQUESTS`] requests (on h2: the request that reaches
//!   it starts a GOAWAY, and at most [`MAX_REQUESTS`] streams are open at once, so a
//!   connection answers fewer than twice that) and lives at most [`MAX_LIFE`]
//!   (or `[proxy] idle_timeout_secs` when shorter); it ends when its identity is revoked.
//! - Minting is bounded: a name without a cached leaf costs one of the identity's
//!   `[proxy] deny_leaves_per_minute`; with none left the CONNECT gets the plain 403.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;

use super::body::{full, reply, ProxyBody};
use super::config::DenyMode;
use super::io::PrefixedIo;
use super::limits::Hold;
use super::state::EgressState;
use super::target::Target;
use crate::error::Error;
use crate::identity::TunnelSlot;
use crate::policy::Decision;

/// Requests one refusal tunnel answers before it closes.
pub const MAX_REQUESTS: usize = 16;
/// The longest a refusal tunnel stays open.
pub const MAX_LIFE: Duration = Duration::from_secs(30);
/// Longest reason phrase sent; the full reason is in the body.
const MAX_PHRASE: usize = 300;

/// Per-identity budget of leaves minted for refused names, in one-minute windows; bounded
/// in entries (identities beyond it start a fresh window, which errs towards refusing
/// nothing more than the budget per window).
pub(crate) struct DenyLeaves {
    per_minute: u32,
    windows: quick_cache::sync::Cache<String, Arc<Mutex<Window>>>,
}

struct Window {
    start: Instant,
    used: u32,
}

impl DenyLeaves {
    pub fn new(per_minute: u32) -> DenyLeaves {
        DenyLeaves {
            per_minute,
            windows: quick_cache::sync::Cache::new(4096),
        }
    }

    /// Takes one leaf from `identity`'s budget for this minute; false when none is left.
    pub fn take(&self, identity: &str) -> bool {
        let window = self
            .windows
            .get_or_insert_with(identity, || {
                Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(Window {
                    start: Instant::now(),
                    used: 0,
                })))
            })
            .unwrap_or_else(|never| match never {});
        let mut window = window.lock().unwrap_or_else(PoisonError::into_inner);
        if window.start.elapsed() >= Duration::from_secs(60) {
            *window = Window {
                start: Instant::now(),
                used: 0,
            };
        }
        if window.used >= self.per_minute {
            return false;
        }
        window.used += 1;
        true
    }
}

/// Why a refusal is answered on the CONNECT instead of inside the tunnel.
#[derive(Debug)]
pub(crate) enum NotInTunnel {
    /// `deny_mode = "connect"` (config or policy): nothing to add to the record.
    Chosen,
    /// A reason the record carries.
    Because(String),
}

/// The mode for a refused CONNECT: the decision's `deny_mode`, else `[proxy] deny_mode`.
pub(crate) fn mode(state: &EgressState, decision: &Decision) -> DenyMode {
    decision
        .deny_mode
        .as_deref()
        .and_then(DenyMode::parse)
        .unwrap_or(state.config.deny_mode)
}

/// Whether this refusal may be answered inside the tunnel, and the tunnel slot it holds.
pub(crate) fn admit(
    state: &EgressState,
    target: &Target,
    decision: &Decision,
) -> Result<TunnelSlot, NotInTunnel> {
    if mode(state, decision) == DenyMode::Connect {
        return Err(NotInTunnel::Chosen);
    }
    if !state.minter.is_cached(&target.host) && !state.deny_leaves.take(&target.identity.id) {
        metrics::counter!("sandgate_proxy_deny_tunnels_total", "outcome" => "budget").increment(1);
        return Err(NotInTunnel::Because(format!(
            "answered on the CONNECT: this sandbox used its {} leaves per minute for refused names ([proxy] deny_leaves_per_minute)",
            state.config.deny_leaves_per_minute
        )));
    }
    let max = state.config.tunnels_per_identity();
    let slot = target.identity.open_tunnel(max).ok_or_else(|| {
        NotInTunnel::Because(format!(
            "answered on the CONNECT: the sandbox holds {max} open tunnels"
        ))
    })?;
    metrics::counter!("sandgate_proxy_deny_tunnels_total", "outcome" => "in_tunnel").increment(1);
    Ok(slot)
}

/// Serves a refusal tunnel until it ends (see the module's contract).
pub(crate) async fn run(
    state: Arc<EgressState>,
    target: Arc<Target>,
    error: Arc<Error>,
    hold: Hold,
    upgraded: Upgraded,
) {
    let life = MAX_LIFE.min(Duration::from_secs(state.config.idle_timeout_secs.max(1)));
    let revoked = target.identity.revocation();
    let work = Box::pin(serve(state, target.clone(), error, TokioIo::new(upgraded)));
    tokio::select! {
        _ = tokio::time::timeout(life, work) => {}
        () = revoked.cancelled() => {}
    }
    drop(hold);
}

async fn serve(
    state: Arc<EgressState>,
    target: Arc<Target>,
    error: Arc<Error>,
    mut io: TokioIo<Upgraded>,
) {
    let wait = Duration::from_secs(state.config.header_read_timeout_secs);
    let mut first = vec![0u8; 2048];
    let n = match tokio::time::timeout(wait, io.read(&mut first)).await {
        Ok(Ok(n)) if n > 0 => n,
        _ => return,
    };
    first.truncate(n);
    let tls = first[0] == 0x16;
    let http = first[0].is_ascii_uppercase() && !first.starts_with(b"PRI ");
    let io = PrefixedIo::new(Bytes::from(first), io);
    if tls {
        let Some(tls) = handshake(&state, &target, io, wait).await else {
            return;
        };
        match tls.get_ref().1.alpn_protocol() == Some(b"h2") {
            true => answer_h2(&state, error, tls).await,
            false => answer(&state, error, tls).await,
        }
    } else if http {
        answer(&state, error, io).await;
    }
}

/// TLS with the sandbox on a leaf for the CONNECT host; `None` when the ClientHello names
/// another server, or the handshake fails or times out.
async fn handshake<T>(
    state: &EgressState,
    target: &Target,
    io: T,
    wait: Duration,
) -> Option<tokio_rustls::server::TlsStream<T>>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = tokio::time::timeout(wait, acceptor).await.ok()?.ok()?;
    let sni = start
        .client_hello()
        .server_name()
        .map(crate::domain::normalize_host);
    if sni.is_some_and(|name| name != target.host) {
        tracing::debug!(host = %target.host, "refusal tunnel: TLS names another server");
        return None;
    }
    let key = state.minter.leaf_for(&target.host).ok()?;
    let config = server_config(key)?;
    tokio::time::timeout(wait, start.into_stream(config))
        .await
        .ok()?
        .ok()
}

fn server_config(key: Arc<rustls::sign::CertifiedKey>) -> Option<Arc<rustls::ServerConfig>> {
    let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .ok()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(crate::tls::FixedResolver(key)));
    // Server preference: h2 for a client offering both, which is what it would get from
    // the real server too.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Some(Arc::new(config))
}

/// HTTP/1.1 on the tunnel, every request answered with the refusal.
async fn answer<T>(state: &EgressState, error: Arc<Error>, io: T)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = Arc::new(AtomicUsize::new(0));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let n = served.fetch_add(1, Ordering::Relaxed) + 1;
        let response = refusal(&error, &req, n >= MAX_REQUESTS);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(state.config.header_read_timeout_secs))
        .max_buf_size(state.config.max_header_bytes.max(8192));
    let _ = builder.serve_connection(TokioIo::new(io), service).await;
}

/// HTTP/2 on the tunnel, every stream answered with the refusal; the request that reaches
/// [`MAX_REQUESTS`] starts a graceful close (GOAWAY: open streams are still answered).
async fn answer_h2<T>(state: &EgressState, error: Arc<Error>, io: T)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = Arc::new(AtomicUsize::new(0));
    let full = Arc::new(tokio::sync::Notify::new());
    let reached = full.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        if served.fetch_add(1, Ordering::Relaxed) + 1 == MAX_REQUESTS {
            reached.notify_one();
        }
        // HTTP/2 has no `Connection: close`: the GOAWAY ends the connection instead.
        let response = refusal(&error, &req, false);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(state.config.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(MAX_REQUESTS as u32);
    // Boxed, so the h2 connection's state is not inline in the tunnel's task.
    let mut conn = Box::pin(builder.serve_connection(TokioIo::new(io), service));
    tokio::select! {
        _ = conn.as_mut() => return,
        () = full.notified() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// The 403 for one request inside a refusal tunnel; `last` closes the connection after it.
pub(crate) fn refusal<B>(error: &Error, req: &Request<B>, last: bool) -> Response<ProxyBody> {
    let mut response = reply(error);
    if let Some(phrase) = error.details.reason.as_deref().and_then(reason_phrase) {
        response.extensions_mut().insert(phrase);
    }
    let git = req
        .headers()
        .get(header::USER_AGENT)
        .is_some_and(|ua| ua.as_bytes().starts_with(b"git/"));
    let headers = response.headers_mut();
    if git {
        // git prints a refused request's body only when it is text/plain.
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    if last {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// `reason` as an HTTP/1 reason phrase: visible ASCII and spaces only, at most
/// [`MAX_PHRASE`] bytes.
fn reason_phrase(reason: &str) -> Option<hyper::ext::ReasonPhrase> {
    let mut phrase: String = reason
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .collect();
    phrase.truncate(MAX_PHRASE);
    hyper::ext::ReasonPhrase::try_from(Bytes::from(phrase)).ok()
}

/// An empty `200` for the CONNECT that opens a refusal tunnel.
pub(crate) fn established() -> Response<ProxyBody> {
    Response::new(full(Bytes::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_per_identity_and_per_minute() {
        let leaves = DenyLeaves::new(2);
        assert!(leaves.take("a") && leaves.take("a"));
        assert!(!leaves.take("a"), "a third leaf in the minute");
        assert!(leaves.take("b"), "another identity has its own budget");
        leaves.windows.get("a").unwrap().lock().unwrap().start -= Duration::from_secs(61);
        assert!(leaves.take("a"), "a new minute, a new budget");
    }

    #[test]
    fn a_reason_phrase_is_one_line_of_visible_ascii() {
        let phrase = reason_phrase("no\r\nInjected: 1 \u{e9}").unwrap();
        assert_eq!(phrase.as_bytes(), b"no  Injected: 1  ");
        let long = "x".repeat(MAX_PHRASE * 2);
        assert_eq!(reason_phrase(&long).unwrap().as_bytes().len(), MAX_PHRASE);
    }
}
