//! Sockets inside a sandbox's network namespace, made from the gateway's own process.
//!
//! A socket belongs to the network namespace of the thread that created it, for its whole
//! life. So each socket here is created on a dedicated thread that entered the namespace
//! (`setns`) and then ends: no pooled thread ever changes namespace, and the socket is
//! handed to tokio, which serves it like any other.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use super::{LocalboxError, Result};

/// How long a connection to a port inside a sandbox may take. The namespace has only
/// loopback, so a connect is answered at once (accepted or refused); this only bounds a
/// sandbox whose listen backlog is full.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `make` on a fresh thread that entered network namespace `netns` (a name under
/// `/run/netns`), and returns what it made. `what` names the step in errors.
async fn in_netns<T, F>(netns: &str, what: &'static str, make: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let path = Path::new("/run/netns").join(netns);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("localbox-netns".into())
        .spawn(move || {
            let result = (|| {
                let ns = std::fs::File::open(&path)?;
                // SAFETY: setns on a valid namespace fd affects only this thread, which
                // ends right after `make`.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                make()
            })();
            let _ = tx.send(result);
        })
        .map_err(|e| LocalboxError::setup(what, e))?;
    rx.await
        .map_err(|e| LocalboxError::setup(what, e))?
        .map_err(|e| LocalboxError::setup(what, e))
}

/// Binds `127.0.0.1:port` inside network namespace `netns` (the sandbox's proxy listener).
pub(super) async fn bind_in_netns(netns: &str, port: u16) -> Result<tokio::net::TcpListener> {
    let listener = in_netns(netns, "binding the proxy listener", move || {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })
    .await?;
    tokio::net::TcpListener::from_std(listener)
        .map_err(|e| LocalboxError::setup("binding the proxy listener", e))
}

/// Why a connection to a port inside a sandbox was not made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nothing listens on the port (on `127.0.0.1`, `0.0.0.0`, `::1` or `::`).
    #[error("nothing listens on port {0} inside the sandbox")]
    Refused(u16),
    /// The namespace could not be entered or the socket made.
    #[error(transparent)]
    Setup(#[from] LocalboxError),
}

/// Connects to `port` on the loopback of network namespace `netns`: `127.0.0.1` first,
/// then `::1` (a server bound to IPv6 loopback only). The connect itself is made on the
/// namespace's thread: on loopback it completes or is refused at once.
pub(super) async fn connect_in_netns(
    netns: &str,
    port: u16,
) -> std::result::Result<tokio::net::TcpStream, ConnectError> {
    let outcome = in_netns(netns, "connecting to a sandbox port", move || {
        let mut last = None;
        for ip in [
            IpAddr::from(Ipv4Addr::LOCALHOST),
            IpAddr::from(Ipv6Addr::LOCALHOST),
        ] {
            match std::net::TcpStream::connect_timeout(&SocketAddr::new(ip, port), CONNECT_TIMEOUT)
            {
                Ok(stream) => {
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    return Ok(Some(stream));
                }
                Err(e) => last = Some(e),
            }
        }
        match last {
            Some(e) if refused(&e) => Ok(None),
            Some(e) => Err(e),
            None => Ok(None),
        }
    })
    .await?;
    let stream = outcome.ok_or(ConnectError::Refused(port))?;
    tokio::net::TcpStream::from_std(stream)
        .map_err(|e| ConnectError::Setup(LocalboxError::setup("connecting to a sandbox port", e)))
}

/// A connection nobody accepted: refused, or no such address (IPv6 loopback absent).
fn refused(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
    ) || e.raw_os_error() == Some(libc::EAFNOSUPPORT)
        || e.raw_os_error() == Some(libc::ENETUNREACH)
}
