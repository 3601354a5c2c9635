//! HTTP/1.1 inside an intercepted tunnel, served in bursts, so that an idle tunnel holds no
//! HTTP state at all.
//!
//! hyper keeps a connection's read buffer (8 KiB, reserved before every read, so also while it
//! waits for the next request) and write buffer (8 KiB), its dispatcher and the service for
//! the connection's whole life. A sandbox's HTTP client keeps its tunnels open for reuse, so
//! most tunnels are idle most of the time, and those buffers were most of what an idle tunnel
//! cost. Here hyper runs only while requests come:
//!
//! - **Parked**: the tunnel waits for the next byte from the client with a one-byte buffer
//!   (`[proxy] idle_timeout_secs` at most; then it is closed). That byte is replayed to a
//!   fresh hyper connection, which reads and answers the requests that follow.
//! - **Burst**: once the burst has answered at least one request, nothing is in flight, and the
//!   client has sent nothing for a [`QUIET`] period, hyper is asked to close (it does so between
//!   messages only: a response being written finishes first, and its head was already
//!   written, so the client never sees `Connection: close`). The close does not reach the
//!   client: [`ParkingIo`] swallows that one shutdown, the I/O and any bytes hyper had read
//!   past the last request are taken back, hyper's buffers are freed, and the tunnel parks.
//!
//! A client that dribbles a request head never completes a request, so its burst never parks
//! and hyper's `header_read_timeout` still ends it. An upgrade (WebSocket) leaves the burst
//! loop: the upgraded stream is its own task's.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::body::ProxyBody;

/// How often a burst checks whether it has been quiet (nothing read, nothing in flight)
/// since the last check, and parks if so: it parks between one and two periods after its
/// last activity. Long enough that a client sending requests back to back never pays for a
/// new hyper connection per request; short against how long a pooled connection sits unused.
pub(crate) const QUIET: Duration = Duration::from_millis(500);

/// What the burst loop reads while hyper owns the I/O and the service.
#[derive(Default)]
struct Activity {
    /// Reads that returned data from the client.
    reads: AtomicU64,
    /// Requests handed to the service, and answered by it (its response returned).
    started: AtomicU64,
    answered: AtomicU64,
    /// Set while the loop has asked hyper to close in order to park: the next shutdown is
    /// not passed on to the client.
    parking: AtomicBool,
}

impl Activity {
    fn quiet_since(&self, reads: u64, answered_at_start: u64) -> bool {
        let answered = self.answered.load(Relaxed);
        self.reads.load(Relaxed) == reads
            && self.started.load(Relaxed) == answered
            && answered > answered_at_start
    }
}

/// The tunnel's I/O as hyper sees it: replays bytes read while parked, counts reads, and
/// keeps the connection open across the shutdown hyper does when a burst parks.
pub(crate) struct ParkingIo<T> {
    replay: Bytes,
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for ParkingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.replay.is_empty() {
            let n = self.replay.len().min(buf.remaining());
            buf.put_slice(&self.replay[..n]);
            self.replay.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.reads.fetch_add(1, Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ParkingIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.activity.parking.swap(false, Relaxed) {
            // Flush what hyper wrote last, but keep the connection: the burst is parking.
            return Pin::new(&mut self.inner).poll_flush(cx);
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves HTTP/1.1 on `io` in bursts (see the module docs) until the client closes, the
/// tunnel idles for `idle`, hyper ends the connection (an error, a timeout, an upgrade), or
/// the caller drops the future.
pub(crate) async fn serve<T, F, Fut>(io: T, builder: http1::Builder, idle: Duration, handle: F)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let activity = Arc::new(Activity::default());
    let counted = activity.clone();
    let mut service = Some(hyper::service::service_fn(move |req| {
        counted.started.fetch_add(1, Relaxed);
        let answer = handle(req);
        let counted = counted.clone();
        async move {
            let response = answer.await;
            counted.answered.fetch_add(1, Relaxed);
            Ok::<_, std::convert::Infallible>(response)
        }
    }));
    let mut io = ParkingIo {
        replay: Bytes::new(),
        inner: io,
        activity: activity.clone(),
    };
    loop {
        if io.replay.is_empty() && !wait_for_client(&mut io, idle).await {
            return;
        }
        let Some(svc) = service.take() else { return };
        // Boxed: the connection (dispatcher, buffers' headers, service) lives on the heap for
        // the burst only, not inline in the tunnel's task for its whole life.
        let mut conn = Box::new(
            builder
                .serve_connection(TokioIo::new(io), svc)
                .with_upgrades(),
        );
        if !run_burst(&mut conn, &activity).await {
            return;
        }
        // Parked: take back the I/O, what hyper read past the last request, and the service.
        let Some(parts) = conn.into_parts() else {
            return;
        };
        metrics::counter!("sandgate_proxy_tunnel_parks_total", "protocol" => "http/1.1")
            .increment(1);
        io = parts.io.into_inner();
        if !parts.read_buf.is_empty() {
            // A copy, so hyper's whole read buffer is not kept alive by a few bytes.
            io.replay = Bytes::copy_from_slice(&parts.read_buf);
        }
        service = Some(parts.service);
    }
}

/// Waits, parked, for the client's next byte and queues it for replay. False when the
/// client closed the tunnel, it failed, or it stayed idle for `idle`.
async fn wait_for_client<T>(io: &mut ParkingIo<T>, idle: Duration) -> bool
where
    T: AsyncRead + Unpin,
{
    let _parked = crate::telemetry::ActiveGauge::new("sandgate_proxy_tunnels_parked");
    let mut byte = [0u8; 1];
    match tokio::time::timeout(idle, io.inner.read(&mut byte)).await {
        Ok(Ok(1)) => {
            io.replay = Bytes::copy_from_slice(&byte);
            true
        }
        Ok(Ok(_)) | Ok(Err(_)) => false,
        Err(_) => {
            tracing::debug!("intercepted connection closed after its idle timeout");
            false
        }
    }
}

/// Drives one burst until hyper's connection ends. True when it ended because the burst
/// parked (the I/O is still open and can be taken back); false for any other end.
async fn run_burst<C>(conn: &mut Box<C>, activity: &Activity) -> bool
where
    C: Future<Output = hyper::Result<()>> + GracefulShutdown + Unpin,
{
    let answered_at_start = activity.answered.load(Relaxed);
    let mut reads = activity.reads.load(Relaxed);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + QUIET, QUIET);
    let mut asked = false;
    loop {
        tokio::select! {
            ended = &mut **conn => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "intercepted connection ended with an error");
                    return false;
                }
                // Parked only if hyper's shutdown was the one swallowed for parking.
                return asked && !activity.parking.load(Relaxed);
            }
            _ = tick.tick(), if !asked => {
                if activity.quiet_since(reads, answered_at_start) {
                    activity.parking.store(true, Relaxed);
                    conn.shut_down_gracefully();
                    asked = true;
                }
                reads = activity.reads.load(Relaxed);
            }
        }
    }
}

/// hyper's graceful shutdown, named so [`run_burst`] need not spell out the connection type.
pub(crate) trait GracefulShutdown {
    fn shut_down_gracefully(&mut self);
}

impl<I, S, B> GracefulShutdown for http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shut_down_gracefully(&mut self) {
        Pin::new(self).graceful_shutdown();
    }
}
