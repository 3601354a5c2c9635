//! Serving the API so that no client can starve the others.
//!
//! Contract:
//! - At most `max_connections` API connections at once, and at most `max_connections_per_ip`
//!   from one peer address: a connection over either limit is answered 503 `overloaded`
//!   (`Retry-After: 1`) and closed at once, so a flood costs one descriptor per connection
//!   for a moment, not for as long as the flooder likes. `/healthz` from any other address
//!   keeps answering while one address floods.
//! - A request head must arrive within `header_read_timeout` of the connection becoming
//!   ready for one (its start, or the end of the previous response): a slow-header client, a
//!   connection that never sends a byte and an idle keep-alive connection are closed after
//!   it (the first request by a deadline of our own, the later ones by hyper's timer).
//! - A connection with no request in flight on which nothing moved for `idle_timeout` is
//!   closed, whatever its protocol (this is what bounds an idle h2 connection). A request in
//!   flight (an exec stream that prints nothing for a while) is never cut by it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use bytes::Bytes;
use http::Request;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// The API's connection limits and timeouts (`[api]`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Accepts API clients until the task is aborted.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits) {
    let limits = Arc::new(limits);
    let total = Arc::new(Semaphore::new(limits.max_connections));
    let per_ip = Arc::new(PerIp::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "API accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = total.clone().try_acquire_owned() else {
            metrics::counter!("sandgate_api_connections_shed_total", "limit" => "total")
                .increment(1);
            tokio::spawn(crate::net::shed::overloaded(
                stream,
                "the API is at its connection limit",
            ));
            continue;
        };
        let Some(slot) = per_ip
            .clone()
            .take(peer.ip(), limits.max_connections_per_ip)
        else {
            metrics::counter!("sandgate_api_connections_shed_total", "limit" => "per_ip")
                .increment(1);
            tokio::spawn(crate::net::shed::overloaded(
                stream,
                "this address is at its API connection limit",
            ));
            continue;
        };
        let app = app.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _slot = slot;
            let _active = crate::telemetry::ActiveGauge::new("sandgate_api_connections_active");
            serve_connection(stream, peer, app, &limits).await;
        });
    }
}

/// Connections per peer address.
#[derive(Default)]
struct PerIp(Mutex<HashMap<IpAddr, usize>>);

struct IpSlot {
    owner: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    fn take(self: Arc<Self>, ip: IpAddr, max: usize) -> Option<IpSlot> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = map.entry(ip).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        drop(map);
        Some(IpSlot { owner: self, ip })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut map = self.owner.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = map.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

async fn serve_connection(stream: TcpStream, peer: SocketAddr, app: Router, limits: &Limits) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let in_flight = activity.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let mut app = app.clone();
        let guard = InFlight::start(in_flight.clone());
        async move {
            let response = tower_service::Service::call(&mut app, req).await;
            response.map(|r| {
                r.map(|body| {
                    axum::body::Body::new(Tracked {
                        body,
                        _guard: guard,
                    })
                })
            })
        }
    });
    // With upgrades: a terminal session (`/v1/sandboxes/{id}/pty`) takes the connection over.
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::select! {
        result = conn => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "API connection ended with an error");
            }
        }
        () = activity.no_request_within(limits.header_read_timeout) => {
            metrics::counter!("sandgate_api_connections_idle_closed_total").increment(1);
            tracing::debug!(%peer, "API connection closed: no request head in time");
        }
        () = activity.idle_for(limits.idle_timeout) => {
            metrics::counter!("sandgate_api_connections_idle_closed_total").increment(1);
            tracing::debug!(%peer, "API connection closed: idle");
        }
    }
}

/// When bytes last moved on a connection, and how many requests are in flight on it.
struct Activity {
    started: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    requests: AtomicUsize,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// Resolves when no request has begun within `wait` of the connection's start. hyper's
    /// header-read timer starts only once the protocol is known, and telling h1 from h2
    /// waits for the client's first bytes: a connection that never sends one would
    /// otherwise be held until the idle timeout.
    async fn no_request_within(&self, wait: Duration) {
        tokio::time::sleep(wait).await;
        if self.requests.load(Ordering::Relaxed) > 0 {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the connection has had no request in flight and no traffic for `idle`.
    async fn idle_for(&self, idle: Duration) {
        let idle_ms = idle.as_millis() as u64;
        loop {
            let now = self.started.elapsed().as_millis() as u64;
            let quiet = now.saturating_sub(self.last_ms.load(Ordering::Relaxed));
            if self.in_flight.load(Ordering::Relaxed) == 0 && quiet >= idle_ms {
                return;
            }
            let wait = idle_ms.saturating_sub(quiet).max(idle_ms / 4).max(10);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }
}

/// Counts one request in flight until its response body is done (or dropped).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> InFlight {
        activity.requests.fetch_add(1, Ordering::Relaxed);
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted as in flight while it streams.
struct Tracked {
    body: axum::body::Body,
    _guard: InFlight,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A stream that notes when bytes move through it.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
