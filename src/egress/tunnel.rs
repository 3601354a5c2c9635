//! Inside a CONNECT tunnel: pass it opaquely (only when policy said `tunnel`), or sniff the
//! first bytes and terminate TLS / serve plain HTTP so every request is checked.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tracing::Instrument;

use super::decision::{record, Outcome};
use super::forward::{self, Vetted};
use super::io::PrefixedIo;
use super::limits::Hold;
use super::state::{next_request_id, EgressState};
use super::target::Target;
use super::{park, park_h2};
use crate::error::{Error, Kind};

/// Runs a tunnel until it ends, reaches `tunnel_max_secs`, or its identity is revoked:
/// revocation drops the tunnel's connection at once, whatever it is doing.
///
/// Memory: a tunnel's task is as large as its largest state, held for the tunnel's whole
/// life, and an idle tunnel is mostly that task and its TLS session. So each stage is a
/// boxed future of its own, and the stages that end (sniffing, the TLS handshake) return
/// what they made instead of awaiting the next stage inside themselves: while a tunnel
/// serves, only this frame and the serving stage's are alive (the three nested frames of
/// sniff, handshake and serve were 19 KiB per tunnel).
pub(crate) async fn run(
    state: Arc<EgressState>,
    target: Arc<Target>,
    ips: Arc<[IpAddr]>,
    action: String,
    hold: Hold,
    upgraded: Upgraded,
) {
    let _active = crate::telemetry::ActiveGauge::new("sandgate_proxy_tunnels_active");
    let max = Duration::from_secs(state.config.tunnel_max_secs);
    let revoked = target.identity.revocation();
    let io = TokioIo::new(upgraded);
    let work: Pin<Box<dyn Future<Output = ()> + Send>> = if action == "tunnel" {
        Box::pin(opaque(state.clone(), target.clone(), ips, io))
    } else {
        Box::pin(inspect(state.clone(), target.clone(), ips, hold, io))
    };
    tokio::select! {
        result = tokio::time::timeout(max, work) => {
            if result.is_err() {
                tracing::debug!(host = %target.host, "tunnel reached its maximum lifetime");
            }
        }
        () = revoked.cancelled() => {
            metrics::counter!("sandgate_proxy_tunnels_revoked_total").increment(1);
            tracing::debug!(host = %target.host, "tunnel ended: its identity was revoked");
        }
    }
}

async fn opaque(
    state: Arc<EgressState>,
    target: Arc<Target>,
    ips: Arc<[IpAddr]>,
    mut io: TokioIo<Upgraded>,
) {
    let connect_timeout = Duration::from_secs(state.config.connect_timeout_secs);
    for ip in ips.iter() {
        let addr = SocketAddr::new(*ip, target.port);
        match tokio::time::timeout(connect_timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(mut upstream)) => {
                let _ = upstream.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut io, &mut upstream).await;
                return;
            }
            _ => continue,
        }
    }
    tracing::debug!(host = %target.host, "opaque tunnel: no address accepted the connection");
}

/// What a tunnel's first bytes say it carries.
enum Carries {
    Tls,
    /// Plain HTTP; h2 when it starts with the h2 prior-knowledge preface.
    Http {
        h2: bool,
    },
    Other,
}

async fn inspect(
    state: Arc<EgressState>,
    target: Arc<Target>,
    ips: Arc<[IpAddr]>,
    hold: Hold,
    io: TokioIo<Upgraded>,
) {
    let started = Instant::now();
    let wait = Duration::from_secs(state.config.header_read_timeout_secs);
    let Some((carries, io)) = Box::pin(sniff(io, wait)).await else {
        return;
    };
    match carries {
        Carries::Tls => {
            let accepted = Box::pin(accept_tls(&state, &target, io, wait, started)).await;
            let Some((tls, h2)) = accepted else { return };
            Box::pin(serve_http(state, target, ips, hold, tls, "https", h2)).await;
        }
        // The protocol is told from the bytes already read, not by waiting for 24 of them
        // (hyper's detection has no timeout of its own).
        Carries::Http { h2 } => {
            Box::pin(serve_http(state, target, ips, hold, io, "http", h2)).await;
        }
        Carries::Other => {
            let error = Error::new(
                Kind::Forbidden,
                "tunnel_refused",
                "the tunnel carries neither TLS nor HTTP; only a policy `tunnel` action lets it through",
            );
            let mut outcome = Outcome::new("tunnel", "tcp", "CONNECT", None);
            outcome.ip = Some(ips[0]);
            outcome.generation = state.policy.generation();
            outcome.deny(&error, vec![error.message.clone()]);
            record(&state, &target, outcome, started);
        }
    }
}

/// Reads the tunnel's first bytes (within `wait`) and hands them back in front of the rest.
async fn sniff(
    mut io: TokioIo<Upgraded>,
    wait: Duration,
) -> Option<(Carries, PrefixedIo<TokioIo<Upgraded>>)> {
    let mut first = vec![0u8; 4096];
    let n = match tokio::time::timeout(wait, io.read(&mut first)).await {
        Ok(Ok(n)) if n > 0 => n,
        _ => return None,
    };
    first.truncate(n);
    let carries = if first[0] == 0x16 {
        Carries::Tls
    } else if first[0].is_ascii_uppercase() {
        Carries::Http {
            h2: first.starts_with(b"PRI "),
        }
    } else {
        Carries::Other
    };
    Some((carries, PrefixedIo::new(Bytes::from(first), io)))
}

/// The TLS handshake with the sandbox, on a leaf for the CONNECT host: the session (boxed:
/// it lives as long as the tunnel) and whether it negotiated h2. `None` when the handshake
/// failed, timed out, or named another server (recorded as `misdirected_request`).
async fn accept_tls<T>(
    state: &EgressState,
    target: &Target,
    io: T,
    wait: Duration,
    started: Instant,
) -> Option<(Box<tokio_rustls::server::TlsStream<T>>, bool)>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = match tokio::time::timeout(wait, acceptor).await {
        Ok(Ok(start)) => start,
        _ => return None,
    };
    let config = server_config_for(state, target, start.client_hello().server_name(), started)?;
    let tls = match tokio::time::timeout(wait, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(host = %target.host, error = %e, "TLS handshake with the sandbox failed");
            return None;
        }
        Err(_) => return None,
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    Some((Box::new(tls), h2))
}

/// The server configuration for a handshake whose ClientHello named `sni`: the shared one
/// when it names the CONNECT host, a fixed leaf for the CONNECT authority when it names
/// nothing (IP-literal destinations), and `None` (recorded) when it names another host.
fn server_config_for(
    state: &EgressState,
    target: &Target,
    sni: Option<&str>,
    started: Instant,
) -> Option<Arc<rustls::ServerConfig>> {
    match sni.map(crate::domain::normalize_host) {
        Some(name) if name == target.host => Some(state.tls_server.clone()),
        Some(name) => {
            let error = Error::new(
                Kind::Misdirected,
                "misdirected_request",
                format!(
                    "TLS server name {name:?} does not match the CONNECT host {:?}",
                    target.host
                ),
            );
            let mut outcome = Outcome::new("tls", "tls", "CONNECT", None);
            outcome.generation = state.policy.generation();
            outcome.deny(&error, vec![error.message.clone()]);
            record(state, target, outcome, started);
            None
        }
        None => state
            .minter
            .leaf_for(&target.host)
            .ok()
            .and_then(|key| crate::tls::fixed_server_config(key).ok()),
    }
}

/// Serves requests on a terminated tunnel: h2 when `h2` (what TLS negotiated, or a plain
/// h2 prior-knowledge preface), else HTTP/1.1; both in bursts ([`park`], [`park_h2`]: an
/// idle tunnel holds no HTTP state).
async fn serve_http<T>(
    state: Arc<EgressState>,
    target: Arc<Target>,
    ips: Arc<[IpAddr]>,
    hold: Hold,
    io: T,
    scheme: &'static str,
    h2: bool,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let vetted = Arc::new(Vetted::new(&state, &target, scheme, ips));
    let header_read = Duration::from_secs(state.config.header_read_timeout_secs);
    let idle = Duration::from_secs(state.config.idle_timeout_secs);
    let max_header_bytes = state.config.max_header_bytes;
    let handle = move |req| {
        let state = state.clone();
        let target = target.clone();
        let vetted = vetted.clone();
        let hold = hold.clone();
        // Each request inside the tunnel gets its own id, nested under the tunnel's span.
        let span = tracing::info_span!("egress.request", request_id = %next_request_id());
        forward::handle(state, target, scheme, Some(vetted), hold, req).instrument(span)
    };
    if !h2 {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_read)
            .max_buf_size(max_header_bytes.max(8192));
        return park::serve(io, builder, idle, handle).await;
    }
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(max_header_bytes as u32)
        .max_concurrent_streams(256)
        .initial_connection_window_size(park_h2::CONN_WINDOW)
        // The client indexes no header, so an idle connection can be taken apart and built
        // again without the client's HPACK table (`park_h2`).
        .header_table_size(0)
        // RFC 8441: WebSockets over h2 streams (translated to HTTP/1.1 upstream).
        .enable_connect_protocol();
    let service = hyper::service::service_fn(move |req| {
        let answer = handle(req);
        async move { Ok::<_, std::convert::Infallible>(answer.await) }
    });
    park_h2::serve(io, builder, idle, service).await;
}
