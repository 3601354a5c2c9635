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

pub mod body;
pub mod circuit;
pub mod context;
mod dry_run;
pub mod events;
mod follow;
mod liveness;
pub mod pools;
pub mod record;
mod remote;

pub use remote::{Endpoint, RemoteGateway};

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use sandgate_router::{
    EgressEnforcement, NoEligible, ProviderKind, Request, RouteContext, Topology,
};

use crate::base::clock::now_ms;
use crate::base::ids::random_hex;
use crate::base::Principal;
use crate::config::CreateConfig;
use crate::credentials::{CredentialStore, Secret};
use crate::error::ErrorReply;
use crate::identity::{Identity, IdentityRegistry};
use crate::policy::PolicyEngine;
use crate::providers::{
    CreateSpec, ErrorClass, InstanceState, Outcome, ProviderError, ProviderRegistry, RemoteEgress,
    Tags,
};
use crate::store::sandboxes::{
    AbandonedRow, AttemptEnd, AttemptRow, Fence, IdempotencyClaim, InsertOutcome, ListFilter,
    SandboxRow, IN_FLIGHT_STATES,
};
use crate::store::snapshots::SnapshotRow;
use crate::store::{Store, StoreError};

pub use body::CreateBody;
use context::PoolWindow;

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
    End(ErrorReply),
}

/// What [`Coordinator::admit`] decided for one candidate.
enum Admission {
    /// Create on this pool.
    Attempt(Arc<dyn crate::providers::Provider>),
    /// Not this pool; the walk advances (an attempt records why).
    Skip { class: ErrorClass, message: String },
    /// A policy layer refused: the create ends.
    Refused {
        class: ErrorClass,
        layer: &'static str,
        reasons: Vec<String>,
    },
}

/// The create's error when a policy layer refused it on `pool`.
fn refusal_reply(class: ErrorClass, layer: &str, pool: &str, reasons: Vec<String>) -> ErrorReply {
    let code = match class {
        ErrorClass::Billing => "billing_refused",
        ErrorClass::Authority => "forbidden",
        _ => "policy_denied",
    };
    ErrorReply::new(
        StatusCode::FORBIDDEN,
        code,
        format!(
            "creation on pool {pool} was refused: {}",
            reasons.join("; ")
        ),
    )
    .with_details(json!({"layer": layer, "pool": pool, "reasons": reasons}))
}

/// A failure the client cannot act on: logged here, shown as a generic 500. A store that
/// cannot be reached is not such a failure: it answers 503 `store_unavailable` (see
/// [`store_unavailable`]), which is why the error's type is looked at here, in the one place
/// every store error of the API passes through.
pub fn internal<E: std::fmt::Display + 'static>(e: E) -> ErrorReply {
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
        return store_unavailable();
    }
    tracing::error!(error = %e, "sandbox operation failed");
    ErrorReply::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the sandbox operation could not be completed",
    )
}

/// 503 `store_unavailable`: the database did not answer within `[store] acquire_timeout_ms`.
/// Retryable: the call that failed committed nothing, so the same request (and the same
/// `Idempotency-Key`) is safe to send again; `Retry-After: 1` goes with it.
pub fn store_unavailable() -> ErrorReply {
    ErrorReply::new(
        StatusCode::SERVICE_UNAVAILABLE,
        crate::error::STORE_UNAVAILABLE,
        "the store is unreachable; retry (the same Idempotency-Key is safe to send again)",
    )
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

    // ---------------------------------------------------------------- create (API entry)

    /// `POST /v1/sandboxes`. Returns the status (`201` placed, `202` still working) and the
    /// response body. The create that made the sandbox carries its egress token, the only
    /// place it is ever shown; a replay of it (same `Idempotency-Key` and body) is the same
    /// sandbox with `egress.token_already_shown: true` and no token.
    pub async fn create(
        self: &Arc<Self>,
        caller: &Principal,
        body: Value,
        idempotency_key: Option<String>,
    ) -> Result<(StatusCode, Value), ErrorReply> {
        let body = CreateBody::parse(body).map_err(|e| {
            ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("`{}`: {}", e.field, e.message),
            )
            .with_details(json!({"field": e.field}))
        })?;
        let workspace = body
            .workspace
            .clone()
            .unwrap_or_else(|| caller.workspace.clone());
        if !caller.may_manage(&workspace) {
            return Err(ErrorReply::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("this principal may not create sandboxes in workspace {workspace:?}"),
            ));
        }
        if let Some(key) = &idempotency_key {
            if key.is_empty() || key.len() > 255 {
                return Err(ErrorReply::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "Idempotency-Key must be 1 to 255 characters",
                ));
            }
        }
        let digest = body.digest(&workspace);
        let now = now_ms();
        // A dry run neither claims nor looks up the key: it is not the create the key names.
        if let Some(key) = idempotency_key.as_ref().filter(|_| !body.dry_run) {
            if let Some((hash, sandbox_id)) = self
                .deps
                .store
                .find_idempotency_key(&workspace, key, now)
                .await
                .map_err(internal)?
            {
                return self.replay(&hash, &digest, &sandbox_id).await;
            }
        }

        // Credentials must exist in the workspace (bound again, by name, when it runs).
        let id = format!("sb-{}", random_hex(12));
        Identity::new(
            id.clone(),
            Vec::new(),
            workspace.clone(),
            vec![],
            BTreeMap::new(),
        )
        .bind(
            None,
            &body.credentials,
            self.deps.credentials.as_ref(),
            |i| format!("credentials[{i}]"),
        )
        .map_err(|e| {
            let (key, message) = match &e {
                crate::identity::IdentityError::Binding { key, message } => {
                    (key.clone(), message.clone())
                }
                other => ("credentials".into(), other.to_string()),
            };
            ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("`{key}`: {message}"),
            )
            .with_details(json!({"field": key}))
        })?;

        let request = body.request.clone();
        let ctx = self
            .route_context_for(Some(&request), Some(&workspace))
            .await
            .map_err(internal)?;
        let (route, explanation) = sandgate_router::route_recorded(
            &self.deps.topology,
            &request,
            &ctx,
            record::INELIGIBLE_POOLS_KEPT,
        );
        let route = match route {
            Ok(route) => route,
            Err(no) => return Err(no_eligible_reply(no)),
        };
        let snapshot = match &body.snapshot {
            Some(snapshot) => Some(self.snapshot_row(snapshot, &workspace).await?),
            None => None,
        };
        let candidates: Vec<StoredCandidate> = route
            .candidates
            .iter()
            .filter(|c| {
                snapshot
                    .as_ref()
                    .is_none_or(|s| self.restorable_on(s, &c.pool))
            })
            .map(|c| StoredCandidate {
                pool: c.pool.to_string(),
                provider: c.provider.to_string(),
                account: c.account.to_string(),
                region: c.region.as_deref().map(str::to_string),
                zone: c.zone.as_deref().map(str::to_string),
                baseline: c.baseline,
            })
            .collect();
        if let (Some(snapshot), true) = (&snapshot, candidates.is_empty()) {
            return Err(self.unrestorable(snapshot, &route));
        }
        let record = record::PlacementRecord::new(
            now,
            &ctx,
            self.deps.config.stats_window_secs,
            &explanation,
            snapshot.as_ref().map(|s| (s, &route)),
            &candidates,
        );
        if body.dry_run {
            let plan = self.dry_run(caller, &id, &workspace, &body, &candidates, &record);
            return Ok((StatusCode::OK, plan));
        }

        let token = random_hex(24);
        let sealed = self
            .deps
            .credentials
            .key()
            .seal(&Secret::new(token.clone()), &token_context(&id))
            .map_err(internal)?;
        let row = SandboxRow {
            id: id.clone(),
            workspace: workspace.clone(),
            principal_json: serde_json::to_string(&StoredPrincipal {
                principal: caller.principal.clone(),
                workspace: caller.workspace.clone(),
                roles: caller.roles.clone(),
            })
            .map_err(internal)?,
            state: "pending".into(),
            request_json: self.stored_body(&body, &id)?,
            labels_json: serde_json::to_string(&request.labels).map_err(internal)?,
            candidates_json: serde_json::to_string(&candidates).map_err(internal)?,
            placement_json: None,
            placement_record_json: Some(record.to_json()),
            error_json: None,
            token_sealed: sealed,
            created_ms: now,
            updated_ms: now,
            expires_ms: body.ttl_secs.map(|t| now + t as i64 * 1000),
        };
        let claim = idempotency_key.as_deref().map(|key| IdempotencyClaim {
            key,
            body_hash: &digest,
            expires_ms: now + self.deps.config.idempotency_ttl_secs as i64 * 1000,
        });
        match self
            .deps
            .store
            .insert_sandbox(&row, &self.owner, self.lease_expiry(), claim, now)
            .await
            .map_err(internal)?
        {
            InsertOutcome::Created => {}
            InsertOutcome::Existing {
                sandbox_id,
                body_hash,
            } => return self.replay(&body_hash, &digest, &sandbox_id).await,
        }
        metrics::counter!("sandgate_sandbox_creates_total").increment(1);

        let this = self.clone();
        let job_id = id.clone();
        let mut handle = tokio::spawn(async move { this.drive(&job_id).await });
        let wait = Duration::from_millis(self.deps.config.short_wait_ms);
        let _ = tokio::time::timeout(wait, &mut handle).await;
        self.respond(&id, Some(&token)).await
    }

    /// Whether `snapshot` can seed a sandbox on `pool`: a provider snapshot only where it
    /// was taken (its provider and account), a filesystem export wherever files are written.
    fn restorable_on(&self, snapshot: &SnapshotRow, pool: &str) -> bool {
        if snapshot.kind == crate::store::snapshots::FILESYSTEM_EXPORT {
            let topo = &self.deps.topology;
            return topo
                .pool(pool)
                .is_some_and(|p| p.capabilities.filesystem.write);
        }
        snapshot.pool == pool
    }

    /// The refusal of a create whose snapshot no candidate pool can restore, with an
    /// `unmet_requirements` entry per pool the route ranked.
    fn unrestorable(&self, snapshot: &SnapshotRow, route: &sandgate_router::Route) -> ErrorReply {
        let why = record::unrestorable_reason(snapshot);
        let attempts: Vec<Value> = route
            .candidates
            .iter()
            .map(|c| json!({"provider": c.provider, "pool": c.pool, "unmet_requirements": [why]}))
            .collect();
        ErrorReply::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_eligible_pool",
            format!("no pool this request may use can restore snapshot {}", snapshot.id),
        )
        .with_details(json!({"field": "snapshot", "pool": snapshot.pool, "kind": snapshot.kind, "attempts": attempts}))
    }

    /// A snapshot of this workspace (the same answer for "absent" and "another
    /// workspace's", so ids of other workspaces stay private).
    async fn snapshot_row(
        &self,
        snapshot: &str,
        workspace: &str,
    ) -> Result<SnapshotRow, ErrorReply> {
        match self
            .deps
            .store
            .get_snapshot(snapshot)
            .await
            .map_err(internal)?
        {
            Some(row) if row.workspace == workspace => Ok(row),
            _ => Err(ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("`snapshot`: no snapshot {snapshot:?} in workspace {workspace:?}"),
            )
            .with_details(json!({"field": "snapshot"}))),
        }
    }

    /// Same key: the same sandbox, when the body is the same too, without its token (that
    /// was shown once, to the create that made it; see [`Coordinator::respond`]).
    async fn replay(
        &self,
        held_hash: &str,
        digest: &str,
        sandbox_id: &str,
    ) -> Result<(StatusCode, Value), ErrorReply> {
        if held_hash != digest {
            return Err(ErrorReply::new(
                StatusCode::CONFLICT,
                "idempotency_conflict",
                "this Idempotency-Key was used with a different request body",
            )
            .with_details(json!({"sandbox_id": sandbox_id})));
        }
        // Give the original request's short wait a chance to finish, then answer as it did.
        // Local waits run on the monotonic clock: a wall-clock step must not cut or stretch them.
        let deadline = Instant::now() + Duration::from_millis(self.deps.config.short_wait_ms);
        loop {
            let row = self
                .deps
                .store
                .get_sandbox(sandbox_id)
                .await
                .map_err(internal)?;
            let in_flight = row
                .as_ref()
                .is_some_and(|r| IN_FLIGHT_STATES.contains(&r.state.as_str()));
            if !in_flight || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.respond(sandbox_id, None).await
    }

    /// The create response: 201 when running, 202 while working, the failure otherwise.
    /// `token` is the egress token, given only by the create that made the sandbox: the
    /// response then shows it (`egress.token`, and in `egress.proxy_url` and the proxy
    /// variables unless the sandbox's proxy is inside it) with `egress.token_already_shown:
    /// false`. Without it (a replay) the egress block is the one `GET` shows, the token's
    /// place marked `{token}`, with `token_already_shown: true`: a token shown twice is a
    /// token that can leak twice, from a retrying client's logs or a shared key.
    /// Waits (up to `within`) for a create still being placed to settle, then answers as a
    /// create would: the sandbox, or the refusal it ended in. For front ends whose protocol
    /// has no "accepted, still placing" answer (the E2B facade). Its status is 202 when the
    /// wait ran out first.
    pub async fn settle(
        &self,
        id: &str,
        within: Duration,
    ) -> Result<(StatusCode, Value), ErrorReply> {
        let deadline = Instant::now() + within;
        loop {
            let row = self.deps.store.get_sandbox(id).await.map_err(internal)?;
            let placing = row.as_ref().is_some_and(|r| {
                matches!(r.state.as_str(), "pending" | "provisioning" | "reconciling")
            });
            if !placing {
                return self.respond(id, None).await;
            }
            if Instant::now() >= deadline {
                let (_, view) = self.respond(id, None).await?;
                return Ok((StatusCode::ACCEPTED, view));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn respond(
        &self,
        id: &str,
        token: Option<&str>,
    ) -> Result<(StatusCode, Value), ErrorReply> {
        let view = self
            .view(id)
            .await?
            .ok_or_else(|| internal("sandbox vanished"))?;
        let state = view["state"].as_str().unwrap_or_default().to_string();
        if state == "failed" {
            let error = view["error"].clone();
            let code = error["error"]["code"].as_str().unwrap_or("creation_failed");
            let status = match code {
                "forbidden" | "policy_denied" | "billing_refused" => StatusCode::FORBIDDEN,
                "invalid_request" => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let mut reply = ErrorReply::new(
                status,
                static_code(code),
                error["error"]["message"]
                    .as_str()
                    .unwrap_or("sandbox creation failed")
                    .to_string(),
            );
            let mut details = error["error"]["details"].clone();
            if !details.is_object() {
                details = json!({});
            }
            details["sandbox_id"] = json!(id);
            details["attempts"] = view["attempts"].clone();
            reply = reply.with_details(details);
            return Err(reply);
        }
        let mut body = view;
        body["egress"]["token_already_shown"] = json!(token.is_none());
        if let Some(token) = token {
            // A local sandbox's proxy is inside it and needs no credentials.
            let endpoint = self.endpoint(body["placement"]["pool"].as_str(), id);
            let egress = &mut body["egress"];
            egress["token"] = json!(token);
            if endpoint.takes_token() {
                let url = endpoint.url_with(token);
                egress["proxy_url"] = json!(url);
                if let Some(env) = egress["env"].as_object_mut() {
                    for var in crate::localbox::PROXY_ENV_VARS {
                        env.insert(var.into(), json!(url));
                    }
                }
            }
        }
        let status = if state == "running" {
            StatusCode::CREATED
        } else {
            StatusCode::ACCEPTED
        };
        Ok((status, body))
    }

    // ------------------------------------------------------------------- read / list

    /// The sandbox as `GET` shows it: never the token.
    pub async fn view(&self, id: &str) -> Result<Option<Value>, ErrorReply> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        let attempts = self.deps.store.list_attempts(id).await.map_err(internal)?;
        let mut view = self.render(&row, &attempts);
        view["placement_record"] = record::stored(row.placement_record_json.as_deref());
        Ok(Some(view))
    }

    /// A sandbox as listed; [`Coordinator::view`] adds its placement record (kept out of
    /// list pages: it explains every pool, and a page holds up to a hundred sandboxes).
    fn render(&self, row: &SandboxRow, attempts: &[AttemptRow]) -> Value {
        let mut request: Value = serde_json::from_str(&row.request_json).unwrap_or(Value::Null);
        if let Some(o) = request.as_object_mut() {
            // Values of `env` are sealed and never shown; their names are.
            o.remove("env_sealed");
            if let Some(Value::Object(env)) = o.get_mut("env") {
                for value in env.values_mut() {
                    *value = json!("(sealed)");
                }
            }
        }
        let labels: Value = serde_json::from_str(&row.labels_json).unwrap_or(json!({}));
        let placement: Value = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or(Value::Null);
        let error: Value = row
            .error_json
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or(Value::Null);
        let attempts: Vec<Value> = attempts
            .iter()
            .map(|a| {
                json!({
                    "id": a.id, "seq": a.seq, "pool": a.pool, "provider": a.provider,
                    "account": a.account, "state": a.state, "outcome": a.outcome,
                    "error_class": a.error_class, "message": a.message,
                    "instance_id": a.instance_id, "started_ms": a.started_ms,
                    "finished_ms": a.finished_ms,
                    "duration_ms": a.finished_ms.map(|f| f - a.started_ms),
                    "retries": a.retries_json.as_deref()
                        .and_then(|r| serde_json::from_str::<Value>(r).ok())
                        .unwrap_or_else(|| json!([])),
                })
            })
            .collect();
        let endpoint = self.endpoint(placement["pool"].as_str(), &row.id);
        let (proxy_base, proxy, ca) = (
            endpoint.base.clone(),
            endpoint.url_template.clone(),
            endpoint.ca_path.clone(),
        );
        let mut env = serde_json::Map::new();
        for var in crate::localbox::PROXY_ENV_VARS {
            env.insert(var.into(), json!(proxy));
        }
        env.insert("NO_PROXY".into(), json!(crate::localbox::NO_PROXY));
        env.insert("no_proxy".into(), json!(crate::localbox::NO_PROXY));
        for var in crate::localbox::CA_ENV_VARS {
            env.insert(var.to_string(), json!(ca));
        }
        json!({
            "id": row.id,
            "workspace": row.workspace,
            "state": row.state,
            "labels": labels,
            "request": request,
            "placement": placement,
            "attempts": attempts,
            "error": error,
            "created_ms": row.created_ms,
            "updated_ms": row.updated_ms,
            "expires_ms": row.expires_ms,
            "egress": {
                "identity": row.id,
                "enforcement": endpoint.enforcement,
                "proxy": proxy_base,
                "proxy_url": proxy,
                "ca_cert_path": ca,
                "env": env,
            },
        })
    }

    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Value>, ErrorReply> {
        let rows = self
            .deps
            .store
            .list_sandboxes(filter)
            .await
            .map_err(internal)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let attempts = self
                .deps
                .store
                .list_attempts(&row.id)
                .await
                .map_err(internal)?;
            out.push(self.render(&row, &attempts));
        }
        Ok(out)
    }

    // ------------------------------------------------------------------------- lifetime

    /// Sets a sandbox's lifetime to end `ttl_secs` from now (E2B's `set_timeout`): longer
    /// or shorter than before. `None` when there is no such sandbox that is not deleted.
    pub async fn set_timeout(&self, id: &str, ttl_secs: u64) -> Result<Option<Value>, ErrorReply> {
        let now = now_ms();
        let set = self
            .deps
            .store
            .set_sandbox_expiry(id, now + ttl_secs as i64 * 1000, now)
            .await
            .map_err(internal)?;
        if !set {
            return Ok(None);
        }
        if let Some(located) = self.locate(id).await? {
            if let (Some(adapter), Some(placement)) = (&located.adapter, &located.placement) {
                if matches!(located.row.state.as_str(), "running" | "paused") {
                    self.align_lifetime(adapter.as_ref(), &located.row, &placement.instance_id)
                        .await;
                }
            }
        }
        self.view(id).await
    }

    /// Deletes the sandboxes whose lifetime has ended. Every replica's janitor may find the
    /// same one; deleting it twice is harmless.
    async fn expire_sandboxes(&self, now: i64) {
        let ids = match self.deps.store.expired_sandboxes(now, 100).await {
            Ok(ids) => ids,
            Err(e) => return tracing::warn!(error = %e, "janitor: cannot list expired sandboxes"),
        };
        for id in ids {
            tracing::info!(sandbox = %id, "the sandbox's lifetime ended; deleting it");
            match self.delete(&id).await {
                Ok(_) => metrics::counter!("sandgate_sandboxes_expired_total").increment(1),
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e.message, "cannot delete an expired sandbox")
                }
            }
        }
    }

    // ------------------------------------------------------------------------- delete

    /// Revokes the egress identity at once, marks the sandbox deleted, and deletes its
    /// instance (left to the janitor when the provider does not answer).
    pub async fn delete(&self, id: &str) -> Result<Option<Value>, ErrorReply> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        self.deps.identities.revoke(id);
        let now = now_ms();
        self.deps
            .store
            .transition_sandbox(
                id,
                &[
                    "pending",
                    "provisioning",
                    "reconciling",
                    "running",
                    "paused",
                    "failed",
                    "stopped",
                ],
                "deleted",
                None,
                None,
                now,
            )
            .await
            .map_err(internal)?;
        if let Some(p) = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str::<Placement>(p).ok())
        {
            self.destroy(
                id,
                &p.pool,
                &p.account,
                &format!("{id}-placed"),
                &p.instance_id,
                "deleted",
            )
            .await;
        }
        self.view(id).await
    }

    /// Deletes an instance; when that fails, the janitor keeps trying.
    async fn destroy(
        &self,
        sandbox_id: &str,
        pool: &str,
        account: &str,
        attempt_id: &str,
        instance_id: &str,
        reason: &str,
    ) {
        let deleted = match self.deps.providers.for_pool(pool) {
            Some(p) => p.delete(instance_id).await.is_ok(),
            None => false,
        };
        if !deleted {
            let now = now_ms();
            let _ = self
                .deps
                .store
                .record_abandoned(
                    &AbandonedRow {
                        attempt_id: attempt_id.to_string(),
                        sandbox_id: sandbox_id.to_string(),
                        pool: pool.to_string(),
                        account: account.to_string(),
                    },
                    reason,
                    now,
                    now + self.deps.config.abandoned_watch_secs as i64 * 1000,
                )
                .await;
        }
    }

    // -------------------------------------------------------------------- the walk

    async fn load_job(&self, id: &str, fence: Fence) -> Result<Option<Job>, StoreError> {
        let Some(row) = self.deps.store.get_sandbox(id).await? else {
            return Ok(None);
        };
        let parse = |what: &str, e: serde_json::Error| StoreError::Open {
            path: format!("sandbox {id}"),
            reason: format!("stored {what} is unreadable: {e}"),
        };
        let principal: StoredPrincipal =
            serde_json::from_str(&row.principal_json).map_err(|e| parse("principal", e))?;
        let mut body: CreateBody =
            serde_json::from_str(&row.request_json).map_err(|e| parse("request", e))?;
        self.open_env(&mut body, id)
            .map_err(|reason| StoreError::Open {
                path: format!("sandbox {id}"),
                reason,
            })?;
        let candidates: Vec<StoredCandidate> =
            serde_json::from_str(&row.candidates_json).map_err(|e| parse("candidates", e))?;
        Ok(Some(Job {
            request: Arc::new(body.request.clone()),
            fence,
            row,
            principal,
            body,
            candidates,
        }))
    }

    /// Runs (or resumes) one create to its end.
    pub async fn drive(self: &Arc<Self>, id: &str) {
        if !self
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string())
        {
            return;
        }
        let result = self.drive_inner(id).await;
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        match result {
            Ok(()) => {}
            // Another coordinator took the create over (this one was paused or cut off
            // past its lease): it continues from the record; this walk only stops.
            Err(StoreError::Fenced { .. }) => {
                metrics::counter!("sandgate_create_fenced_total").increment(1);
                tracing::warn!(
                    sandbox = id,
                    "lost the create's lease to another coordinator; stopping this walk"
                );
            }
            Err(e) => {
                // Release the lease (the heartbeat would otherwise keep it alive) so the
                // janitor resumes the create shortly; attempts left in flight are
                // reconciled first. Only a lease still this coordinator's is released.
                tracing::error!(sandbox = id, error = %e, "create coordinator stopped; it will be resumed");
                if let Ok(Some(fence)) = self.deps.store.lease_fence(id).await {
                    if fence.owner == self.owner {
                        let _ = self
                            .deps
                            .store
                            .release_lease(id, now_ms() + 1000, &fence)
                            .await;
                    }
                }
            }
        }
    }

    async fn drive_inner(self: &Arc<Self>, id: &str) -> Result<(), StoreError> {
        // Only a create whose lease this coordinator holds is driven, under that lease's
        // epoch (a create inserted here, or claimed by this janitor).
        let Some(fence) = self
            .deps
            .store
            .lease_fence(id)
            .await?
            .filter(|f| f.owner == self.owner)
        else {
            return Ok(());
        };
        let Some(job) = self.load_job(id, fence).await? else {
            return Ok(());
        };
        if !IN_FLIGHT_STATES.contains(&job.row.state.as_str()) {
            return Ok(());
        }
        let attempts = self.deps.store.list_attempts(id).await?;
        let mut seq = attempts.iter().map(|a| a.seq).max().unwrap_or(0);
        // A success recorded just before a crash: finish it.
        if let Some(done) = attempts.iter().find(|a| a.state == "succeeded") {
            if let Some(instance) = &done.instance_id {
                let cand = job.candidates.iter().find(|c| c.pool == done.pool).cloned();
                if let Some(cand) = cand {
                    self.place(&job, &cand, done, instance).await?;
                    return Ok(());
                }
            }
        }
        // Attempts left in flight by a dead coordinator have an unknown outcome: reconcile
        // each before anything else is tried.
        for a in attempts
            .iter()
            .filter(|a| a.state == "in_flight" || a.state == "reconciling")
        {
            let cand = job.candidates.iter().find(|c| c.pool == a.pool).cloned();
            let Some(cand) = cand else { continue };
            match self.reconcile(&job, &cand, a).await? {
                Step::Placed => return Ok(()),
                Step::End(e) => return self.fail(&job, e).await,
                Step::Advance => {}
            }
        }
        let tried: Vec<&str> = attempts.iter().map(|a| a.pool.as_str()).collect();
        let mut first = true;
        for cand in job
            .candidates
            .iter()
            .filter(|c| !tried.contains(&c.pool.as_str()))
        {
            if !first {
                let still = self.deps.store.get_sandbox(id).await?;
                if !still.is_some_and(|r| IN_FLIGHT_STATES.contains(&r.state.as_str())) {
                    return Ok(()); // deleted meanwhile
                }
            }
            first = false;
            seq += 1;
            match self.try_pool(&job, cand, seq).await? {
                Step::Placed => return Ok(()),
                Step::Advance => continue,
                Step::End(e) => return self.fail(&job, e).await,
            }
        }
        let attempts = self.deps.store.list_attempts(id).await?;
        let summary: Vec<Value> = attempts
            .iter()
            .map(|a| json!({"pool": a.pool, "provider": a.provider, "account": a.account, "error_class": a.error_class}))
            .collect();
        self.fail(
            &job,
            ErrorReply::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "creation_failed",
                format!(
                    "every candidate pool was tried and none could place the sandbox ({} attempt(s))",
                    attempts.len()
                ),
            )
            .with_details(json!({"attempts": summary})),
        )
        .await
    }

    async fn fail(&self, job: &Job, error: ErrorReply) -> Result<(), StoreError> {
        let error_json = serde_json::to_string(&error.body()).unwrap_or_default();
        self.deps
            .store
            .transition_fenced(
                &job.row.id,
                &IN_FLIGHT_STATES,
                "failed",
                None,
                Some(&error_json),
                now_ms(),
                &job.fence,
            )
            .await?;
        metrics::counter!("sandgate_sandbox_create_failures_total", "code" => error.code)
            .increment(1);
        Ok(())
    }

    fn admission_input(&self, job: &Job, cand: &StoredCandidate, seq: i64) -> Value {
        let topo = &self.deps.topology;
        let pool = topo.pool(&cand.pool);
        let provider = topo.provider(&cand.provider);
        let account = pool.and_then(|p| topo.accounts().get(p.account));
        json!({
            "phase": "admit",
            "principal": {
                "principal": job.principal.principal,
                "workspace": job.principal.workspace,
                "roles": job.principal.roles,
            },
            "workspace": job.row.workspace,
            "sandbox": {"id": job.row.id, "workspace": job.row.workspace, "labels": job.request.labels},
            "request": job.body.policy_view(),
            "pool": pool.map(|p| json!({
                "name": p.name.as_ref(),
                "provider": cand.provider,
                "provider_kind": provider.map(|p| p.kind.as_str()),
                "account": cand.account,
                "geography": p.geography,
                "region": p.region.as_deref(),
                "zone": p.zone.as_deref(),
                "labels": p.labels,
                "vpc": p.vpc,
                "price": p.price,
                "standby": p.standby,
                "egress": p.capabilities.egress.as_str(),
            })),
            "account": account.map(|a| json!({
                "name": a.name.as_ref(),
                "provider": cand.provider,
                "billing": a.billing,
                "labels": a.labels,
                "credential_bound": a.credential.is_some(),
            })),
            "attempt": {"number": seq},
        })
    }

    async fn start_attempt(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
        state: &str,
    ) -> Result<AttemptRow, StoreError> {
        let row = AttemptRow {
            id: format!("{}-a{seq}", job.row.id),
            sandbox_id: job.row.id.clone(),
            seq,
            pool: cand.pool.clone(),
            provider: cand.provider.clone(),
            account: cand.account.clone(),
            state: state.into(),
            outcome: None,
            error_class: None,
            message: None,
            instance_id: None,
            started_ms: now_ms(),
            finished_ms: None,
            retries_json: None,
        };
        self.deps.store.insert_attempt(&row, &job.fence).await?;
        Ok(row)
    }

    async fn end_attempt(
        &self,
        job: &Job,
        attempt: &AttemptRow,
        state: &str,
        class: ErrorClass,
        message: &str,
        instance_id: Option<&str>,
    ) -> Result<(), StoreError> {
        let outcome = match class.outcome() {
            Outcome::Advance => "advance",
            Outcome::Terminal => "terminal",
            Outcome::Unknown => "unknown",
        };
        self.deps
            .store
            .finish_attempt(
                &attempt.id,
                &AttemptEnd {
                    state,
                    outcome,
                    error_class: Some(class.as_str()),
                    message: Some(message),
                    instance_id,
                    finished_ms: now_ms(),
                },
                &job.fence,
            )
            .await
    }

    /// Whether the walk may attempt `cand` now, and why not: the `sandgate.creation` and
    /// `sandgate.provider` layers for this pool (a refusal ends the create), then an
    /// account without bound credentials or a provider without an adapter (the walk
    /// advances). Records nothing, so a dry run asks exactly what the walk asks.
    fn admit(&self, job: &Job, cand: &StoredCandidate, seq: i64) -> Admission {
        self.admit_with(job, cand, seq, false)
    }

    /// [`Coordinator::admit`]; `dry_run` is given to the policies as `input.dry_run`.
    fn admit_with(&self, job: &Job, cand: &StoredCandidate, seq: i64, dry_run: bool) -> Admission {
        let mut input = self.admission_input(job, cand, seq);
        input["dry_run"] = json!(dry_run);
        let input = regorus::Value::from(input);
        let creation = self.deps.policy.evaluate("creation", input.clone());
        if !creation.allowed {
            return Admission::Refused {
                class: ErrorClass::Authority,
                layer: "creation",
                reasons: creation.reasons,
            };
        }
        let provider_layer = self.deps.policy.evaluate("provider", input);
        let topo = &self.deps.topology;
        let account = topo
            .pool(&cand.pool)
            .and_then(|p| topo.accounts().get(p.account));
        if !provider_layer.allowed {
            let billing_bad =
                account.is_some_and(|a| a.billing != sandgate_router::BillingStanding::Good);
            return Admission::Refused {
                class: if billing_bad {
                    ErrorClass::Billing
                } else {
                    ErrorClass::Policy
                },
                layer: "provider",
                reasons: provider_layer.reasons,
            };
        }
        // The account must have credentials bound (sandgate's own providers need none).
        let kind = topo.provider(&cand.provider).map(|p| p.kind);
        let bound = account.is_some_and(|a| a.bound);
        if !bound && !matches!(kind, Some(ProviderKind::Simulated | ProviderKind::Local)) {
            return Admission::Skip {
                class: ErrorClass::UnboundAccount,
                message: "the pool's account has no credential bound".into(),
            };
        }
        match self.deps.providers.for_pool(&cand.pool) {
            Some(adapter) => Admission::Attempt(adapter),
            None => Admission::Skip {
                class: ErrorClass::Unsupported,
                message: format!(
                    "this build has no adapter for provider kind {}",
                    kind.map(|k| k.as_str()).unwrap_or("?")
                ),
            },
        }
    }

    async fn try_pool(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
    ) -> Result<Step, StoreError> {
        // (a) admit, for this pool, now.
        let adapter = match self.admit(job, cand, seq) {
            Admission::Attempt(adapter) => adapter,
            Admission::Skip { class, message } => {
                let attempt = self.start_attempt(job, cand, seq, "advanced").await?;
                self.end_attempt(job, &attempt, "advanced", class, &message, None)
                    .await?;
                return Ok(Step::Advance);
            }
            Admission::Refused {
                class,
                layer,
                reasons,
            } => {
                let attempt = self.start_attempt(job, cand, seq, "ended").await?;
                let message = format!("refused by layer {layer}: {}", reasons.join("; "));
                self.end_attempt(job, &attempt, "ended", class, &message, None)
                    .await?;
                return Ok(Step::End(refusal_reply(class, layer, &cand.pool, reasons)));
            }
        };

        // (b) attempt. A pool whose provider keeps failing is skipped at once (its circuit is
        // open): nothing is sent to a provider that is down.
        if let circuit::Permit::Open(why) = self.circuits.permit(&cand.pool) {
            let attempt = self.start_attempt(job, cand, seq, "advanced").await?;
            self.end_attempt(
                job,
                &attempt,
                "advanced",
                ErrorClass::CircuitOpen,
                &why,
                None,
            )
            .await?;
            return Ok(Step::Advance);
        }
        let attempt = AttemptRow {
            id: format!("{}-a{seq}", job.row.id),
            sandbox_id: job.row.id.clone(),
            seq,
            pool: cand.pool.clone(),
            provider: cand.provider.clone(),
            account: cand.account.clone(),
            state: "in_flight".into(),
            outcome: None,
            error_class: None,
            message: None,
            instance_id: None,
            started_ms: now_ms(),
            finished_ms: None,
            retries_json: None,
        };
        self.deps
            .store
            .start_attempt(&attempt, now_ms(), &job.fence)
            .await?;
        // The attempt starts now, here: its window is timed on the monotonic clock.
        let deadline =
            Instant::now() + Duration::from_millis(self.deps.config.provisioning_window_ms);
        // A provider snapshot seeds the instance; a filesystem export is written after.
        let seed = self
            .snapshot_of(job)
            .await
            .filter(|s| s.kind == crate::store::snapshots::PROVIDER_SNAPSHOT)
            .map(|s| s.id);
        let mut backoff = self.retry_backoff();
        let mut retries: Vec<Value> = Vec::new();
        // Whether a failed call may have made an instance anyway (kept across retries: a
        // retry that succeeds must not leave that one behind).
        let mut maybe_created = false;
        let result = loop {
            let egress = match self.remote_egress(job, cand) {
                Ok(egress) => egress,
                Err(e) => break Err(e),
            };
            let spec = CreateSpec {
                tags: Tags {
                    sandbox_id: job.row.id.clone(),
                    attempt_id: attempt.id.clone(),
                },
                pool: cand.pool.clone(),
                account: cand.account.clone(),
                request: job.request.clone(),
                env: self.placeholder_env(&job.row.id, &job.row.workspace, &job.body),
                snapshot: seed.clone(),
                egress,
            };
            let answer = adapter.create(spec).await;
            self.circuits.record(
                &cand.pool,
                match &answer {
                    Err(e) if circuit::counts(e.class) => Some((e.class, e.message.as_str())),
                    _ => None,
                },
            );
            let mut e = match answer {
                Ok(instance) => break Ok(instance),
                Err(e) => e,
            };
            maybe_created |= e.maybe_created;
            if !e.class.retryable() {
                break Err(e);
            }
            match self.retry_wait(&cand.pool, &e, backoff.next(), deadline) {
                Ok(wait) => {
                    tracing::info!(sandbox = %job.row.id, pool = %cand.pool, class = e.class.as_str(), wait_ms = wait.as_millis() as u64, "retrying on the same pool");
                    retries.push(json!({
                        "at_ms": now_ms(),
                        "error_class": e.class.as_str(),
                        "message": e.message,
                        "wait_ms": wait.as_millis() as u64,
                    }));
                    self.deps
                        .store
                        .set_attempt_retries(
                            &attempt.id,
                            &Value::from(retries.clone()).to_string(),
                            &job.fence,
                        )
                        .await?;
                    metrics::counter!("sandgate_create_retries_total", "class" => e.class.as_str())
                        .increment(1);
                    tokio::time::sleep(wait).await;
                }
                Err(why) => {
                    e.message = format!("{}; {why}", e.message);
                    break Err(e);
                }
            }
        };
        // (c) classify.
        match result {
            Ok(instance) => {
                if maybe_created {
                    self.drop_duplicates(job, cand, &attempt, &instance.id)
                        .await;
                }
                self.after_running(job, cand, &attempt, &instance.id).await
            }
            Err(mut e) => {
                e.maybe_created |= maybe_created;
                self.classify(job, cand, &attempt, e).await
            }
        }
    }

    /// The pauses between retries of one attempt: exponential from `retry_backoff_ms` up to
    /// `retry_backoff_max_ms`, with jitter (so concurrent creates do not retry in step), at
    /// most `retry_max` of them.
    fn retry_backoff(&self) -> impl Iterator<Item = Duration> {
        use backon::BackoffBuilder as _;
        let c = &self.deps.config;
        let max = Duration::from_millis(c.retry_backoff_max_ms);
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(c.retry_backoff_ms))
            .with_max_delay(Duration::from_millis(c.retry_backoff_max_ms))
            .with_max_times(c.retry_max as usize)
            .with_jitter()
            .build()
            // The jitter adds up to the pause again: the maximum stays a maximum.
            .map(move |pause| pause.min(max))
    }

    /// How long to wait before retrying `error` on `pool` (the backoff's next pause, or the
    /// provider's `Retry-After` when longer), or why not to retry: no retry left, the pool's
    /// circuit opened, or the wait would end past the provisioning window.
    fn retry_wait(
        &self,
        pool: &str,
        error: &ProviderError,
        next: Option<Duration>,
        deadline: Instant,
    ) -> Result<Duration, String> {
        let Some(pause) = next else {
            return Err(format!(
                "not retried: all {} retries were used",
                self.deps.config.retry_max
            ));
        };
        if !self.circuits.closed(pool) {
            return Err("not retried: the pool's circuit opened".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if let Some(asked) = error.retry_after.filter(|a| *a >= left) {
            // Waiting would hold the create past the window: the next pool may serve now.
            return Err(format!(
                "not retried: Retry-After {} s ends past the provisioning window ({} ms left)",
                asked.as_secs(),
                left.as_millis()
            ));
        }
        let wait = pause.max(error.retry_after.unwrap_or_default());
        if wait >= left {
            return Err(format!(
                "not retried: the next retry (in {} ms) would end past the provisioning window",
                wait.as_millis()
            ));
        }
        Ok(wait)
    }

    /// After a retry succeeded where an earlier call may have made an instance too: deletes
    /// any other instance tagged with the attempt (providers that honour the attempt's
    /// idempotency key answer the same instance, and nothing is deleted). When the provider
    /// cannot be asked now, the janitor watches the attempt (never touching the placed one).
    async fn drop_duplicates(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        kept: &str,
    ) {
        let Some(adapter) = self.deps.providers.for_pool(&cand.pool) else {
            return;
        };
        match adapter.list_by_tag(&job.row.id, Some(&attempt.id)).await {
            Ok(found) => {
                for extra in found.iter().filter(|i| i.id != kept) {
                    tracing::warn!(sandbox = %job.row.id, pool = %cand.pool, instance = %extra.id, "deleting a duplicate an earlier failed create call made");
                    if adapter.delete(&extra.id).await.is_err() {
                        self.watch_attempt(job, cand, attempt, "duplicate_of_retry")
                            .await;
                    }
                }
            }
            Err(_) => {
                self.watch_attempt(job, cand, attempt, "duplicate_of_retry")
                    .await
            }
        }
    }

    /// Has the janitor watch the attempt for instances (against its own account).
    async fn watch_attempt(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        reason: &str,
    ) {
        let now = now_ms();
        let _ = self
            .deps
            .store
            .record_abandoned(
                &AbandonedRow {
                    attempt_id: attempt.id.clone(),
                    sandbox_id: job.row.id.clone(),
                    pool: cand.pool.clone(),
                    account: cand.account.clone(),
                },
                reason,
                now,
                now + self.deps.config.abandoned_watch_secs as i64 * 1000,
            )
            .await;
    }

    async fn classify(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        e: ProviderError,
    ) -> Result<Step, StoreError> {
        match e.class.outcome() {
            // The provider answered a failure that does not prove nothing was made (a 5xx
            // after the request reached it): look for the attempt's instance before the route
            // advances, so no duplicate live capacity is created.
            Outcome::Advance if e.maybe_created && e.instance_id.is_none() => {
                self.enter_reconciling(job, attempt).await?;
                self.reconcile_after(job, cand, attempt, Some(&e)).await
            }
            Outcome::Advance => {
                self.end_attempt(
                    job,
                    attempt,
                    "advanced",
                    e.class,
                    &e.message,
                    e.instance_id.as_deref(),
                )
                .await?;
                self.sample(&cand.pool, false, None).await;
                if let Some(instance) = &e.instance_id {
                    self.destroy(
                        &job.row.id,
                        &cand.pool,
                        &cand.account,
                        &attempt.id,
                        instance,
                        e.class.as_str(),
                    )
                    .await;
                }
                Ok(Step::Advance)
            }
            Outcome::Terminal => {
                self.end_attempt(job, attempt, "ended", e.class, &e.message, None)
                    .await?;
                let (status, code) = match e.class {
                    ErrorClass::Billing => (StatusCode::FORBIDDEN, "billing_refused"),
                    ErrorClass::InvalidRequest => {
                        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
                    }
                    ErrorClass::Authority => (StatusCode::FORBIDDEN, "forbidden"),
                    _ => (StatusCode::FORBIDDEN, "policy_denied"),
                };
                Ok(Step::End(
                    ErrorReply::new(
                        status,
                        code,
                        format!("pool {} refused the create: {}", cand.pool, e.message),
                    )
                    .with_details(json!({"pool": cand.pool, "error_class": e.class.as_str()})),
                ))
            }
            Outcome::Unknown => {
                self.enter_reconciling(job, attempt).await?;
                self.reconcile(job, cand, attempt).await
            }
        }
    }

    async fn enter_reconciling(&self, job: &Job, attempt: &AttemptRow) -> Result<(), StoreError> {
        self.deps
            .store
            .set_attempt_state(&attempt.id, "reconciling", &job.fence)
            .await?;
        self.deps
            .store
            .transition_fenced(
                &job.row.id,
                &["pending", "provisioning"],
                "reconciling",
                None,
                None,
                now_ms(),
                &job.fence,
            )
            .await?;
        Ok(())
    }

    /// An unknown outcome: ask the provider for instances tagged with this attempt before
    /// anything else is tried. A running one is adopted (it is this attempt's, on this
    /// attempt's account); none within the window → abandoned (the janitor watches for it)
    /// and the route advances.
    async fn reconcile(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
    ) -> Result<Step, StoreError> {
        self.reconcile_after(job, cand, attempt, None).await
    }

    /// [`Coordinator::reconcile`]. `answered`: the provider answered the create with this
    /// failure (which may have made the instance): it is not still being made, so one
    /// listing decides (an instance starting is waited for); one listed later is the
    /// janitor's. Without it (no answer) the provider is asked for the reconcile window.
    async fn reconcile_after(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        answered: Option<&ProviderError>,
    ) -> Result<Step, StoreError> {
        let (class, why) = match answered {
            Some(e) => (
                e.class,
                format!(
                    "{}; no instance tagged with the attempt was listed after it; the janitor watches for a late one",
                    e.message
                ),
            ),
            None => (
                ErrorClass::Unknown,
                "no instance found within the reconcile window".to_string(),
            ),
        };
        self.deps
            .store
            .set_attempt_state(&attempt.id, "reconciling", &job.fence)
            .await?;
        let Some(adapter) = self.deps.providers.for_pool(&cand.pool) else {
            self.abandon(job, cand, attempt, class, "no adapter to reconcile with")
                .await?;
            return Ok(Step::Advance);
        };
        let window = match answered {
            Some(_) => 0,
            None => self.deps.config.reconcile_window_ms as i64,
        };
        let mut deadline = Instant::now() + Duration::from_millis(window as u64);
        // Paced by the configured window even when one listing decides (`answered`): an
        // instance still starting is polled no faster than an unknown outcome is.
        let paced = self.deps.config.reconcile_window_ms as i64;
        let interval = Duration::from_millis((paced / 20).clamp(10, 250) as u64);
        loop {
            match adapter.list_by_tag(&job.row.id, Some(&attempt.id)).await {
                Ok(found) => {
                    if let Some(running) = found.iter().find(|i| i.state == InstanceState::Running)
                    {
                        for extra in found.iter().filter(|i| i.id != running.id) {
                            let _ = adapter.delete(&extra.id).await;
                        }
                        // Its create did not finish it (e.g. the CA of a locked-down sandbox
                        // is written after the provider made it): finish it now.
                        let egress = self.remote_egress(job, cand);
                        let adopted = match &egress {
                            Ok(egress) => adapter.adopt(&running.id, egress.as_ref()).await,
                            Err(e) => Err(e.clone()),
                        };
                        if let Err(e) = adopted {
                            self.end_attempt(
                                job,
                                attempt,
                                "advanced",
                                e.class,
                                &e.message,
                                Some(&running.id),
                            )
                            .await?;
                            self.sample(&cand.pool, false, None).await;
                            self.destroy(
                                &job.row.id,
                                &cand.pool,
                                &cand.account,
                                &attempt.id,
                                &running.id,
                                "not_adopted",
                            )
                            .await;
                            return Ok(Step::Advance);
                        }
                        return self.after_running(job, cand, attempt, &running.id).await;
                    }
                    if !found.is_empty() && found.iter().all(|i| i.state == InstanceState::Failed) {
                        for i in &found {
                            let _ = adapter.delete(&i.id).await;
                        }
                        self.end_attempt(
                            job,
                            attempt,
                            "advanced",
                            ErrorClass::FailedBeforeRunning,
                            "the reconciled instance failed before running",
                            Some(&found[0].id),
                        )
                        .await?;
                        self.sample(&cand.pool, false, None).await;
                        return Ok(Step::Advance);
                    }
                    if found.iter().any(|i| i.state == InstanceState::Starting) {
                        // It exists and is starting: wait for it within the provisioning window.
                        // The attempt may have started on another replica: its window
                        // is what remains of it by the stored start, timed here from now.
                        let ends_ms =
                            attempt.started_ms + self.deps.config.provisioning_window_ms as i64;
                        let left = Duration::from_millis((ends_ms - now_ms()).max(0) as u64);
                        deadline = deadline.max(Instant::now() + left);
                    }
                }
                Err(e) => {
                    tracing::warn!(sandbox = %job.row.id, pool = %cand.pool, error = %e, "reconciliation query failed; retrying");
                }
            }
            if Instant::now() >= deadline {
                self.abandon(job, cand, attempt, class, &why).await?;
                return Ok(Step::Advance);
            }
            tokio::time::sleep(interval).await;
        }
    }

    async fn abandon(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        class: ErrorClass,
        why: &str,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        // The attempt ends first, under the lease: a coordinator that lost the create must
        // not set a watch that would delete an instance its successor adopted.
        self.end_attempt(job, attempt, "abandoned", class, why, None)
            .await?;
        self.deps
            .store
            .record_abandoned(
                &AbandonedRow {
                    attempt_id: attempt.id.clone(),
                    sandbox_id: job.row.id.clone(),
                    pool: cand.pool.clone(),
                    account: cand.account.clone(),
                },
                if class == ErrorClass::Unknown {
                    "unknown_outcome"
                } else {
                    "maybe_created"
                },
                now,
                now + self.deps.config.abandoned_watch_secs as i64 * 1000,
            )
            .await?;
        self.sample(&cand.pool, false, None).await;
        self.deps
            .store
            .transition_fenced(
                &job.row.id,
                &["reconciling"],
                "provisioning",
                None,
                None,
                now,
                &job.fence,
            )
            .await?;
        Ok(())
    }

    /// (d) runtime check, then (e) keep the first success.
    async fn after_running(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        instance_id: &str,
    ) -> Result<Step, StoreError> {
        let adapter = self.deps.providers.for_pool(&cand.pool);
        let caps = match &adapter {
            Some(a) => a.capabilities(instance_id).await,
            None => Err(ProviderError::new(ErrorClass::Unsupported, "no adapter")),
        };
        let shortfall = match &caps {
            Ok(c) => c.shortfall(&job.request, cand.baseline),
            Err(e) => vec![format!("capabilities could not be read: {e}")],
        };
        if !shortfall.is_empty() {
            let message = format!(
                "the running instance falls short of the request: {}",
                shortfall.join(", ")
            );
            self.end_attempt(
                job,
                attempt,
                "advanced",
                ErrorClass::RuntimeShortfall,
                &message,
                Some(instance_id),
            )
            .await?;
            self.sample(&cand.pool, false, None).await;
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "runtime_shortfall",
            )
            .await;
            return Ok(Step::Advance);
        }
        if let Err(message) = self.restore_export(job, cand, instance_id).await {
            self.end_attempt(
                job,
                attempt,
                "advanced",
                ErrorClass::FailedBeforeRunning,
                &message,
                Some(instance_id),
            )
            .await?;
            self.sample(&cand.pool, false, None).await;
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "export_not_restored",
            )
            .await;
            return Ok(Step::Advance);
        }
        let lockdown = self.lockdown(job, cand);
        let now = now_ms();
        let latency = (now - attempt.started_ms) as f64;
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(cand.pool.clone())
            .or_default()
            .push(now, true, Some(latency));
        let placed = self
            .deps
            .store
            .succeed_and_place(&crate::store::sandboxes::Success {
                attempt_id: &attempt.id,
                sandbox_id: &job.row.id,
                instance_id,
                pool: &cand.pool,
                latency_ms: latency,
                placement_json: &self.placement_json(cand, instance_id, lockdown),
                now_ms: now,
                fence: &job.fence,
            })
            .await?;
        if placed {
            self.register_identity(&job.row).await;
            if let Some(adapter) = &adapter {
                self.align_lifetime(adapter.as_ref(), &job.row, instance_id)
                    .await;
            }
        } else {
            // Deleted while it was being created: the instance must not outlive it.
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "deleted_while_creating",
            )
            .await;
        }
        Ok(Step::Placed)
    }

    async fn place(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        instance_id: &str,
    ) -> Result<(), StoreError> {
        let placement_json = self.placement_json(cand, instance_id, self.lockdown(job, cand));
        let placed = self
            .deps
            .store
            .transition_fenced(
                &job.row.id,
                &IN_FLIGHT_STATES,
                "running",
                Some(&placement_json),
                None,
                now_ms(),
                &job.fence,
            )
            .await?;
        if !placed {
            // Deleted while it was being created: the instance must not outlive it.
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "deleted_while_creating",
            )
            .await;
            return Ok(());
        }
        self.register_identity(&job.row).await;
        Ok(())
    }

    /// The body as stored: `env` sealed into `env_sealed` (its values may be secrets; the
    /// rest of the body is not).
    fn stored_body(&self, body: &CreateBody, id: &str) -> Result<String, ErrorReply> {
        let mut stored = body.clone();
        if !stored.env.is_empty() {
            let plain =
                serde_json::to_string(&std::mem::take(&mut stored.env)).map_err(internal)?;
            let sealed = self
                .deps
                .credentials
                .key()
                .seal(&Secret::new(plain), &env_context(id))
                .map_err(internal)?;
            stored.env_sealed = Some(base64::engine::general_purpose::STANDARD.encode(sealed));
            // The names are not secret: kept readable for the sandbox's view.
            stored.env = body
                .env
                .keys()
                .map(|k| (k.clone(), String::new()))
                .collect();
        }
        serde_json::to_string(&stored).map_err(internal)
    }

    /// Unseals a stored body's `env`; `Err` says why it cannot be.
    fn open_env(&self, body: &mut CreateBody, id: &str) -> Result<(), String> {
        let Some(sealed) = body.env_sealed.take() else {
            return Ok(());
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .map_err(|_| "the stored env is not base64".to_string())?;
        let plain = self
            .deps
            .credentials
            .key()
            .open(&bytes, &env_context(id))
            .map_err(|e| format!("the stored env cannot be unsealed: {e}"))?;
        body.env = serde_json::from_str(plain.expose())
            .map_err(|_| "the stored env is unreadable".to_string())?;
        Ok(())
    }

    /// The sandbox's environment: the create's `env`, then the placeholder variable of each
    /// bound credential that declares one (what its processes see instead of the secret;
    /// a placeholder wins over an `env` variable of the same name).
    fn placeholder_env(
        &self,
        sandbox_id: &str,
        workspace: &str,
        body: &CreateBody,
    ) -> BTreeMap<String, String> {
        let mut env = body.env.clone();
        for name in &body.credentials {
            let Some(credential) = self.deps.credentials.get(workspace, name) else {
                continue;
            };
            let placeholder = self
                .deps
                .credentials
                .key()
                .placeholder(sandbox_id, workspace, name);
            env.extend(credential.meta.placeholder_vars(&placeholder));
        }
        env
    }

    /// Where the sandbox on `pool` reaches its proxy (see [`remote`]).
    pub fn endpoint(&self, pool: Option<&str>, sandbox_id: &str) -> Endpoint {
        let topo = &self.deps.topology;
        let pool = pool.and_then(|p| topo.pool(p));
        let kind = pool.map(|p| topo.providers()[p.provider].kind);
        if kind == Some(sandgate_router::ProviderKind::Local) {
            let base = format!("http://127.0.0.1:{}", self.deps.local_proxy_port);
            return Endpoint {
                enforcement: "namespace",
                base: base.clone(),
                url_template: base,
                ca_path: crate::localbox::CA_PATH.to_string(),
            };
        }
        let adapter = pool.and_then(|p| self.deps.providers.for_pool(&p.name));
        let hosted = (
            self.deps.remote.as_ref(),
            adapter.and_then(|a| a.ca_path()),
            pool,
        );
        if let (Some(gateway), Some(ca_path), Some(pool)) = hosted {
            let enforcement = match pool.capabilities.egress {
                EgressEnforcement::Gateway => Some("gateway"),
                EgressEnforcement::Advisory => Some("advisory"),
                _ => None,
            };
            if let Some(enforcement) = enforcement {
                return Endpoint {
                    enforcement,
                    base: gateway.url.base(),
                    url_template: gateway.proxy_url(sandbox_id, "{token}"),
                    ca_path: ca_path.to_string(),
                };
            }
        }
        Endpoint {
            enforcement: "proxy_credentials",
            base: format!("http://{}", self.deps.proxy_addr),
            url_template: format!("http://{}:{{token}}@{}", sandbox_id, self.deps.proxy_addr),
            ca_path: self.deps.ca_cert_path.display().to_string(),
        }
    }

    /// The egress a hosted sandbox is created with on `cand`'s pool, when it is given the
    /// public proxy (a `gateway` or `advisory` pool with `[proxy] public_url`).
    /// The snapshot the create names, if any (read again: the create may run after a restart).
    async fn snapshot_of(&self, job: &Job) -> Option<SnapshotRow> {
        let id = job.body.snapshot.as_deref()?;
        self.deps.store.get_snapshot(id).await.ok().flatten()
    }

    /// Writes a filesystem export the create names into the new instance (its files, never
    /// memory state); nothing to do for a provider snapshot or none.
    async fn restore_export(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        instance_id: &str,
    ) -> Result<(), String> {
        let Some(snapshot) = self.snapshot_of(job).await else {
            return Ok(());
        };
        if snapshot.kind != crate::store::snapshots::FILESYSTEM_EXPORT {
            return Ok(());
        }
        let archive = match self.deps.store.snapshot_archive(&snapshot.id).await {
            Ok(Some(archive)) => archive,
            Ok(None) => return Err(format!("the export {} has no archive", snapshot.id)),
            Err(e) => return Err(format!("reading the export {}: {e}", snapshot.id)),
        };
        let adapter = self
            .deps
            .providers
            .for_pool(&cand.pool)
            .ok_or("no adapter for the pool")?;
        let summary = crate::providers::export::restore(adapter.as_ref(), instance_id, &archive)
            .await
            .map_err(|e| format!("restoring the export {}: {e}", snapshot.id))?;
        tracing::info!(sandbox = %job.row.id, export = %snapshot.id, files = summary.files, bytes = summary.bytes, "filesystem export restored");
        Ok(())
    }

    /// The placement record of `instance_id` on `cand`'s pool, placed by this replica.
    fn placement_json(
        &self,
        cand: &StoredCandidate,
        instance_id: &str,
        lockdown: Option<Value>,
    ) -> String {
        let origin = self.deps.store.origin();
        serde_json::to_string(&Placement {
            pool: cand.pool.clone(),
            provider: cand.provider.clone(),
            account: cand.account.clone(),
            region: cand.region.clone(),
            zone: cand.zone.clone(),
            instance_id: instance_id.to_string(),
            lockdown,
            placed_by: (!origin.is_empty()).then(|| origin.to_string()),
        })
        .unwrap_or_default()
    }

    /// What the adapter set natively for the sandbox's egress on `cand`'s pool (computed
    /// from the same spec it was created with), for its placement record.
    fn lockdown(&self, job: &Job, cand: &StoredCandidate) -> Option<Value> {
        let adapter = self.deps.providers.for_pool(&cand.pool)?;
        let egress = self.remote_egress(job, cand).ok()??;
        adapter.lockdown(&egress)
    }

    /// Fails (never creates an open sandbox) when the token cannot be unsealed.
    fn remote_egress(
        &self,
        job: &Job,
        cand: &StoredCandidate,
    ) -> Result<Option<RemoteEgress>, ProviderError> {
        let endpoint = self.endpoint(Some(&cand.pool), &job.row.id);
        let Some(gateway) = self.deps.remote.as_ref() else {
            return Ok(None);
        };
        if !matches!(endpoint.enforcement, "gateway" | "advisory") {
            return Ok(None);
        }
        let token = self
            .deps
            .credentials
            .key()
            .open(&job.row.token_sealed, &token_context(&job.row.id))
            .map_err(|_| {
                ProviderError::new(
                    ErrorClass::FailedBeforeRunning,
                    "the sandbox's egress token cannot be unsealed; not creating it without its lock-down",
                )
            })?;
        Ok(Some(gateway.egress(
            &job.row.id,
            token.expose(),
            endpoint.enforcement == "gateway",
        )))
    }

    /// Registers the sandbox's egress identity with the proxy, exactly as static identities
    /// are: its allow-list and its bound credentials.
    async fn register_identity(&self, row: &SandboxRow) {
        if let Some(identity) = self.sandbox_identity(row) {
            self.deps.identities.register(identity);
        }
    }

    /// The egress identity of a stored sandbox: its unsealed token, allow-list, labels and
    /// bound credentials. `None` when the row cannot give one (logged).
    fn sandbox_identity(&self, row: &SandboxRow) -> Option<Identity> {
        let Ok(body) = serde_json::from_str::<CreateBody>(&row.request_json) else {
            return None;
        };
        let token = match self
            .deps
            .credentials
            .key()
            .open(&row.token_sealed, &token_context(&row.id))
        {
            Ok(t) => t,
            Err(_) => {
                tracing::error!(sandbox = %row.id, "sandbox token cannot be unsealed; identity not registered");
                return None;
            }
        };
        let make = || {
            Identity::new(
                row.id.clone(),
                token.expose().as_bytes().to_vec(),
                row.workspace.clone(),
                body.request.network.allow_domains.clone(),
                body.request.labels.clone(),
            )
            .with_cidrs(&body.request.network.cidrs)
        };
        match make().bind(
            None,
            &body.credentials,
            self.deps.credentials.as_ref(),
            |i| format!("credentials[{i}]"),
        ) {
            Ok(identity) => Some(identity),
            Err(e) => {
                // A credential was removed since the create was accepted: run without it.
                tracing::warn!(sandbox = %row.id, error = %e, "registering without credential bindings");
                Some(make())
            }
        }
    }

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

    // ------------------------------------------------------- restart, leases, janitor

    /// At start-up: register the identities of running sandboxes again. With
    /// `reconcile_instances` (the control plane), a sandbox whose provider positively says its
    /// instance is gone is marked failed first; a proxy replica only serves identities and
    /// leaves the judgement to the control plane (it may not even reach the providers).
    pub async fn restore(&self, reconcile_instances: bool) -> Result<usize, StoreError> {
        let since = now_ms() - self.deps.config.stats_window_secs as i64 * 1000;
        let rows = self.deps.store.samples_since(since).await?;
        {
            let mut windows = self.samples.lock().unwrap_or_else(|e| e.into_inner());
            for (pool, at, success, latency) in rows {
                windows.entry(pool).or_default().push(at, success, latency);
            }
        }
        let rows = self.deps.store.running_sandboxes().await?;
        let mut restored = 0;
        for row in &rows {
            if reconcile_instances && self.instance_lost(row).await {
                let error = ErrorReply::new(
                    StatusCode::GONE,
                    "instance_lost",
                    "the sandbox's instance no longer exists at its provider (local sandboxes do not survive a gateway restart)",
                );
                let error_json = serde_json::to_string(&error.body()).unwrap_or_default();
                self.deps
                    .store
                    .transition_sandbox(
                        &row.id,
                        &["running", "paused", "stopped"],
                        "failed",
                        None,
                        Some(&error_json),
                        now_ms(),
                    )
                    .await?;
                tracing::warn!(sandbox = %row.id, "sandbox instance lost; marked failed");
                continue;
            }
            self.register_identity(row).await;
            restored += 1;
        }
        Ok(restored)
    }

    /// Whether the provider positively says the placed instance is gone (an error or no
    /// adapter proves nothing: the sandbox is kept).
    async fn instance_lost(&self, row: &SandboxRow) -> bool {
        let Some(placement) = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str::<Placement>(p).ok())
        else {
            return false;
        };
        let Some(adapter) = self.deps.providers.for_pool(&placement.pool) else {
            return false;
        };
        matches!(adapter.get(&placement.instance_id).await, Ok(None))
    }

    /// A sandbox with where it runs and the adapter that runs it (for operations on it).
    pub async fn locate(&self, id: &str) -> Result<Option<Located>, ErrorReply> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        let placement = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str::<Placement>(p).ok());
        let adapter = placement
            .as_ref()
            .and_then(|p| self.deps.providers.for_pool(&p.pool));
        Ok(Some(Located {
            row,
            placement,
            adapter,
        }))
    }

    /// Records a lifecycle state change made by the API (`from` guards against races
    /// with delete).
    pub async fn set_state(&self, id: &str, from: &[&str], to: &str) -> Result<bool, ErrorReply> {
        self.deps
            .store
            .transition_sandbox(id, from, to, None, None, now_ms())
            .await
            .map_err(internal)
    }

    /// Starts the lease heartbeat and the janitor; the janitor's first pass runs at once so
    /// creates left by a crashed process are resumed as soon as their lease expires.
    pub fn spawn_background(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        let this = self.clone();
        tasks.push(tokio::spawn(async move {
            let every = Duration::from_millis((this.deps.config.lease_ttl_ms / 3).max(30));
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = this
                    .deps
                    .store
                    .renew_leases(&this.owner, this.lease_expiry())
                    .await
                {
                    tracing::warn!(error = %e, "could not renew create leases");
                }
            }
        }));
        let this = self.clone();
        tasks.push(tokio::spawn(async move {
            let every = Duration::from_millis(this.deps.config.janitor_interval_ms);
            loop {
                this.janitor_pass().await;
                tokio::time::sleep(every).await;
            }
        }));
        tasks.extend(self.spawn_account_checks());
        tasks.extend(self.spawn_liveness());
        tasks
    }

    /// One janitor pass: resume creates whose lease expired, delete late instances of
    /// abandoned attempts, drop expired idempotency keys and old samples.
    pub async fn janitor_pass(self: &Arc<Self>) {
        let now = now_ms();
        match self
            .deps
            .store
            .claim_expired_creates(&self.owner, now, self.lease_expiry())
            .await
        {
            Ok(ids) => {
                for id in ids {
                    tracing::info!(sandbox = %id, "resuming an in-flight create whose lease expired");
                    let this = self.clone();
                    tokio::spawn(async move { this.drive(&id).await });
                }
            }
            Err(e) => tracing::warn!(error = %e, "janitor: cannot claim expired creates"),
        }
        match self.deps.store.watched_abandoned(now).await {
            Ok(rows) => {
                for row in rows {
                    let Some(adapter) = self.deps.providers.for_pool(&row.pool) else {
                        continue;
                    };
                    let attempt =
                        (!row.attempt_id.ends_with("-placed")).then_some(row.attempt_id.as_str());
                    let listed = adapter.list_by_tag(&row.sandbox_id, attempt).await;
                    // Backs off per attempt, whatever the answer: an instance that has not
                    // appeared is ever less likely to, and a failing provider is not hammered.
                    let _ = self
                        .deps
                        .store
                        .abandoned_checked(
                            &row.attempt_id,
                            now,
                            self.deps.config.janitor_interval_ms as i64,
                            self.deps.config.abandoned_check_max_secs as i64 * 1000,
                        )
                        .await;
                    let Ok(found) = listed else {
                        continue;
                    };
                    // Never touch the instance a sandbox is placed on.
                    let placed = self
                        .deps
                        .store
                        .get_sandbox(&row.sandbox_id)
                        .await
                        .ok()
                        .flatten()
                        .filter(|s| s.state != "deleted")
                        .and_then(|s| s.placement_json)
                        .and_then(|p| serde_json::from_str::<Placement>(&p).ok())
                        .map(|p| p.instance_id);
                    let mut n = 0;
                    for instance in found {
                        if Some(&instance.id) == placed.as_ref() {
                            continue;
                        }
                        if adapter.delete(&instance.id).await.is_ok() {
                            tracing::info!(sandbox = %row.sandbox_id, pool = %row.pool, account = %row.account, instance = %instance.id, "janitor deleted a late instance");
                            n += 1;
                        }
                    }
                    if n > 0 {
                        let _ = self
                            .deps
                            .store
                            .count_abandoned_deleted(&row.attempt_id, n)
                            .await;
                        metrics::counter!("sandgate_janitor_deleted_instances_total").increment(n);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "janitor: cannot list abandoned attempts"),
        }
        self.expire_sandboxes(now).await;
        let _ = self.deps.store.purge_idempotency_keys(now).await;
        let _ = self
            .deps
            .store
            .delete_samples_before(now - self.deps.config.stats_window_secs as i64 * 1000)
            .await;
    }
}

/// The associated data a sandbox's egress token is sealed with.
fn env_context(sandbox_id: &str) -> String {
    format!("sandbox-env\n{sandbox_id}")
}

pub(crate) fn token_context(sandbox_id: &str) -> String {
    format!("sandbox-token\n{sandbox_id}")
}

fn static_code(code: &str) -> &'static str {
    match code {
        "forbidden" => "forbidden",
        "policy_denied" => "policy_denied",
        "billing_refused" => "billing_refused",
        "invalid_request" => "invalid_request",
        "no_eligible_provider" => "no_eligible_provider",
        _ => "creation_failed",
    }
}

/// `no_eligible_provider` in the shared error shape, `details.attempts` from the router.
pub fn no_eligible_reply(no: NoEligible) -> ErrorReply {
    ErrorReply::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "no_eligible_provider",
        no.message.clone(),
    )
    .with_details(serde_json::to_value(&no.details).unwrap_or_else(|_| json!({})))
}
