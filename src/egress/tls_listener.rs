//! The TLS proxy listener (`[proxy] tls_listen`): an `https://` proxy for sandboxes that
//! reach sandgate across a network (hosted providers), so their proxy credentials never
//! cross it in clear.
//!
//! Only the transport differs from the plain listener: a connection takes its place under
//! `[proxy] max_connections` at accept (so a client that never finishes its handshake still
//! counts, for at most `tls_handshake_timeout_secs`), completes TLS, and is then served by
//! the same per-connection proxy server ([`super::accept::serve_client`]): same identities
//! (`Proxy-Authorization`), policy, tunnel limits, metrics and decision log. A CONNECT inside
//! carries the sandbox's own TLS to the origin, intercepted as on the plain listener.
//!
//! It runs on the runtime that started the server (like the local sandboxes' in-namespace
//! listeners), not on the proxy worker threads, which serve the plain listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderValue};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use super::accept::{admit, next_client, serve_client, SHED_MESSAGE};
use super::body::reply;
use super::limits::Hold;
use super::state::EgressState;
use crate::error::{Error, Kind, Retry};

/// How long a shed client gets, after its handshake, to send the request it is refused.
const SHED_ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Accepts TLS proxy clients on `listener` until the task is aborted.
pub async fn serve_tls(
    listener: TcpListener,
    state: Arc<EgressState>,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (stream, peer) = next_client(&listener).await;
        let hold = admit(&state);
        let span = tracing::debug_span!("proxy_tls", %peer);
        tokio::spawn(
            serve_tls_client(stream, peer, state.clone(), acceptor.clone(), hold).instrument(span),
        );
    }
}

/// One connection: the handshake, then the proxy (or, when the proxy was full at accept,
/// the 503 `overloaded` answer, over TLS so the client can read it).
async fn serve_tls_client(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<EgressState>,
    acceptor: TlsAcceptor,
    hold: Option<Hold>,
) {
    let timeout = Duration::from_secs(state.config.tls_handshake_timeout_secs);
    let Some(stream) = handshake(&acceptor, stream, peer, timeout).await else {
        return;
    };
    match hold {
        Some(hold) => serve_client(stream, peer, state, None, hold).await,
        None => shed(stream, peer).await,
    }
}

/// The TLS handshake, bounded by `timeout`; a failure or timeout is logged (debug, with the
/// peer) and counted, and the connection is closed by dropping it.
async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    timeout: Duration,
) -> Option<TlsStream<TcpStream>> {
    let reason = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS proxy client handshake failed");
            "error"
        }
        Err(_) => {
            tracing::debug!(%peer, ?timeout, "TLS proxy client did not complete its handshake in time; closed");
            "timeout"
        }
    };
    metrics::counter!("sandgate_proxy_tls_handshake_failures_total", "reason" => reason)
        .increment(1);
    None
}

/// Answers the client's first request with 503 `overloaded` and closes. The request is
/// read (hyper serves exactly one) rather than the answer written blind as on the plain
/// listener: closing a socket with the unread request in its buffer resets the connection,
/// and over TLS the reset can reach the client before it has decrypted the answer.
async fn shed(stream: TlsStream<TcpStream>, peer: SocketAddr) {
    let service = hyper::service::service_fn(|_req| async {
        Ok::<_, std::convert::Infallible>(overloaded())
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .keep_alive(false)
        .header_read_timeout(SHED_ANSWER_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(SHED_ANSWER_TIMEOUT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "shed TLS proxy client"),
        Err(_) => tracing::debug!(%peer, "shed TLS proxy client sent no request in time"),
    }
}

fn overloaded() -> http::Response<super::ProxyBody> {
    let error = Error::new(
        Kind::Unavailable,
        "overloaded",
        format!("{SHED_MESSAGE}; retry shortly"),
    )
    .retry(Retry::After(Duration::from_secs(1)));
    let mut response = reply(&error);
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
