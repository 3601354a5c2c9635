//! Inside a CONNECT tunnel: pass it opaquely (only when policy said `tunnel`), or sniff the
//! first bytes and terminate TLS / serve plain HTTP so every request is checked.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tracing::Instrument;

use super::decision::{record, Outcome};
use super::forward::{self, Vetted};
use super::io::PrefixedIo;
use super::limits::Hold;
use super::state::{next_request_id, EgressState};
use super::target::Target;
use crate::error::{Error, Kind};

/// Runs a tunnel until it ends, reaches `tunnel_max_secs`, or its identity is revoked:
/// revocation drops the tunnel's connection at once, whatever it is doing.
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
    let work = tokio::time::timeout(max, async {
        if action == "tunnel" {
            opaque(&state, &target, &ips, io).await
        } else {
            inspect(state.clone(), target.clone(), ips, hold, io).await
        }
    });
    tokio::select! {
        result = work => {
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

async fn opaque(state: &EgressState, target: &Target, ips: &[IpAddr], mut io: TokioIo<Upgraded>) {
    let connect_timeout = Duration::from_secs(state.config.connect_timeout_secs);
    for ip in ips {
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

async fn inspect(
    state: Arc<EgressState>,
    target: Arc<Target>,
    ips: Arc<[IpAddr]>,
    hold: Hold,
    mut io: TokioIo<Upgraded>,
) {
    let started = Instant::now();
    let mut first = vec![0u8; 4096];
    let wait = Duration::from_secs(state.config.header_read_timeout_secs);
    let n = match tokio::time::timeout(wait, io.read(&mut first)).await {
        Ok(Ok(n)) if n > 0 => n,
        _ => return,
    };
    first.truncate(n);
    let prefix_is_h2 = first.starts_with(b"PRI ");
    let looks_http = first[0].is_ascii_uppercase();
    let tls = first[0] == 0x16;
    let io = PrefixedIo::new(Bytes::from(first), io);
    if tls {
        intercept_tls(state, target, ips, hold, io, started).await;
    } else if looks_http {
        // The protocol is told from the bytes already read, not by waiting for 24 of them
        // (hyper's detection has no timeout of its own).
        let h2 = prefix_is_h2;
        serve_http(state, target, ips, hold, io, "http", h2).await;
    } else {
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

async fn intercept_tls<T>(
    state: Arc<EgressState>,
    target: Arc<Target>,
    ips: Arc<[IpAddr]>,
    hold: Hold,
    io: T,
    started: Instant,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let wait = Duration::from_secs(state.config.header_read_timeout_secs);
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = match tokio::time::timeout(wait, acceptor).await {
        Ok(Ok(start)) => start,
        _ => return,
    };
    let sni = start
        .client_hello()
        .server_name()
        .map(crate::domain::normalize_host);
    let config = match sni {
        Some(name) if name == target.host => state.tls_server.clone(),
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
            record(&state, &target, outcome, started);
            return;
        }
        // No SNI (IP-literal destinations): the CONNECT authority names the certificate.
        None => match state
            .minter
            .leaf_for(&target.host)
            .ok()
            .and_then(|key| crate::tls::fixed_server_config(key).ok())
        {
            Some(config) => config,
            None => return,
        },
    };
    let tls = match tokio::time::timeout(wait, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(host = %target.host, error = %e, "TLS handshake with the sandbox failed");
            return;
        }
        Err(_) => return,
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    serve_http(state, target, ips, hold, tls, "https", h2).await;
}

/// Serves requests on a terminated tunnel: h2 when `h2` (what TLS negotiated, or a plain
/// h2 prior-knowledge preface), else HTTP/1.1.
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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(state.config.header_read_timeout_secs))
        .max_buf_size(state.config.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(state.config.max_header_bytes as u32)
        .max_concurrent_streams(256)
        // RFC 8441: WebSockets over h2 streams (translated to HTTP/1.1 upstream).
        .enable_connect_protocol();
    let builder = if h2 {
        builder.http2_only()
    } else {
        builder.http1_only()
    };
    let vetted = Arc::new(Vetted::new(&state, &target, scheme, ips));
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        let target = target.clone();
        let vetted = vetted.clone();
        let hold = hold.clone();
        // Each request inside the tunnel gets its own id, nested under the tunnel's span.
        let span = tracing::debug_span!("request", request_id = %next_request_id());
        async move {
            Ok::<_, std::convert::Infallible>(
                forward::handle(state, target, scheme, Some(vetted), hold, req).await,
            )
        }
        .instrument(span)
    });
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .await
    {
        tracing::debug!(error = %e, "intercepted connection ended with an error");
    }
}
