//! Upstream connections that go exactly where the decision said.
//!
//! Contract: a request is sent over a connection to one of the addresses that were resolved
//! and vetted for it (with its real port, every guard applied, "sandgate itself" included)
//! before the policy decided. No name is looked up between the decision and the dial: the
//! connector ignores the URI's host (which still names the server for SNI, certificate
//! verification and `Host`/`:authority`) and dials its own fixed address list, in order.
//!
//! Pools are kept per vetted address set and port (each an hyper-util client whose
//! connector knows only those addresses), so a pooled connection opened for one vetted
//! answer is never reused for a request whose vetted answer differs. A worker keeps up to
//! [`MAX_ADDRESS_SETS`] of them; a tunnel holds on to its own for its lifetime.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::body::ProxyBody;

/// Distinct vetted address sets a worker keeps pools for.
pub const MAX_ADDRESS_SETS: usize = 1024;

type Connector = hyper_rustls::HttpsConnector<VettedConnector>;
pub(crate) type UpstreamClient = Client<Connector, ProxyBody>;

/// Dials its vetted addresses in order, whatever URI it is asked for.
#[derive(Clone, Debug)]
pub(crate) struct VettedConnector {
    addrs: Arc<[SocketAddr]>,
    timeout: Duration,
}

impl tower_service::Service<Uri> for VettedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TcpStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let addrs = self.addrs.clone();
        let timeout = self.timeout;
        Box::pin(async move { dial(&addrs, timeout).await })
    }
}

async fn dial(addrs: &[SocketAddr], timeout: Duration) -> std::io::Result<TokioIo<TcpStream>> {
    let mut last = None;
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(TokioIo::new(stream));
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                last = Some(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to {addr} timed out"),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no vetted address to dial")))
}

/// The two clients of one vetted address set: any version (h2 when the origin offers it),
/// and HTTP/1.1 only, for upgrades (a WebSocket cannot travel over an h2 upstream here).
pub(crate) struct UpstreamPair {
    pub any: UpstreamClient,
    pub h1: UpstreamClient,
}

/// One worker's upstream pools.
pub(crate) struct Upstreams {
    tls: rustls::ClientConfig,
    connect_timeout: Duration,
    pools: quick_cache::sync::Cache<(u16, Arc<[IpAddr]>), Arc<UpstreamPair>>,
}

impl Upstreams {
    pub fn new(tls: rustls::ClientConfig, connect_timeout: Duration) -> Upstreams {
        Upstreams {
            tls,
            connect_timeout,
            pools: quick_cache::sync::Cache::new(MAX_ADDRESS_SETS),
        }
    }

    /// The clients that dial exactly `ips` on `port`.
    pub fn for_addrs(&self, ips: &Arc<[IpAddr]>, port: u16) -> Arc<UpstreamPair> {
        let key = (port, ips.clone());
        if let Some(pair) = self.pools.get(&key) {
            return pair;
        }
        let addrs: Arc<[SocketAddr]> = ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
        let pair = Arc::new(UpstreamPair {
            any: self.client(&addrs, false),
            h1: self.client(&addrs, true),
        });
        self.pools.insert(key, pair.clone());
        pair
    }

    fn client(&self, addrs: &Arc<[SocketAddr]>, http1_only: bool) -> UpstreamClient {
        let connector = VettedConnector {
            addrs: addrs.clone(),
            timeout: self.connect_timeout,
        };
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(self.tls.clone())
            .https_or_http();
        let https = if http1_only {
            builder.enable_http1().wrap_connector(connector)
        } else {
            builder.enable_all_versions().wrap_connector(connector)
        };
        Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .build(https)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dials_only_its_own_addresses_whatever_the_uri_names() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut connector = VettedConnector {
            addrs: Arc::from([addr]),
            timeout: Duration::from_secs(2),
        };
        let uri: Uri = "http://elsewhere.invalid:1/".parse().unwrap();
        let stream = tower_service::Service::call(&mut connector, uri)
            .await
            .unwrap();
        assert_eq!(stream.inner().peer_addr().unwrap(), addr);
        let (_accepted, _) = listener.accept().await.unwrap();
    }

    #[tokio::test]
    async fn tries_the_next_vetted_address_when_one_refuses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good = listener.local_addr().unwrap();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let stream = dial(&[closed, good], Duration::from_secs(2)).await.unwrap();
        assert_eq!(stream.inner().peer_addr().unwrap(), good);
        assert!(dial(&[closed], Duration::from_secs(2)).await.is_err());
    }
}
