//! `POST /v1/sandboxes` (the API entry): the request is validated, routed and recorded with
//! its lease before the walk starts; the caller waits up to `[create] short_wait_ms` for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::{
    internal, no_eligible_reply, record, token_context, Coordinator, CreateBody, StoredCandidate,
    StoredPrincipal,
};
use crate::base::clock::now_ms;
use crate::base::ids::random_hex;
use crate::base::Principal;
use crate::credentials::Secret;
use crate::error::ErrorReply;
use crate::identity::Identity;
use crate::store::sandboxes::{IdempotencyClaim, InsertOutcome, SandboxRow};

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
}
