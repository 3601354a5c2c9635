//! h2 inside an intercepted tunnel, served in bursts, so that an idle h2 tunnel holds no h2
//! state: the h2 connection keeps a 16 KiB write buffer and an 8 KiB read buffer for its
//! whole life (neither can be set smaller), besides its stream store and HPACK tables, which
//! was two thirds of an idle h2 tunnel.
//!
//! Like HTTP/1.1 ([`super::park`]), but h2 cannot be closed and reopened unseen, so the
//! connection is taken apart under the client instead:
//!
//! - **Burst**: hyper serves h2 over [`H2Io`], which watches every byte each way
//!   ([`Wire`]). When the connection has been quiet for a [`QUIET`] period and the wire says
//!   nothing is open, owed or half-written ([`Wire::parkable`]), hyper's connection is
//!   dropped. The TLS session comes back from [`H2Io`] as it is dropped, with the wire state.
//! - **Park**: the client's connection window is topped up to what a new connection assumes
//!   ([`Wire::top_up`]), and the tunnel waits for the client's next byte, holding only the
//!   TLS session and the wire state (`[proxy] idle_timeout_secs` at most; then it sends
//!   GOAWAY and closes, as an h2 server closes an idle connection).
//! - **Wake**: a new hyper connection reads a replay of the client's connection start
//!   ([`Wire::replay`]: preface, the client's SETTINGS, an ACK of the gateway's, its send
//!   window), and what it writes meanwhile is checked and dropped ([`Startup`]); then it goes
//!   live, reading the byte that woke the tunnel and everything after.
//!
//! The client never sees a difference on the wire, except that the gateway's HPACK table
//! size is 0 (see [`super::h2_wire`]). A connection the wire cannot follow is served whole,
//! as before.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::oneshot;

use super::body::ProxyBody;
use super::h2_wire::{Startup, Wire};
use super::park::QUIET;

/// The connection receive window the gateway keeps for the client (hyper's default, set
/// explicitly: a park tops the client's window up to it).
pub(crate) const CONN_WINDOW: u32 = 1024 * 1024;

/// How long writing the park's WINDOW_UPDATE or the idle GOAWAY may take: both are a few
/// bytes into a connection the client is not using.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the burst loop reads while hyper owns the I/O.
#[derive(Default)]
struct Status {
    /// Reads and writes that moved bytes.
    activity: AtomicU64,
    /// The wire could park after the last read or write.
    parkable: AtomicBool,
    /// A new connection is still reading its replay.
    starting: AtomicBool,
}

enum Mode {
    /// Reading the replay; what the connection writes is checked, not sent.
    Startup {
        replay: Bytes,
        check: Startup,
        reader: Option<Waker>,
    },
    Live,
}

/// The tunnel's I/O as hyper's h2 connection sees it (see the module documentation).
pub(crate) struct H2Io<T> {
    inner: Option<T>,
    wire: Wire,
    /// Client bytes to put in front of the next read: the byte that woke a parked tunnel,
    /// or an unfinished frame head held back from h2 until the rest of it is read (see
    /// [`Wire::filter_inbound`]).
    carry: [u8; 8],
    carry_len: u8,
    mode: Mode,
    status: Arc<Status>,
    back: Option<oneshot::Sender<(T, Wire)>>,
}

impl<T> H2Io<T> {
    fn note(&self, moved: bool) {
        if moved {
            self.status.activity.fetch_add(1, Relaxed);
        }
        let live = matches!(self.mode, Mode::Live) && self.carry_len == 0;
        self.status
            .parkable
            .store(live && self.wire.parkable(i64::from(CONN_WINDOW)), Relaxed);
    }

    /// Goes live once the replay is read and the startup frames are written.
    fn go_live_if_started(&mut self) -> io::Result<()> {
        let Mode::Startup {
            replay,
            check,
            reader,
        } = &mut self.mode
        else {
            return Ok(());
        };
        let started = check
            .done(CONN_WINDOW as i64 > super::h2_wire::DEFAULT_WINDOW)
            .map_err(|()| {
                io::Error::other("an h2 connection built again wrote an unexpected frame")
            })?;
        if started && replay.is_empty() {
            if let Some(reader) = reader.take() {
                reader.wake();
            }
            self.mode = Mode::Live;
            self.status.starting.store(false, Relaxed);
        }
        Ok(())
    }
}

impl<T> Drop for H2Io<T> {
    fn drop(&mut self) {
        if let (Some(inner), Some(back)) = (self.inner.take(), self.back.take()) {
            let _ = back.send((inner, std::mem::take(&mut self.wire)));
        }
    }
}

fn gone() -> io::Error {
    io::Error::from(io::ErrorKind::NotConnected)
}

impl<T: AsyncRead + Unpin> AsyncRead for H2Io<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Mode::Startup { replay, reader, .. } = &mut this.mode {
            if !replay.is_empty() {
                let n = replay.len().min(buf.remaining());
                buf.put_slice(&replay[..n]);
                replay.advance(n);
                return Poll::Ready(Ok(()));
            }
            *reader = Some(cx.waker().clone());
            this.go_live_if_started()?;
            if matches!(this.mode, Mode::Startup { .. }) {
                return Poll::Pending;
            }
        }
        loop {
            let start = buf.filled().len();
            if this.carry_len > 0 {
                if buf.remaining() < usize::from(this.carry_len) + 1 {
                    return Poll::Ready(Err(io::Error::other("h2 read buffer too small")));
                }
                buf.put_slice(&this.carry[..usize::from(this.carry_len)]);
                this.carry_len = 0;
            }
            let inner = this.inner.as_mut().ok_or_else(gone)?;
            let held = buf.filled().len();
            match Pin::new(inner).poll_read(cx, buf) {
                Poll::Pending => {
                    // Take back a held-back head put in front: nothing was read after it.
                    this.hold_back(buf, start);
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let eof = buf.filled().len() == held;
            if this.filter(buf, start, eof)? || eof {
                return Poll::Ready(Ok(()));
            }
            // Everything read was dropped or held back: read on (an empty Ready would
            // read as the end of the stream).
        }
    }
}

impl<T> H2Io<T> {
    /// Filters the client's bytes from `start` ([`Wire::filter_inbound`]), holds back an
    /// unfinished frame head (dropped at `eof`), and shows the rest to the wire. Whether any
    /// byte is left for h2.
    fn filter(&mut self, buf: &mut ReadBuf<'_>, start: usize, eof: bool) -> io::Result<bool> {
        let (kept, held) = self.wire.filter_inbound(&mut buf.filled_mut()[start..]);
        if held > 0 && !eof {
            self.carry[..held].copy_from_slice(&buf.filled()[start + kept..start + kept + held]);
            self.carry_len = held as u8;
        }
        buf.set_filled(start + kept);
        self.wire.inbound(&buf.filled()[start..]);
        self.note(kept > 0);
        Ok(kept > 0)
    }

    /// Moves bytes put in front of a read that then returned nothing back into the carry.
    fn hold_back(&mut self, buf: &mut ReadBuf<'_>, start: usize) {
        let held = buf.filled().len() - start;
        if held > 0 {
            self.carry[..held].copy_from_slice(&buf.filled()[start..]);
            self.carry_len = held as u8;
            buf.set_filled(start);
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for H2Io<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Mode::Startup { check, .. } = &mut this.mode {
            for b in bufs {
                check.written(b);
            }
            this.go_live_if_started()?;
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        let inner = this.inner.as_mut().ok_or_else(gone)?;
        let n = std::task::ready!(Pin::new(inner).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for b in bufs {
            let take = left.min(b.len());
            this.wire.outbound(&b[..take]);
            left -= take;
            if left == 0 {
                break;
            }
        }
        this.note(n > 0);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if matches!(self.mode, Mode::Startup { .. }) {
            return Poll::Ready(Ok(()));
        }
        let inner = self.inner.as_mut().ok_or_else(gone)?;
        Pin::new(inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let inner = self.inner.as_mut().ok_or_else(gone)?;
        Pin::new(inner).poll_shutdown(cx)
    }
}

/// Serves h2 on `io` in bursts (see the module documentation) until the client closes, the
/// tunnel idles for `idle`, hyper ends the connection, or the caller drops the future.
pub(crate) async fn serve<T, S>(
    io: T,
    builder: http2::Builder<TokioExecutor>,
    idle: Duration,
    service: S,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let status = Arc::new(Status::default());
    let mut io = io;
    let mut wire = Wire::new();
    let mut mode = Mode::Live;
    let (mut woke, mut woke_len) = (0u8, false);
    loop {
        let (back, taken) = oneshot::channel();
        status
            .starting
            .store(matches!(mode, Mode::Startup { .. }), Relaxed);
        let shim = H2Io {
            inner: Some(io),
            wire,
            carry: [woke, 0, 0, 0, 0, 0, 0, 0],
            carry_len: u8::from(woke_len),
            mode,
            status: status.clone(),
            back: Some(back),
        };
        // Boxed: the connection lives on the heap for the burst only.
        let mut conn = Box::pin(builder.serve_connection(TokioIo::new(shim), service.clone()));
        if !run_burst(&mut conn, &status).await {
            return;
        }
        drop(conn);
        let Ok((inner, parked)) = taken.await else {
            return;
        };
        io = inner;
        wire = parked;
        wire.retire();
        if !park(&mut io, &mut wire).await {
            return;
        }
        let Some(byte) = wait_for_client(&mut io, &wire, idle).await else {
            return;
        };
        (woke, woke_len) = (byte, true);
        mode = Mode::Startup {
            replay: Bytes::from(wire.replay()),
            check: Startup::default(),
            reader: None,
        };
    }
}

/// Drives one burst until hyper's connection ends (false) or the burst may park (true).
async fn run_burst<C>(conn: &mut Pin<Box<C>>, status: &Status) -> bool
where
    C: Future<Output = hyper::Result<()>>,
{
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + QUIET, QUIET);
    let mut seen = status.activity.load(Relaxed);
    let mut starting_ticks = 0;
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "intercepted h2 connection ended with an error");
                }
                return false;
            }
            _ = tick.tick() => {
                if status.starting.load(Relaxed) {
                    // A connection built again goes live within one poll of its replay;
                    // one that does not is not in the state the replay meant.
                    starting_ticks += 1;
                    if starting_ticks >= 2 {
                        tracing::warn!("an h2 connection built again did not start; closing the tunnel");
                        return false;
                    }
                    continue;
                }
                let now = status.activity.load(Relaxed);
                if now == seen && status.parkable.load(Relaxed) {
                    return true;
                }
                seen = now;
            }
        }
    }
}

/// Tops the client's connection window up to [`CONN_WINDOW`]. False when the client does
/// not take the bytes in time.
async fn park<T: AsyncWrite + Unpin>(io: &mut T, wire: &mut Wire) -> bool {
    let top_up = wire.top_up(i64::from(CONN_WINDOW));
    if !top_up.is_empty() {
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            io.write_all(&top_up).await?;
            io.flush().await
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            return false;
        }
        wire.outbound(&top_up);
    }
    metrics::counter!("sandgate_proxy_tunnel_parks_total", "protocol" => "h2").increment(1);
    true
}

/// Waits, parked, for the client's next byte. `None` when the client closed the tunnel, it
/// failed, or it stayed idle for `idle` (then the client is sent GOAWAY first).
async fn wait_for_client<T>(io: &mut T, wire: &Wire, idle: Duration) -> Option<u8>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let _parked = crate::telemetry::ActiveGauge::new("sandgate_proxy_tunnels_parked");
    let mut byte = [0u8; 1];
    match tokio::time::timeout(idle, io.read(&mut byte)).await {
        Ok(Ok(1)) => Some(byte[0]),
        Ok(Ok(_)) | Ok(Err(_)) => None,
        Err(_) => {
            tracing::debug!("intercepted h2 connection closed after its idle timeout");
            let goaway = wire.goaway();
            let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
                io.write_all(&goaway).await?;
                io.shutdown().await
            })
            .await;
            None
        }
    }
}
