//! What every proxied connection shares.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::config::ProxyConfig;
use super::upstream::Upstreams;
use crate::credentials::CredentialStore;
use crate::decision_log::DecisionLog;
use crate::identity::IdentityRegistry;
use crate::net::Resolver;
use crate::policy::PolicyEngine;
use crate::tls::LeafMinter;

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
    pub(crate) upstreams: Arc<Upstreams>,
    pub log: DecisionLog,
    pub(crate) connections: Arc<Semaphore>,
    /// Leaves minted for refused names, per identity (see [`super::deny_tunnel`]).
    pub(crate) deny_leaves: Arc<super::deny_tunnel::DenyLeaves>,
    /// Kept to build each worker's own upstream pools.
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
        let tls_server = crate::tls::interception_server_config(minter.clone())?;
        Ok(EgressState {
            connections: Arc::new(Semaphore::new(config.max_connections)),
            upstreams: Arc::new(upstreams(&config, &upstream_tls)),
            deny_leaves: Arc::new(super::deny_tunnel::DenyLeaves::new(
                config.deny_leaves_per_minute,
            )),
            config,
            identities,
            policy,
            resolver,
            minter,
            credentials,
            tls_server,
            log,
            upstream_tls,
        })
    }

    /// The state one proxy worker thread serves with: everything shared (identities, policy,
    /// credentials, the connection limit, ...) except the upstream connection pools, which are
    /// the worker's own, so that an upstream connection is driven by the thread whose requests
    /// use it.
    pub(crate) fn for_worker(&self) -> EgressState {
        EgressState {
            upstreams: Arc::new(upstreams(&self.config, &self.upstream_tls)),
            ..self.clone()
        }
    }
}

fn upstreams(config: &ProxyConfig, tls: &rustls::ClientConfig) -> Upstreams {
    Upstreams::new(
        tls.clone(),
        Duration::from_secs(config.connect_timeout_secs),
    )
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
