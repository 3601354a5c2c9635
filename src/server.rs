//! Wires the configuration into a running gateway: CA, policy, identities, listeners, the
//! egress proxy and the API. Tests start it in-process with port 0 listeners.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::credentials::{CredentialStore, MasterKey};
use crate::decision_log::{DecisionLog, Sink};
use crate::egress::{EgressDeps, EgressState};
use crate::identity::IdentityRegistry;
use crate::net::{AddressGuard, Resolver};
use crate::policy::PolicyEngine;
use crate::store::Store;
use crate::tls::{CaOrigin, CertAuthority, LeafMinter};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Ca(#[from] crate::tls::ca::CaError),
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsSetupError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Auth(#[from] crate::callers::AuthConfigError),
    #[error(transparent)]
    Facade(#[from] crate::facade::FacadeConfigError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Seal(#[from] crate::credentials::seal::SealError),
    #[error(transparent)]
    Credential(#[from] crate::credentials::CredentialError),
    #[error("config key `pools`: {0}")]
    Routing(String),
    #[error(transparent)]
    Providers(#[from] crate::providers::RegistryError),
    #[error("the local API token file {path}: {source}")]
    LocalToken {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token endpoints' HTTP client: {0}")]
    Http(String),
    #[error("local provider: {0}")]
    Local(String),
    #[error("reading the CA certificate {path}: {source}")]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("decision log: {0}")]
    DecisionLog(std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::OtlpError),
    #[error(transparent)]
    ProxyTls(#[from] crate::egress::ListenerCertError),
    #[error(transparent)]
    PortsTls(#[from] crate::ports::PortsCertError),
    #[error("starting the proxy worker threads: {0}")]
    ProxyWorkers(std::io::Error),
    #[error("writing the bundled policies to {dir}: {source}")]
    BundledPolicies {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// The policies shipped inside the binary, written out when the policy directory does not
/// exist yet, so `sandgate serve` works from any directory and the files stay editable.
pub const BUNDLED_POLICIES: &[(&str, &str)] = &[
    ("egress.rego", include_str!("../policies/egress.rego")),
    (
        "egress_test.rego",
        include_str!("../policies/egress_test.rego"),
    ),
    ("creation.rego", include_str!("../policies/creation.rego")),
    (
        "creation_test.rego",
        include_str!("../policies/creation_test.rego"),
    ),
    ("provider.rego", include_str!("../policies/provider.rego")),
    (
        "provider_test.rego",
        include_str!("../policies/provider_test.rego"),
    ),
    (
        "credential.rego",
        include_str!("../policies/credential.rego"),
    ),
    (
        "credential_test.rego",
        include_str!("../policies/credential_test.rego"),
    ),
    ("lifecycle.rego", include_str!("../policies/lifecycle.rego")),
    (
        "lifecycle_test.rego",
        include_str!("../policies/lifecycle_test.rego"),
    ),
    ("action.rego", include_str!("../policies/action.rego")),
    (
        "action_test.rego",
        include_str!("../policies/action_test.rego"),
    ),
    ("README.md", include_str!("../policies/README.md")),
];

pub struct Server {
    proxy_addr: SocketAddr,
    proxy_tls_addr: Option<SocketAddr>,
    api_addr: SocketAddr,
    e2b_addr: Option<SocketAddr>,
    ports_addr: Option<SocketAddr>,
    ca_cert_path: PathBuf,
    pub egress: Arc<EgressState>,
    /// The sandbox creation coordinator (tests reach the simulated providers through it).
    pub sandboxes: Arc<crate::create::Coordinator>,
    /// None on a replica of role `api`.
    proxy_workers: Option<crate::egress::workers::Workers>,
    tasks: Vec<JoinHandle<()>>,
    /// This process in the shared replica list, and the store it is listed in: a graceful
    /// stop removes it at once (see [`Server::stop`]).
    replica: Arc<crate::replicas::Replica>,
    store: Store,
    /// Closed by a graceful stop, so the records exported over OTLP are not lost with the
    /// process.
    log: DecisionLog,
    /// The local sandbox runtime, and what a graceful stop does to its sandboxes.
    local: Option<(
        Arc<crate::localbox::LocalRuntime>,
        crate::providers::local::OnShutdown,
    )>,
}

impl Server {
    pub async fn start(config: Config) -> Result<Server, StartError> {
        // A token whose environment variable is unset is a configuration error: said before
        // anything (CA, store) is created (the full auth is built further down).
        if !config.api.tokens.is_empty() {
            crate::callers::ApiAuth::from_config(&config.api.tokens)?;
        }
        crate::tls::install_default_provider();
        let metrics = crate::telemetry::metrics_handle();
        // HELP lines and the series known up front, at zero, before any traffic.
        crate::telemetry::catalog::register();

        let (ca, origin) = CertAuthority::load_or_generate(&config.tls.ca_dir)?;
        match origin {
            CaOrigin::Generated => tracing::info!(
                path = %ca.cert_path().display(),
                "generated a new interception CA; sandboxes must trust this certificate"
            ),
            CaOrigin::Loaded => {
                tracing::info!(path = %ca.cert_path().display(), "loaded interception CA")
            }
        }
        let ca_cert_path = ca.cert_path();
        let ca = Arc::new(ca);

        ensure_policy_dir(&config.policy.dir)?;
        let policy = Arc::new(PolicyEngine::load_with(
            &config.policy.dir,
            config.policy.evaluator,
        )?);
        tracing::info!(dir = %config.policy.dir.display(), files = ?policy.status().files, "policy loaded");
        // The replica's id is known before anything writes, so every change it records
        // names it (the other replicas follow them; it skips its own).
        let replica = Arc::new(crate::replicas::Replica::new(config.role));
        let store = Store::open(&config.store).await?.with_origin(&replica.id);
        // Where this replica starts following the others, taken before it loads anything.
        let cursor = crate::propagation::Cursor::at_end(&store).await?;
        tracing::info!(store = %store.location(), dialect = ?store.dialect(), "store opened");
        let mut master_key = MasterKey::load_ring(
            &config.secrets.master_key_file,
            &config.secrets.accepted_key_files,
        )?;
        crate::credentials::keys::adopt_placeholder_seed(&store, &mut master_key).await?;
        let master_key = Arc::new(master_key);
        let credentials =
            Arc::new(CredentialStore::load(master_key, store.clone(), &config.credentials).await?);
        let identities = Arc::new(IdentityRegistry::from_config(
            &config.egress.identities,
            credentials.as_ref(),
        )?);

        // A replica of role `api` binds no proxy listener; its sandboxes' proxy address is
        // still the configured one (the proxy replicas', behind their load balancer).
        let serves_proxy = config.role.serves_proxy();
        let proxy_listener = match serves_proxy {
            true => Some(bind("proxy", config.proxy.listen).await?),
            false => None,
        };
        let proxy_tls_listener = match config.proxy.tls_listen.filter(|_| serves_proxy) {
            Some(addr) => Some(bind("proxy_tls", addr).await?),
            None => None,
        };
        let api_listener = bind("api", config.api.listen).await?;
        let proxy_addr = match &proxy_listener {
            Some(listener) => local_addr("proxy", config.proxy.listen, listener)?,
            None => config.proxy.listen,
        };
        let proxy_tls_addr = match (&proxy_tls_listener, config.proxy.tls_listen) {
            (Some(listener), Some(addr)) => Some(local_addr("proxy_tls", addr, listener)?),
            _ => None,
        };
        let api_addr = local_addr("api", config.api.listen, &api_listener)?;
        // The E2B facade is part of the control plane: not on a replica of role `proxy`.
        let e2b_listener = match config.e2b.listen.filter(|_| config.role.serves_api()) {
            Some(addr) => Some((addr, bind("e2b", addr).await?)),
            None => None,
        };
        let e2b_addr = match &e2b_listener {
            Some((addr, listener)) => Some(local_addr("e2b", *addr, listener)?),
            None => None,
        };
        let mut ports_listener = bind_ports(&config).await?;
        let ports_addr = match &ports_listener {
            Some((addr, listener)) => Some(local_addr("ports", *addr, listener)?),
            None => None,
        };

        // Every listener is sandgate itself: never a destination.
        let own_listeners = [
            Some(proxy_addr),
            proxy_tls_addr,
            Some(api_addr),
            e2b_addr,
            ports_addr,
        ];
        let guard = AddressGuard::new(
            config.egress.allow_private.clone(),
            own_listeners.into_iter().flatten().collect(),
        );
        let resolver = Arc::new(Resolver::new(
            config.dns.hosts.clone(),
            guard,
            Duration::from_secs(config.dns.cache_ttl_secs),
        ));
        let minter = Arc::new(LeafMinter::new(
            ca,
            Duration::from_secs(config.tls.leaf_validity_hours * 3600),
            config.tls.leaf_cache_capacity,
        ));
        let proxy_tls = crate::egress::tls_server_config(&config.proxy, &minter)?;
        let ports_tls = match &ports_listener {
            Some(_) => Some(crate::ports::server_config(&config.ports, &minter)?),
            None => None,
        };
        let upstream_tls = crate::tls::upstream_client_config(&config.tls.upstream_ca_files)?;
        let ring = crate::decision_ring::DecisionRing::new(crate::decision_ring::RingLimits {
            max_records: config.log.decisions_ring,
            max_bytes: config.log.decisions_ring_bytes,
        });
        let log = decision_log(&config, ring.clone())?;
        // Every layer's decisions go to the same log; egress is written by the proxy itself.
        policy.set_decision_log(log.clone(), &["egress"]);
        credentials.enable_minting(token_client(&resolver, &upstream_tls)?);
        let egress = Arc::new(EgressState::new(
            config.proxy.clone(),
            EgressDeps {
                identities: identities.clone(),
                policy: policy.clone(),
                resolver,
                minter,
                credentials: credentials.clone(),
                log: log.clone(),
            },
            upstream_tls.clone(),
        )?);

        let workers = crate::egress::workers::count(config.proxy.workers);
        let proxy_workers = match proxy_listener {
            Some(listener) => Some(
                listener
                    .into_std()
                    .and_then(|listener| crate::egress::workers::start(listener, &egress, workers))
                    .map_err(StartError::ProxyWorkers)?,
            ),
            None => None,
        };
        if proxy_workers.is_some() {
            tracing::debug!(workers, "proxy worker threads started");
        }
        let mut tasks = Vec::new();
        if let (Some(listener), Some(tls)) = (proxy_tls_listener, proxy_tls) {
            tasks.push(tokio::spawn(crate::egress::serve_tls(
                listener,
                egress.clone(),
                tls,
            )));
        }
        let (topology, local) = routing_topology(&config, ports_listener.is_some())?;
        if !matches!(local, Some(Ok(_))) {
            // No local sandboxes here: no ports to serve.
            ports_listener = None;
        }
        let topology = Arc::new(topology);
        let mut providers = crate::providers::ProviderRegistry::from_config(
            &config.simulated,
            &config.accounts,
            &topology,
            &upstream_tls,
        )?;
        let local_pools: Vec<String> = topology
            .pools()
            .iter()
            .filter(|p| {
                topology.providers()[p.provider].kind == sandgate_router::ProviderKind::Local
            })
            .map(|p| p.name.to_string())
            .collect();
        let mut local_runtime = None;
        if let Some(local) = local.filter(|_| !local_pools.is_empty()) {
            let adapter: Arc<dyn crate::providers::Provider> = match local {
                Ok(runtime) => {
                    local_runtime = Some((runtime.clone(), config.local.on_shutdown));
                    let ca_pem = std::fs::read(&ca_cert_path)
                        .map_err(|e| StartError::Local(e.to_string()))?;
                    let provider = crate::providers::local::LocalProvider::new(
                        runtime,
                        egress.clone(),
                        ca_pem,
                        &config.local,
                    )
                    .await
                    .map_err(|e| StartError::Local(e.to_string()))?
                    .with_public_ports(ports_listener.is_some());
                    Arc::new(provider)
                }
                Err(reason) => {
                    tracing::warn!(pools = ?local_pools, %reason, "local sandboxes are unavailable; creates on local pools will fail");
                    Arc::new(crate::providers::local::UnavailableLocal { reason })
                }
            };
            for pool in &local_pools {
                providers.insert(pool, adapter.clone());
            }
        }
        let providers = Arc::new(providers);
        let sandboxes = crate::create::Coordinator::new(crate::create::CreateDeps {
            store: store.clone(),
            topology,
            providers,
            policy: policy.clone(),
            identities: identities.clone(),
            credentials: credentials.clone(),
            config: config.create.clone(),
            proxy_addr,
            ca_cert_path: ca_cert_path.clone(),
            local_proxy_port: config.local.proxy_port,
            remote: remote_gateway(&config, &ca_cert_path)?,
        });
        if serves_proxy {
            // The proxy looks up an id it does not serve before refusing it (a sandbox just
            // created through another replica). Weak: the registry must not keep the
            // coordinator alive (it holds the registry).
            let coordinator = Arc::downgrade(&sandboxes);
            let find: crate::identity::lookup::Finder = Arc::new(move |id: String| {
                let coordinator = coordinator.clone();
                Box::pin(async move {
                    match coordinator.upgrade() {
                        Some(c) => c.look_up_identity(&id).await.map_err(|e| e.to_string()),
                        None => Ok(false),
                    }
                })
            });
            identities.set_lookup(crate::identity::lookup::Lookup::new(
                find,
                tokio::runtime::Handle::current(),
            ));
        }
        let restored = sandboxes.restore(config.role.serves_api()).await?;
        if restored > 0 {
            tracing::info!(
                sandboxes = restored,
                "registered the egress identities of running sandboxes"
            );
        }
        // Only the control plane drives creates (resumes, janitor, account checks); a proxy
        // replica serves the identities the store holds.
        if config.role.serves_api() {
            tasks.extend(sandboxes.spawn_background());
        }
        let follower = crate::propagation::Follower {
            store: store.clone(),
            sandboxes: sandboxes.clone(),
            credentials: credentials.clone(),
            poll: Duration::from_millis(config.store.poll_changes_ms),
            reconcile: (config.store.reconcile_secs > 0)
                .then(|| Duration::from_secs(config.store.reconcile_secs)),
        };
        tasks.push(follower.spawn(cursor));
        replica.beat(&store, &policy).await?;
        tasks.push(replica.spawn_heartbeat(store.clone(), policy.clone()));
        let ops = crate::operations::OpsContext {
            policy: policy.clone(),
            identities,
            credentials,
            auth: Arc::new(api_auth(&config)?),
            sandboxes: sandboxes.clone(),
        };
        let port_urls = match (&ports_listener, ports_addr) {
            (Some(_), Some(bound)) => Some(crate::ports::PortUrls::new(
                &config.ports.domain,
                crate::ports::url_port(&config.ports, bound),
            )),
            _ => None,
        };
        if let (Some((_, listener)), Some(tls)) = (ports_listener, ports_tls) {
            tasks.push(crate::ports::spawn(
                listener,
                tls,
                &config.ports,
                ops.clone(),
            ));
        }
        let state = crate::api::ApiState {
            ports: port_urls.clone(),
            ops: ops.clone(),
            metrics,
            proxy_addr,
            ca_cert_path: ca_cert_path.clone(),
            execs: Default::default(),
            role: config.role,
            replica: replica.clone(),
            decisions: crate::api::decisions::Decisions::new(
                ring,
                config.log.decisions_streams_max,
            ),
        };
        let limits = crate::api::listener::Limits {
            max_connections: config.api.max_connections,
            max_connections_per_ip: config.api.max_connections_per_ip,
            header_read_timeout: Duration::from_secs(config.api.header_read_timeout_secs),
            idle_timeout: Duration::from_secs(config.api.idle_timeout_secs),
        };
        if let Some((_, listener)) = e2b_listener {
            let key_file = local_e2b_key_file(&config);
            let facade = crate::facade::FacadeState::new(ops, &config.e2b, &key_file)?
                .with_ports(port_urls.clone());
            tasks.push(tokio::spawn(crate::api::listener::serve(
                listener,
                crate::facade::router(facade),
                limits.clone(),
            )));
        }
        let app = match config.role.serves_api() {
            true => crate::api::router(state),
            false => crate::api::probes_router(state),
        };
        tasks.push(tokio::spawn(crate::api::listener::serve(
            api_listener,
            app,
            limits,
        )));
        if config.policy.reload_interval_ms > 0 {
            tasks.push(
                policy.spawn_reloader(Duration::from_millis(config.policy.reload_interval_ms)),
            );
        }
        tracing::info!(
            proxy = %proxy_addr,
            proxy_tls = proxy_tls_addr.map(tracing::field::display),
            api = %api_addr,
            e2b = e2b_addr.map(tracing::field::display),
            ports = port_urls.as_ref().map(|u| tracing::field::display(u.pattern())),
            "sandgate is serving"
        );
        Ok(Server {
            proxy_addr,
            proxy_tls_addr,
            api_addr,
            e2b_addr,
            ports_addr: port_urls.as_ref().and(ports_addr),
            ca_cert_path,
            egress,
            sandboxes,
            proxy_workers,
            tasks,
            replica,
            store,
            log,
            local: local_runtime,
        })
    }

    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    /// The TLS proxy listener's address (`[proxy] tls_listen`), when there is one.
    pub fn proxy_tls_addr(&self) -> Option<SocketAddr> {
        self.proxy_tls_addr
    }

    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// The E2B facade's address (`[e2b] listen`), when it serves.
    pub fn e2b_addr(&self) -> Option<SocketAddr> {
        self.e2b_addr
    }

    /// The ports gateway's address (`[ports] listen`), when it serves.
    pub fn ports_addr(&self) -> Option<SocketAddr> {
        self.ports_addr
    }

    /// The CA certificate sandboxes must trust.
    pub fn ca_cert_path(&self) -> &Path {
        &self.ca_cert_path
    }

    /// Stops accepting; the proxy workers close their connections, other in-flight work
    /// ends with the runtime. The replica stays listed until its heartbeat expires
    /// ([`crate::replicas::LIVE_FOR`]), as after a crash; [`Server::stop`] removes it.
    pub fn shutdown(self) {
        if let Some(workers) = self.proxy_workers {
            workers.stop();
        }
        for task in self.tasks {
            task.abort();
        }
    }

    /// A graceful stop (`sandgate serve` on SIGTERM or Ctrl-C): [`Server::shutdown`], then
    /// this replica's row is deleted, so `GET /v1/policies` on the others stops listing it at
    /// once instead of ~20 s later. The heartbeat task is aborted first, so it cannot write
    /// the row back. The delete is bounded: a store that is down must not hold the exit.
    pub async fn stop(self) {
        let (replica, store, log) = (self.replica.clone(), self.store.clone(), self.log.clone());
        if let Some((runtime, on_shutdown)) = &self.local {
            stop_local(runtime, *on_shutdown).await;
        }
        self.shutdown();
        // After the proxy stopped, so the last requests' records are in; bounded, since a
        // collector that is down must not hold the exit either.
        log.close(Duration::from_secs(6)).await;
        match tokio::time::timeout(Duration::from_secs(3), replica.leave(&store)).await {
            Ok(Ok(())) => tracing::info!(replica = %replica.id, "left the replica list"),
            Ok(Err(e)) => {
                tracing::warn!(replica = %replica.id, error = %e, "could not leave the replica list; it expires with the heartbeat")
            }
            Err(_) => {
                tracing::warn!(replica = %replica.id, "the store did not answer in time; the replica expires with its heartbeat")
            }
        }
    }
}

/// `[local] on_shutdown` at a graceful stop: leave the sandboxes running for the next start
/// to re-adopt, or delete them.
async fn stop_local(
    runtime: &crate::localbox::LocalRuntime,
    on_shutdown: crate::providers::local::OnShutdown,
) {
    let ids = runtime.list();
    match on_shutdown {
        crate::providers::local::OnShutdown::Keep => {
            runtime.keep_running();
            if !ids.is_empty() {
                tracing::info!(count = ids.len(), "leaving the local sandboxes running; the next start re-adopts them ([local] on_shutdown = \"keep\")");
            }
        }
        crate::providers::local::OnShutdown::Stop => {
            for id in &ids {
                if let Err(e) = runtime.delete(id).await {
                    tracing::warn!(instance = %id, error = %e, "could not delete a local sandbox at shutdown; the next start removes it");
                }
            }
            if !ids.is_empty() {
                tracing::info!(
                    count = ids.len(),
                    "deleted the local sandboxes ([local] on_shutdown = \"stop\")"
                );
            }
        }
    }
}

/// The decision log: to `[log] decisions`, the ring, and the collector when
/// `[telemetry] otlp_logs` is on.
fn decision_log(
    config: &Config,
    ring: Option<Arc<crate::decision_ring::DecisionRing>>,
) -> Result<DecisionLog, StartError> {
    let export = crate::telemetry::DecisionExport::start(&config.telemetry)?;
    Ok(DecisionLog::start_with(
        Sink::parse(&config.log.decisions),
        ring,
        export,
        config.log.decisions_queue,
    )
    .map_err(StartError::DecisionLog)?
    .with_full_argv(config.log.full_argv))
}

/// `[[api.tokens]]`, or on the embedded defaults a generated local admin token.
fn api_auth(config: &Config) -> Result<crate::callers::ApiAuth, StartError> {
    if !config.api.tokens.is_empty() || !config.api.generate_local_token {
        return Ok(crate::callers::ApiAuth::from_config(&config.api.tokens)?);
    }
    let file = local_token_file(config);
    let auth =
        crate::callers::ApiAuth::local_admin(&file).map_err(|source| StartError::LocalToken {
            path: file.clone(),
            source,
        })?;
    tracing::info!(
        path = %file.display(),
        "no [[api.tokens]] configured: the local admin token (workspace `default`) is in this file; the CLI reads it when SANDGATE_TOKEN is not set"
    );
    Ok(auth)
}

/// Where the generated local admin token lives: next to the SQLite database. With `[store]
/// url` (Postgres) `path` keeps its default, so the token is in `data/`, where the CLI looks.
pub fn local_token_file(config: &Config) -> PathBuf {
    config
        .store
        .path
        .parent()
        .map(|p| p.join("api-token"))
        .unwrap_or_else(|| PathBuf::from("api-token"))
}

/// Where the generated local E2B API key lives: beside the local admin token.
pub fn local_e2b_key_file(config: &Config) -> PathBuf {
    local_token_file(config).with_file_name("e2b-api-key")
}

/// `[proxy] public_url` and the CA hosted sandboxes are given (none without a public URL).
fn remote_gateway(
    config: &Config,
    ca_cert_path: &std::path::Path,
) -> Result<Option<crate::create::RemoteGateway>, StartError> {
    let Some(url) = config.proxy.public_url() else {
        return Ok(None);
    };
    let ca_pem = std::fs::read_to_string(ca_cert_path).map_err(|source| StartError::CaFile {
        path: ca_cert_path.to_path_buf(),
        source,
    })?;
    Ok(Some(crate::create::RemoteGateway { url, ca_pem }))
}

fn host_memory_mb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

/// The address `listener` (bound for `addr`) actually got: the port, when `addr`'s is 0.
fn local_addr(
    what: &'static str,
    addr: SocketAddr,
    listener: &TcpListener,
) -> Result<SocketAddr, StartError> {
    listener
        .local_addr()
        .map_err(|source| StartError::Bind { what, addr, source })
}

fn ensure_policy_dir(dir: &Path) -> Result<(), StartError> {
    if dir.exists() {
        return Ok(());
    }
    let err = |source| StartError::BundledPolicies {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    for (name, text) in BUNDLED_POLICIES {
        std::fs::write(dir.join(name), text).map_err(err)?;
    }
    tracing::info!(dir = %dir.display(), "policy directory did not exist; wrote the bundled policies");
    Ok(())
}

/// Raises the soft descriptor limit (`RLIMIT_NOFILE`) to the hard limit and reports whether
/// the configured connection limits fit in it: each proxy connection may take two
/// descriptors (client and upstream), each API connection one, plus some for the store,
/// logs and listeners. Returns `(limit, needed)`. When they do not fit, the process would run
/// out of descriptors before its own limits shed load, which is what lets one flood stop
/// everything else.
pub fn descriptor_budget(config: &Config) -> (u64, u64) {
    let needed =
        (config.proxy.max_connections as u64) * 2 + config.api.max_connections as u64 + 256;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write to/read from the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return (0, needed);
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    (limit.rlim_cur, needed)
}

/// The local runtime when the configuration has a local provider (its error when this
/// machine cannot run one: the pool then fails its creates, the gateway still starts).
pub type LocalRuntimeResult = Option<Result<Arc<crate::localbox::LocalRuntime>, String>>;

/// The topology `serve` routes on: the configuration's pools, where the default local pool
/// declares only the resources this machine can enforce (its cgroup controllers). `sandgate
/// route explain` compiles through here too, so it sees the pools the server sees.
pub fn routing_topology(
    config: &Config,
    ports_serving: bool,
) -> Result<(sandgate_router::Topology, LocalRuntimeResult), StartError> {
    let mut router_config = config.router_config();
    // The providers of kind `local`, by name: their pools declare this machine's facts.
    let local_providers = local_provider_names(&router_config);
    let local = (!local_providers.is_empty()).then(|| {
        crate::localbox::LocalRuntime::new(crate::providers::local::runtime_config(&config.local))
            .map(Arc::new)
            .map_err(|e| e.to_string())
    });
    if let Some(Ok(runtime)) = &local {
        let caps = runtime.capabilities();
        if config.uses_default_topology() {
            declare_default_resources(&mut router_config.pools[0], &caps, config);
        }
        for pool in router_config
            .pools
            .iter_mut()
            .filter(|p| local_providers.contains(&p.provider))
        {
            declare_machine_facts(pool, &caps, config);
        }
    }
    // Ports are public only where the ports gateway serves them (a runtime, a listener).
    if !(ports_serving && matches!(local, Some(Ok(_)))) {
        for pool in router_config
            .pools
            .iter_mut()
            .filter(|p| local_providers.contains(&p.provider))
        {
            let features = pool.features.get_or_insert_with(Default::default);
            if let Some(slot) = features.slot("features.public_ports") {
                *slot = Some(false);
            }
        }
    }
    let topology = router_config
        .compile()
        .map_err(|e| StartError::Routing(e.to_string()))?;
    Ok((topology, local))
}

/// The names of the providers of kind `local`.
fn local_provider_names(router_config: &sandgate_router::RouterConfig) -> Vec<String> {
    router_config
        .providers
        .iter()
        .filter(|p| {
            p.kind
                .or_else(|| sandgate_router::ProviderKind::from_name(&p.name))
                == Some(sandgate_router::ProviderKind::Local)
        })
        .map(|p| p.name.clone())
        .collect()
}

/// `[ports]`: the ports gateway's listener, on a control-plane replica with local pools,
/// unless disabled. A configured address that cannot be bound fails the start; the default
/// one, taken by something else, is said and the gateway serves without ports (its local
/// pools then declare `public_ports = false`).
async fn bind_ports(config: &Config) -> Result<Option<(SocketAddr, TcpListener)>, StartError> {
    if !config.ports.enabled
        || !config.role.serves_api()
        || local_provider_names(&config.router_config()).is_empty()
    {
        return Ok(None);
    }
    let (addr, configured) = config.ports.listen_addr();
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(Some((addr, listener))),
        Err(source) if !configured => {
            tracing::warn!(%addr, error = %source, "the ports gateway's default address is taken: sandbox ports are not served (set [ports] listen to another address, or enabled = false)");
            Ok(None)
        }
        Err(source) => Err(StartError::Bind {
            what: "ports",
            addr,
            source,
        }),
    }
}

/// The default local pool's resources: what this machine can hold a sandbox to (its CPUs
/// and memory, `[local.max]`), only where it enforces the limit.
fn declare_default_resources(
    pool: &mut sandgate_router::PoolConfig,
    caps: &crate::localbox::Capabilities,
    config: &Config,
) {
    let (_, max) = config.local.limits();
    let resources = &mut pool.resources;
    if caps.cpu_limit {
        resources.cpu = std::thread::available_parallelism()
            .ok()
            .map(|n| (n.get() as f64).min(max.cpu));
    }
    if caps.memory_limit {
        resources.memory_mb = host_memory_mb().map(|mb| mb.min(max.memory_mb));
    }
    if caps.disk_limit {
        resources.disk_gb = Some(max.disk_mb / 1024).filter(|gb| *gb > 0);
    }
    if caps.pids_limit {
        resources.pids = Some(max.pids);
    }
}

/// What every local pool declares of this machine, configured or default: the limits it
/// cannot enforce and the users an exec may pick (labels beside the configured ones), and
/// the seccomp filter on its isolation mode unless the configuration set one.
fn declare_machine_facts(
    pool: &mut sandgate_router::PoolConfig,
    caps: &crate::localbox::Capabilities,
    config: &Config,
) {
    // Declared, not hidden: sandboxes here run without these limits.
    let unenforced = crate::providers::local_limits::unenforced(caps);
    if !unenforced.is_empty() {
        pool.labels
            .insert("sandgate.unenforced_limits".into(), unenforced.join(","));
    }
    // Who an exec may run as, by name (`user` on an exec picks one).
    let users: Vec<String> = config.local.all_users().into_keys().collect();
    pool.labels.insert("sandgate.users".into(), users.join(","));
    // On the pool's isolation mode, where `GET /v1/pools` shows it and a create may require
    // it (`features.isolation: {"kind": "namespace", "seccomp": "enforced"}`).
    if pool.isolation.is_none() {
        let seccomp = if caps.seccomp {
            "enforced"
        } else {
            "unenforced"
        };
        pool.isolation = Some(vec![
            sandgate_router::IsolationMode::kind("namespace").with("seccomp", seccomp)
        ]);
    }
}

/// The pools' topology as the configuration declares it, without looking at this
/// machine (no local runtime, so no cgroup or namespace is touched): what `sandgate config
/// check` validates. `serve` compiles the same pools through [`routing_topology`].
pub fn declared_topology(config: &Config) -> Result<sandgate_router::Topology, StartError> {
    config
        .router_config()
        .compile()
        .map_err(|e| StartError::Routing(e.to_string()))
}

/// The client sandgate reaches token endpoints (OAuth2, GitHub) with: the upstream trust
/// roots, names resolved and vetted like a sandbox's, no proxy from the environment, no
/// redirects (a client secret is never sent on to another place).
fn token_client(
    resolver: &Arc<Resolver>,
    tls: &rustls::ClientConfig,
) -> Result<reqwest::Client, StartError> {
    reqwest::Client::builder()
        .use_preconfigured_tls(tls.clone())
        .dns_resolver(Arc::new(crate::net::resolve::VettedDns(resolver.clone())))
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("sandgate/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| StartError::Http(e.to_string()))
}

#[cfg(test)]
mod bundled_tests {
    /// Every file in policies/ ships inside the binary, so a fresh `sandgate serve` gets all
    /// of them (a file added to the directory but not to the list would silently be missing).
    #[test]
    fn every_policy_file_is_bundled() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bundled = super::BUNDLED_POLICIES.iter().find(|(n, _)| *n == name);
            let bundled =
                bundled.unwrap_or_else(|| panic!("policies/{name} is not in BUNDLED_POLICIES"));
            assert_eq!(bundled.1, std::fs::read_to_string(&path).unwrap());
        }
    }
}
