//! Sandbox creation: the failover coordinator (seed 001, "Creation failover").
//!
//! One sandbox id for every attempt. For each candidate pool in the router's order:
//! 1. **admit** through the `sandgate.creation` and `sandgate.provider` Rego layers, evaluated
//!    for this pool when the walk reaches it (approval of an earlier pool never carries over);
//!    an account without bound credentials cannot serve (advance);
//! 2. **attempt** a provider create tagged with the sandbox and attempt ids, retrying
//!    retryable failures within the provisioning window;
//! 3. **classify**: advance classes try the next pool, terminal classes end the create, an
//!    unknown outcome enters `reconciling` and asks the provider for the tagged instance
//!    before anything else is tried (adopted if it runs; otherwise abandoned and watched by
//!    the janitor, against its own account);
//! 4. **check runtime capabilities** of the running instance against the request; an
//!    instance that falls short is destroyed and the route advances;
//! 5. **keep the first success**.
//!
//! State is durable (SQLite through [`Store`]): a create is owned by a lease that the owner
//! renews; after a crash the lease expires and the create is resumed (any attempt left
//! in flight is treated as an unknown outcome and reconciled first), so no record is lost
//! and no duplicate instance is kept.
//!
//! One concern a file, each with its own `impl Coordinator`: `accept` (the API entry) and
//! `idempotency`; the walk in `walk`, `admit` (step 1), `attempt` (steps 2 and 3, retries and
//! the circuit breaker of `circuit`), `reconcile` (unknown outcomes) and `place` (steps 4 and
//! 5); `snapshot` (creating from saved state); `respond` (the reply to the caller) and `view`;
//! `lifecycle` (timeout, delete); `secrets` (sealed env, token, egress identity); `janitor`
//! (leases, abandoned attempts, expiry, start-up restore), `liveness` and `follow`.

mod accept;
mod admit;
mod attempt;
pub mod body;
pub mod circuit;
pub mod context;
mod dry_run;
pub mod events;
mod follow;
mod idempotency;
mod janitor;
mod lifecycle;
mod liveness;
mod place;
pub mod pools;
mod reconcile;
pub mod record;
mod remote;
mod respond;
mod secrets;
mod snapshot;
mod view;
mod walk;

pub use dry_run::{DryRunPlan, PlanStep, RefusedPool};
pub use remote::{Endpoint, RemoteGateway};
pub use respond::Answer;
pub use view::{EgressView, SandboxPage, SandboxView};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use sandgate_router::{NoEligible, Request, RouteContext, Topology};

use crate::base::clock::now_ms;
use crate::base::ids::random_hex;
use crate::config::CreateConfig;
use crate::credentials::CredentialStore;
use crate::error::{Attempts, Details, Error, Kind};
use crate::identity::IdentityRegistry;
use crate::policy::PolicyEngine;
use crate::providers::ProviderRegistry;
use crate::store::sandboxes::{Fence, SandboxRow};
use crate::store::{Store, StoreError};

use admit::{refusal_reply, Admission};
pub use body::CreateBody;
use context::PoolWindow;
pub(crate) use secrets::token_context;

/// One candidate pool as routing produced it, stored with the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredCandidate {
    pub pool: String,
    pub provider: String,
    pub account: String,
    pub region: Option<String>,
    pub zone: Option<String>,
    /// Whether the portable baseline applies on this pool (checked again at runtime).
    pub baseline: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredPrincipal {
    principal: String,
    workspace: String,
    roles: Vec<String>,
}

/// A stored sandbox, its placement, and the adapter of its pool.
pub struct Located {
    pub row: SandboxRow,
    pub placement: Option<Placement>,
    pub adapter: Option<Arc<dyn crate::providers::Provider>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Placement {
    pub pool: String,
    pub provider: String,
    pub account: String,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub instance_id: String,
    /// The provider's native egress settings the adapter applied (its own field names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockdown: Option<Value>,
    /// The replica that placed it (its id in the replica list). Read for process-local
    /// providers: only that replica can see the instance (see `liveness`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed_by: Option<String>,
}

/// Everything the coordinator needs.
pub struct CreateDeps {
    pub store: Store,
    pub topology: Arc<Topology>,
    pub providers: Arc<ProviderRegistry>,
    pub policy: Arc<PolicyEngine>,
    pub identities: Arc<IdentityRegistry>,
    pub credentials: Arc<CredentialStore>,
    pub config: CreateConfig,
    pub proxy_addr: std::net::SocketAddr,
    pub ca_cert_path: PathBuf,
    /// The proxy port inside local sandboxes (`[local] proxy_port`).
    pub local_proxy_port: u16,
    /// `[proxy] public_url` and the CA, for hosted sandboxes (none: they are not given one).
    pub remote: Option<RemoteGateway>,
}

pub struct Coordinator {
    deps: CreateDeps,
    /// This coordinator's lease owner id.
    owner: String,
    /// Recent per-pool samples (the stats window), kept in memory so that routing does not
    /// scan the samples table on every create; seeded from the store by `restore`.
    samples: std::sync::Mutex<HashMap<String, PoolWindow>>,
    /// Creates this process is driving right now (never driven twice at once).
    active: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The last check of each hosted account (`GET /v1/pools`), see [`pools`].
    account_checks: pools::AccountChecks,
    /// When each sandbox was last checked after a failed operation (see [`liveness`]).
    suspected: std::sync::Mutex<HashMap<String, Instant>>,
    /// Each pool's circuit breaker, shared by every create this process drives.
    circuits: circuit::Circuits,
}

/// A loaded in-flight create.
struct Job {
    row: SandboxRow,
    /// The lease this walk holds; every write it makes is conditional on it.
    fence: Fence,
    principal: StoredPrincipal,
    body: CreateBody,
    request: Arc<Request>,
    candidates: Vec<StoredCandidate>,
}

enum Step {
    Placed,
    Advance,
    End(Error),
}

/// A failure the client cannot act on: logged here, shown as a generic 500. A store that
/// cannot be reached is not such a failure: it answers 503 `store_unavailable` (see
/// [`store_unavailable`]), which is why the error's type is looked at here, in the one place
/// every store error of the API passes through.
pub fn internal<E: std::fmt::Display + 'static>(e: E) -> Error {
    let any: &dyn std::any::Any = &e;
    let unavailable = match any.downcast_ref::<StoreError>() {
        Some(store) => store.is_unavailable(),
        None => any
            .downcast_ref::<crate::credentials::CredentialError>()
            .is_some_and(|c| matches!(c, crate::credentials::CredentialError::Store(s) if s.is_unavailable())),
    };
    if unavailable {
        tracing::warn!(error = %e, "the store is unreachable; answering store_unavailable");
        metrics::counter!("sandgate_store_unavailable_total").increment(1);
        return Error::store_unavailable();
    }
    tracing::error!(error = %e, "sandbox operation failed");
    Error::internal()
}

impl Coordinator {
    pub fn new(deps: CreateDeps) -> Arc<Coordinator> {
        let circuits = circuit::Circuits::new(
            deps.config.circuit_failure_threshold,
            Duration::from_millis(deps.config.circuit_open_ms),
        );
        Arc::new(Coordinator {
            circuits,
            deps,
            owner: format!("coord-{}", random_hex(8)),
            active: Default::default(),
            samples: Default::default(),
            account_checks: Default::default(),
            suspected: Default::default(),
        })
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.deps.topology
    }

    pub fn providers(&self) -> &Arc<ProviderRegistry> {
        &self.deps.providers
    }

    pub fn store(&self) -> &Store {
        &self.deps.store
    }

    fn lease_expiry(&self) -> i64 {
        now_ms() + self.deps.config.lease_ttl_ms as i64
    }

    /// What routing depends on besides the topology and the request: measured per-pool
    /// latency and success within the window, existing placements, band widths.
    pub async fn route_context(&self) -> Result<RouteContext, StoreError> {
        self.route_context_for(None, None).await
    }

    /// As [`Coordinator::route_context`]; existing placements are read only when the
    /// request has sandbox affinity, anti-affinity or spread terms that compare against them.
    /// The per-pool stats come from the in-memory window; everything else is read from the
    /// store by [`context::Inputs::assemble`], which `sandgate route explain` shares.
    pub async fn route_context_for(
        &self,
        request: Option<&Request>,
        workspace: Option<&str>,
    ) -> Result<RouteContext, StoreError> {
        let since = now_ms() - self.deps.config.stats_window_secs as i64 * 1000;
        let stats = self.window_stats(since);
        let inputs = context::Inputs {
            store: &self.deps.store,
            topology: &self.deps.topology,
            config: &self.deps.config,
        };
        inputs.assemble(stats, request, workspace).await
    }

    /// Records one create outcome on `pool` for routing: in this process's window at once,
    /// and in the store for the other replicas and for a restart.
    async fn sample(&self, pool: &str, success: bool, latency_ms: Option<f64>) {
        let at = now_ms();
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(pool.to_string())
            .or_default()
            .push(at, success, latency_ms);
        if let Err(e) = self
            .deps
            .store
            .record_sample(pool, at, success, latency_ms)
            .await
        {
            tracing::warn!(pool, error = %e, "could not record a routing sample");
        }
    }
}

/// `no_eligible_provider`, with the router's ruled-out pools as `details.attempts`.
pub fn no_eligible_reply(no: NoEligible) -> Error {
    Error::new(Kind::Unprocessable, "no_eligible_provider", no.message).with_details(Details {
        attempts: Some(Attempts::Ruled(no.details.attempts)),
        ..Details::default()
    })
}
