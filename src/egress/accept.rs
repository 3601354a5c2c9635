//! Accepting proxy clients: the connection limit, the per-connection HTTP/1.1 server, and
//! the guarantees that hold whatever ends a connection task (gauges and permits are RAII, a
//! panic while answering a request becomes a 500 and is counted, never an empty reply).
//! The TLS listener ([`super::tls_listener`]) admits and serves its clients with the same
//! pieces, after its handshake.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use super::body::{reply, ProxyBody};
use super::connect;
use super::limits::{ConnectionSlot, Hold};
use super::state::EgressState;
use crate::error::{Error, Kind};

/// Accepts proxy clients until the task is aborted; each request names its sandbox with
/// `Proxy-Authorization`.
pub async fn serve(listener: TcpListener, state: Arc<EgressState>) {
    accept_loop(listener, state, None).await
}

/// Serves a listener that belongs to one sandbox (the local provider binds it inside the
/// sandbox's network namespace, where it is the only reachable address). Every request on
/// it is attributed to the identity registered as `identity_id`, whatever credentials it
/// carries: identity comes from the listener, so a sandbox cannot speak for another by
/// forging a header. The identity is looked up per request, so a sandbox not (yet or any
/// longer) registered gets nothing through, and deleting it revokes its egress at once.
pub async fn serve_for(listener: TcpListener, state: Arc<EgressState>, identity_id: Arc<str>) {
    accept_loop(listener, state, Some(identity_id)).await
}

async fn accept_loop(listener: TcpListener, state: Arc<EgressState>, fixed: Option<Arc<str>>) {
    loop {
        let (stream, peer) = next_client(&listener).await;
        let Some(hold) = admit(&state) else {
            tokio::spawn(crate::net::shed::overloaded(stream, SHED_MESSAGE));
            continue;
        };
        tokio::spawn(serve_client(
            stream,
            peer,
            state.clone(),
            fixed.clone(),
            hold,
        ));
    }
}

/// What a connection turned away at `max_connections` is told.
pub(super) const SHED_MESSAGE: &str = "sandgate is at its connection limit";

/// The next client connection; accept errors (EMFILE and friends) are logged and retried
/// after a pause instead of spinning.
pub(super) async fn next_client(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(e) => {
                tracing::warn!(error = %e, "proxy accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A new connection's place under `[proxy] max_connections`, or `None` (counted as shed)
/// when the proxy is full. Every listener takes its places from the same limit.
pub(super) fn admit(state: &EgressState) -> Option<Hold> {
    match state.connections.clone().try_acquire_owned() {
        Ok(permit) => Some(Hold::connection(ConnectionSlot::new(permit))),
        Err(_) => {
            metrics::counter!("sandgate_proxy_connections_shed_total").increment(1);
            None
        }
    }
}

/// One client connection's HTTP/1.1 proxy server, over whatever transport it arrived on
/// (plain TCP, or the TLS listener's stream once its handshake is done).
pub(super) async fn serve_client<S>(
    stream: S,
    peer: SocketAddr,
    state: Arc<EgressState>,
    fixed: Option<Arc<str>>,
    hold: Hold,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(state.config.header_read_timeout_secs))
        .max_buf_size(state.config.max_header_bytes.max(8192));
    let service_state = state.clone();
    let service = hyper::service::service_fn(move |req| {
        let state = service_state.clone();
        let fixed = fixed.clone();
        let answer = connect::proxy_request(state, peer, fixed, hold.clone(), req);
        async move { Ok::<_, std::convert::Infallible>(unpanicked(answer).await) }
    });
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "proxy client connection ended with an error");
    }
}

/// Runs a request's handler; a panic in it (a bug, never the way an error is reported)
/// answers 500 `internal` and is counted, and the connection lives on.
pub(crate) async fn unpanicked(
    answer: impl std::future::Future<Output = http::Response<ProxyBody>>,
) -> http::Response<ProxyBody> {
    match AssertUnwindSafe(answer).catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            metrics::counter!("sandgate_proxy_panics_total").increment(1);
            tracing::error!("a proxy request handler panicked; answered 500");
            reply(&Error::new(
                Kind::Internal,
                "internal",
                "sandgate failed while handling this request",
            ))
        }
    }
}
