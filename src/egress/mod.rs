//! The egress proxy: the only way out of a sandbox.
//!
//! Request path (see DESIGN "Egress request path"):
//! accept (bounded; shed with 503) → identify the sandbox from `Proxy-Authorization`
//! (407 otherwise) → take the destination from the CONNECT authority or the absolute URI,
//! never from a Host header → egress policy on the name (a refused name is never resolved)
//! → resolve once and vet every address → for CONNECT, sniff the tunnel: TLS is terminated
//! with a minted leaf (SNI must equal the CONNECT host), plain HTTP is served as is, and
//! anything else passes only when the policy's action is `tunnel` → every request inside is
//! checked again (Host/:authority must equal the CONNECT host; policy per request) → the
//! request is forwarded over a pooled upstream connection to the vetted address, verified
//! against the real web roots → one decision record per decision.
//!
//! Threads: the proxy listener is served by `workers` (one single-threaded runtime per
//! core); see that module for why.

mod connect;
mod forward;
mod io;
mod tunnel;
pub mod workers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::ProxyConfig;
use crate::credentials::CredentialStore;
use crate::decision_log::DecisionLog;
use crate::error::ErrorReply;
use crate::identity::IdentityRegistry;
use crate::net::{Resolver, VettedDns};
use crate::policy::PolicyEngine;
use crate::tls::LeafMinter;

pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

type Connector = hyper_rustls::HttpsConnector<HttpConnector<VettedDns>>;
pub(crate) type UpstreamClient = Client<Connector, ProxyBody>;

/// Everything a proxied connection needs, shared by all of them. A clone shares the upstream
/// pools too; `for_worker` gives a worker its own.
#[derive(Clone)]
pub struct EgressState {
    pub config: ProxyConfig,
    pub identities: Arc<IdentityRegistry>,
    pub policy: Arc<PolicyEngine>,
    pub resolver: Arc<Resolver>,
    pub minter: Arc<LeafMinter>,
    pub credentials: Arc<CredentialStore>,
    pub(crate) tls_server: Arc<rustls::ServerConfig>,
    pub(crate) client: UpstreamClient,
    /// HTTP/1.1-only upstream client: an `Upgrade` (WebSocket) cannot travel over h2.
    pub(crate) client_h1: UpstreamClient,
    pub log: DecisionLog,
    connections: Arc<Semaphore>,
    /// Kept to build each worker's own upstream clients.
    upstream_tls: rustls::ClientConfig,
}

impl std::fmt::Debug for EgressState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressState").finish_non_exhaustive()
    }
}

/// The shared parts the proxy is built from.
pub struct EgressDeps {
    pub identities: Arc<IdentityRegistry>,
    pub policy: Arc<PolicyEngine>,
    pub resolver: Arc<Resolver>,
    pub minter: Arc<LeafMinter>,
    pub credentials: Arc<CredentialStore>,
    pub log: DecisionLog,
}

impl EgressState {
    pub fn new(
        config: ProxyConfig,
        deps: EgressDeps,
        upstream_tls: rustls::ClientConfig,
    ) -> Result<EgressState, crate::tls::TlsSetupError> {
        let EgressDeps {
            identities,
            policy,
            resolver,
            minter,
            credentials,
            log,
        } = deps;
        let client = upstream_client(&config, &resolver, upstream_tls.clone(), false);
        let client_h1 = upstream_client(&config, &resolver, upstream_tls.clone(), true);
        let tls_server = crate::tls::interception_server_config(minter.clone())?;
        Ok(EgressState {
            connections: Arc::new(Semaphore::new(config.max_connections)),
            config,
            identities,
            policy,
            resolver,
            minter,
            credentials,
            tls_server,
            client,
            client_h1,
            log,
            upstream_tls,
        })
    }

    /// The state one proxy worker thread serves with: everything shared (identities, policy,
    /// credentials, the connection limit, ...) except the upstream connection pools, which are
    /// the worker's own, so that an upstream connection is driven by the thread whose requests
    /// use it.
    pub(crate) fn for_worker(&self) -> EgressState {
        let client = |http1_only| {
            upstream_client(
                &self.config,
                &self.resolver,
                self.upstream_tls.clone(),
                http1_only,
            )
        };
        EgressState {
            client: client(false),
            client_h1: client(true),
            ..self.clone()
        }
    }
}

fn upstream_client(
    config: &ProxyConfig,
    resolver: &Arc<Resolver>,
    tls: rustls::ClientConfig,
    http1_only: bool,
) -> UpstreamClient {
    let mut http = HttpConnector::new_with_resolver(VettedDns(resolver.clone()));
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(config.connect_timeout_secs)));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = if http1_only {
        builder.enable_http1().wrap_connector(http)
    } else {
        builder.enable_all_versions().wrap_connector(http)
    };
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        .build(https)
}

/// A process-unique id for one proxied request or tunnel, carried by its tracing span:
/// a random per-process prefix (so restarts do not reuse ids) and a counter.
pub(crate) fn next_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let prefix = PREFIX.get_or_init(|| {
        let mut bytes = [0u8; 4];
        crate::tls::ca::rand_bytes(&mut bytes);
        u32::from_be_bytes(bytes)
    });
    format!(
        "{prefix:08x}{:08x}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub(crate) fn reply(error: &ErrorReply) -> http::Response<ProxyBody> {
    error
        .to_response::<Full<Bytes>>()
        .map(|b| b.map_err(|never| match never {}).boxed())
}

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
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "proxy accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = state.connections.clone().try_acquire_owned() else {
            metrics::counter!("sandgate_proxy_connections_shed_total").increment(1);
            tokio::spawn(shed(stream));
            continue;
        };
        let state = state.clone();
        let fixed = fixed.clone();
        tokio::spawn(async move {
            metrics::gauge!("sandgate_proxy_connections_active").increment(1.0);
            serve_client(stream, peer, state, fixed).await;
            metrics::gauge!("sandgate_proxy_connections_active").decrement(1.0);
            drop(permit);
        });
    }
}

async fn shed(mut stream: tokio::net::TcpStream) {
    let error = ErrorReply::new(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "sandgate is at its connection limit; retry shortly",
    );
    let body = serde_json::to_vec(&error.body()).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nx-sandgate-error: overloaded\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        stream.shutdown().await
    })
    .await;
}

async fn serve_client(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    state: Arc<EgressState>,
    fixed: Option<Arc<str>>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(state.config.header_read_timeout_secs))
        .max_buf_size(state.config.max_header_bytes.max(8192));
    let service_state = state.clone();
    let service = hyper::service::service_fn(move |req| {
        let state = service_state.clone();
        let fixed = fixed.clone();
        async move {
            Ok::<_, std::convert::Infallible>(connect::proxy_request(state, peer, fixed, req).await)
        }
    });
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "proxy client connection ended with an error");
    }
}
