//! `POST /v1/sandboxes` (the API entry): the request is validated, routed and recorded with
//! its lease before the walk starts; the caller waits up to `[create] short_wait_ms` for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use serde_json::Value;

use sandgate_router::{Explanation, Route, RouteContext};

use super::{
    internal, no_eligible_reply, record, token_context, Answer, Coordinator, CreateBody,
    StoredCandidate, StoredPrincipal,
};
use crate::base::clock::now_ms;
use crate::base::ids::random_hex;
use crate::base::Principal;
use crate::credentials::Secret;
use crate::error::{Error, Kind};
use crate::identity::Identity;
use crate::store::sandboxes::{InsertOutcome, SandboxRow};
use crate::store::snapshots::SnapshotRow;

/// A create request that passed the checks made before anything is read from the store.
struct Accepted {
    body: CreateBody,
    /// The workspace the sandbox is made in (the body's, else the caller's).
    workspace: String,
    /// The body's digest: an `Idempotency-Key` is held with it.
    digest: String,
    /// When the create was accepted (its record's created time).
    now: i64,
}

/// Where a create may be placed: routing's answer and what it was computed from, kept
/// together because the placement record borrows them.
struct Routed {
    ctx: RouteContext,
    explanation: Explanation,
    route: Route,
    /// The snapshot the create names, if any.
    snapshot: Option<SnapshotRow>,
    /// The route's candidates that can restore `snapshot` (all of them without one).
    candidates: Vec<StoredCandidate>,
}

impl Routed {
    /// The placement record stored with the sandbox (and shown by a dry run).
    fn record(&self, now: i64, stats_window_secs: u64) -> record::PlacementRecord<'_> {
        record::PlacementRecord::new(
            now,
            &self.ctx,
            stats_window_secs,
            &self.explanation,
            self.snapshot.as_ref().map(|s| (s, &self.route)),
            &self.candidates,
        )
    }
}

impl Coordinator {
    /// `POST /v1/sandboxes`. Returns the status (`201` placed, `202` still working) and the
    /// response body. The create that made the sandbox carries its egress token, the only
    /// place it is ever shown; a replay of it (same `Idempotency-Key` and body) is the same
    /// sandbox with `egress.token_already_shown: true` and no token.
    pub async fn create(
        self: &Arc<Self>,
        caller: &Principal,
        body: Value,
        idempotency_key: Option<String>,
    ) -> Result<Answer, Error> {
        let req = accept(caller, body, idempotency_key.as_deref())?;
        // A dry run neither claims nor looks up the key: it is not the create the key names.
        if let Some(key) = idempotency_key.as_ref().filter(|_| !req.body.dry_run) {
            if let Some((hash, sandbox_id)) = self.held_key(&req.workspace, key, req.now).await? {
                return self.replay(&hash, &req.digest, &sandbox_id).await;
            }
        }

        // Credentials must exist in the workspace (bound again, by name, when it runs).
        let id = format!("sb-{}", random_hex(12));
        self.check_credentials(&id, &req)?;
        let routed = self.route_create(&req).await?;
        let record = routed.record(req.now, self.deps.config.stats_window_secs);
        if req.body.dry_run {
            let plan = self.dry_run(
                caller,
                &id,
                &req.workspace,
                &req.body,
                &routed.candidates,
                &record,
            );
            return Ok(Answer::Plan(plan));
        }

        let token = random_hex(24);
        let row = self.new_row(caller, &id, &req, &routed.candidates, &record, &token)?;
        let claim = self.claim(idempotency_key.as_deref(), &req.digest, req.now);
        match self
            .deps
            .store
            .insert_sandbox(&row, &self.owner, self.lease_expiry(), claim, req.now)
            .await
            .map_err(internal)?
        {
            InsertOutcome::Created => {}
            InsertOutcome::Existing {
                sandbox_id,
                body_hash,
            } => return self.replay(&body_hash, &req.digest, &sandbox_id).await,
        }
        metrics::counter!("sandgate_sandbox_creates_total").increment(1);

        let this = self.clone();
        let job_id = id.clone();
        // A child of the API request's span, though it outlives the request.
        let span =
            tracing::info_span!("sandbox.create", sandbox_id = %id, workspace = %req.workspace);
        let mut handle = tokio::spawn(async move { this.drive(&job_id).await }.instrument(span));
        let wait = Duration::from_millis(self.deps.config.short_wait_ms);
        let _ = tokio::time::timeout(wait, &mut handle).await;
        self.respond(&id, Some(&token)).await
    }

    /// Runs once the request is accepted, before routing: the credentials it names must be
    /// bindable in the workspace now (they are bound again, by name, when it runs), so a
    /// create naming a missing one is refused at once instead of failing on every pool.
    fn check_credentials(&self, id: &str, req: &Accepted) -> Result<(), Error> {
        Identity::new(
            id.to_string(),
            Vec::new(),
            req.workspace.clone(),
            vec![],
            BTreeMap::new(),
        )
        .bind(
            None,
            &req.body.credentials,
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
            Error::new(
                Kind::Invalid,
                "invalid_request",
                format!("`{key}`: {message}"),
            )
            .field(key)
        })?;
        Ok(())
    }

    /// Routes the create when it is accepted: the ranked candidate pools, kept only where
    /// the snapshot it names can be restored. No eligible pool, or none that can restore the
    /// snapshot, refuses the create before anything is recorded.
    async fn route_create(&self, req: &Accepted) -> Result<Routed, Error> {
        let request = &req.body.request;
        let ctx = self
            .route_context_for(Some(request), Some(&req.workspace))
            .await
            .map_err(internal)?;
        let (route, explanation) = sandgate_router::route_recorded(
            &self.deps.topology,
            request,
            &ctx,
            record::INELIGIBLE_POOLS_KEPT,
        );
        let route = match route {
            Ok(route) => route,
            Err(no) => return Err(no_eligible_reply(no)),
        };
        let snapshot = match &req.body.snapshot {
            Some(snapshot) => Some(self.snapshot_row(snapshot, &req.workspace).await?),
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
        Ok(Routed {
            ctx,
            explanation,
            route,
            snapshot,
            candidates,
        })
    }

    /// The sandbox's record as a routed create is inserted: `pending`, its egress `token`
    /// sealed, its body stored with `env` sealed, and the candidates the walk will try.
    fn new_row(
        &self,
        caller: &Principal,
        id: &str,
        req: &Accepted,
        candidates: &[StoredCandidate],
        record: &record::PlacementRecord<'_>,
        token: &str,
    ) -> Result<SandboxRow, Error> {
        let sealed = self
            .deps
            .credentials
            .key()
            .seal(&Secret::new(token.to_string()), &token_context(id))
            .map_err(internal)?;
        let now = req.now;
        Ok(SandboxRow {
            id: id.to_string(),
            workspace: req.workspace.clone(),
            principal_json: serde_json::to_string(&StoredPrincipal {
                principal: caller.principal.clone(),
                workspace: caller.workspace.clone(),
                roles: caller.roles.clone(),
            })
            .map_err(internal)?,
            state: "pending".into(),
            request_json: self.stored_body(&req.body, id)?,
            labels_json: serde_json::to_string(&req.body.request.labels).map_err(internal)?,
            candidates_json: serde_json::to_string(candidates).map_err(internal)?,
            placement_json: None,
            placement_record_json: Some(record.to_json()),
            error_json: None,
            token_sealed: sealed,
            created_ms: now,
            updated_ms: now,
            expires_ms: req.body.ttl_secs.map(|t| now + t as i64 * 1000),
        })
    }
}

/// The checks a create passes before anything is read from the store: the body parses, the
/// caller may manage the workspace, and the `Idempotency-Key` (if any) has a valid length.
fn accept(
    caller: &Principal,
    body: Value,
    idempotency_key: Option<&str>,
) -> Result<Accepted, Error> {
    let body = CreateBody::parse(body).map_err(|e| {
        Error::new(
            Kind::Invalid,
            "invalid_request",
            format!("`{}`: {}", e.field, e.message),
        )
        .field(e.field)
    })?;
    let workspace = body
        .workspace
        .clone()
        .unwrap_or_else(|| caller.workspace.clone());
    if !caller.may_manage(&workspace) {
        return Err(Error::new(
            Kind::Forbidden,
            "forbidden",
            format!("this principal may not create sandboxes in workspace {workspace:?}"),
        ));
    }
    if let Some(key) = idempotency_key {
        if key.is_empty() || key.len() > 255 {
            return Err(Error::new(
                Kind::Invalid,
                "invalid_request",
                "Idempotency-Key must be 1 to 255 characters",
            ));
        }
    }
    let digest = body.digest(&workspace);
    Ok(Accepted {
        body,
        workspace,
        digest,
        now: now_ms(),
    })
}
