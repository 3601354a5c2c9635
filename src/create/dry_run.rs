//! `POST /v1/sandboxes` with `"dry_run": true`: the create's plan, with nothing created.
//!
//! The body goes through everything a create checks before it stores anything (parsing,
//! the workspace's authority, credential names, routing, snapshot restorability), and a
//! refusal there is the same answer a create would get (400, 403, 422). Then, instead of
//! storing the sandbox and walking the candidates, each candidate is put through the walk's
//! own admission ([`Coordinator::admit`]: the `sandgate.creation` and `sandgate.provider`
//! layers, bound credentials, an adapter) and the answer is `200`:
//!
//! ```json
//! {
//!   "dry_run": true,
//!   "workspace": "ws-a",
//!   "would_create": true,
//!   "first_pool": "pool-b",
//!   "plan": [{"position": 1, "pool": "pool-b", "provider": "sim", "account": "acct-b",
//!             "decision": "attempt", "reached": "first", "layer": null,
//!             "error_class": null, "reasons": []}],
//!   "refused": [{"pool": "pool-c", "provider": "sim", "reasons": ["features.pty"]}],
//!   "error": null,
//!   "placement_record": { ... the record the create would keep ... }
//! }
//! ```
//!
//! `decision` is `attempt` (the walk would create here), `skip` (it would advance: no bound
//! credential, no adapter; `error_class` says which) or `refused` (a policy layer refuses:
//! the create would end here with `error`, `403`). `reached` is `first` for the pools the
//! walk reaches before its first attempt or refusal, `on_failover` for pools it reaches only
//! if the earlier attempts fail, `never` after a refusal. Every candidate is evaluated,
//! reached or not. `refused` lists the pools routing refused, with their unmet requirements
//! (and pools a snapshot cannot be restored on). The policy input carries `dry_run: true`,
//! so a policy (and the decision log) can tell a plan from a create. The
//! `Idempotency-Key` header is neither looked up nor claimed.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};

use super::record::PlacementRecord;
use super::{
    refusal_reply, Admission, Coordinator, CreateBody, Job, StoredCandidate, StoredPrincipal,
};
use crate::base::{Layer, Principal};
use crate::store::sandboxes::SandboxRow;

impl Coordinator {
    /// The plan for a create that routing accepted; `id` is the id it would get.
    pub(super) fn dry_run(
        &self,
        caller: &Principal,
        id: &str,
        workspace: &str,
        body: &CreateBody,
        candidates: &[StoredCandidate],
        record: &PlacementRecord<'_>,
    ) -> Value {
        let job = would_be_job(caller, id, workspace, body, candidates);
        let mut plan = Vec::with_capacity(candidates.len());
        let (mut first_pool, mut error, mut reached) = (None, Value::Null, "first");
        for (i, cand) in candidates.iter().enumerate() {
            let seq = i as i64 + 1;
            let (decision, layer, class, reasons) = match self.admit_dry(&job, cand, seq) {
                Admission::Attempt(_) => ("attempt", None, None, Vec::new()),
                Admission::Skip { class, message } => ("skip", None, Some(class), vec![message]),
                Admission::Refused {
                    class,
                    layer,
                    reasons,
                } => ("refused", Some(layer), Some(class), reasons),
            };
            plan.push(PlanStep {
                position: seq,
                pool: cand.pool.clone(),
                provider: cand.provider.clone(),
                account: cand.account.clone(),
                decision,
                reached,
                layer,
                error_class: class.map(|c| c.as_str()),
                reasons: reasons.clone(),
            });
            match decision {
                "attempt" if reached == "first" => {
                    first_pool = Some(cand.pool.clone());
                    reached = "on_failover";
                }
                // Only a refusal the walk reaches before any attempt ends the create; one
                // behind an attempt ends it only if that attempt fails (reached on failover).
                "refused" if reached == "first" => {
                    let class = class.unwrap_or(crate::providers::ErrorClass::Policy);
                    let layer = layer.unwrap_or(Layer::Creation);
                    error =
                        json!({"error": refusal_reply(class, layer, &cand.pool, reasons).record()});
                    reached = "never";
                }
                _ => {}
            }
        }
        let record_value: Value = serde_json::from_str(&record.to_json()).unwrap_or(Value::Null);
        let answer = DryRunPlan {
            dry_run: true,
            workspace: workspace.to_string(),
            would_create: first_pool.is_some(),
            first_pool,
            plan,
            refused: refused(&record_value),
            error,
            placement_record: record_value,
        };
        serde_json::to_value(answer).unwrap_or(Value::Null)
    }

    /// [`Coordinator::admit`] with `dry_run: true` in the policy input.
    fn admit_dry(&self, job: &Job, cand: &StoredCandidate, seq: i64) -> Admission {
        self.admit_with(job, cand, seq, true)
    }
}

/// The job a create would drive, built in memory only.
fn would_be_job(
    caller: &Principal,
    id: &str,
    workspace: &str,
    body: &CreateBody,
    candidates: &[StoredCandidate],
) -> Job {
    let now = crate::base::clock::now_ms();
    Job {
        // Matches no lease: were a dry run ever to write, the store would refuse it.
        fence: crate::store::sandboxes::Fence {
            owner: String::new(),
            epoch: -1,
        },
        row: SandboxRow {
            id: id.to_string(),
            workspace: workspace.to_string(),
            principal_json: String::new(),
            state: "pending".into(),
            request_json: String::new(),
            labels_json: String::new(),
            candidates_json: String::new(),
            placement_json: None,
            placement_record_json: None,
            error_json: None,
            token_sealed: Vec::new(),
            created_ms: now,
            updated_ms: now,
            expires_ms: body.ttl_secs.map(|t| now + t as i64 * 1000),
        },
        principal: StoredPrincipal {
            principal: caller.principal.clone(),
            workspace: caller.workspace.clone(),
            roles: caller.roles.clone(),
        },
        body: body.clone(),
        request: Arc::new(body.request.clone()),
        candidates: candidates.to_vec(),
    }
}

/// A dry run's answer (`POST /v1/sandboxes` with `dry_run: true`): what a create of the body
/// would do; nothing is created. The answer is serialized from this type, so the OpenAPI
/// document's schema is what the gateway sends.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DryRunPlan {
    /// Always true.
    pub dry_run: bool,
    pub workspace: String,
    /// True when some pool would be attempted.
    pub would_create: bool,
    /// The pool the create would try first.
    pub first_pool: Option<String>,
    /// Every candidate pool in routing order and what admission would decide there.
    pub plan: Vec<PlanStep>,
    /// Pools routing refused (with their unmet requirements) and pools a snapshot excluded.
    pub refused: Vec<RefusedPool>,
    /// `{error: {code, message, details}}`: the refusal the create would end in before any
    /// attempt; null otherwise.
    #[schema(value_type = Option<Object>)]
    pub error: Value,
    /// The placement record the create would keep.
    #[schema(value_type = Option<Object>)]
    pub placement_record: Value,
}

/// One candidate pool of a dry run's plan.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PlanStep {
    /// 1-based, in routing order.
    pub position: i64,
    pub pool: String,
    pub provider: String,
    pub account: String,
    /// `attempt`, `skip` or `refused`.
    #[schema(value_type = String)]
    pub decision: &'static str,
    /// `first`, `on_failover` or `never`.
    #[schema(value_type = String)]
    pub reached: &'static str,
    /// The policy layer that refused (for `refused`).
    #[schema(value_type = Option<String>)]
    pub layer: Option<Layer>,
    #[schema(value_type = Option<String>)]
    pub error_class: Option<&'static str>,
    pub reasons: Vec<String>,
}

/// A pool a dry run would never try, and why.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RefusedPool {
    pub pool: String,
    /// Null for a pool a snapshot excluded.
    pub provider: Option<String>,
    pub reasons: Vec<String>,
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Pools routing refused (with their unmet requirements) and pools a snapshot excluded.
fn refused(record: &Value) -> Vec<RefusedPool> {
    let mut out: Vec<RefusedPool> = record["explanation"]["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["eligible"] == false)
        .map(|p| RefusedPool {
            pool: text(&p["pool"]),
            provider: p["provider"].as_str().map(str::to_string),
            reasons: p["unmet_requirements"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect(),
        })
        .collect();
    for e in record["excluded"].as_array().into_iter().flatten() {
        out.push(RefusedPool {
            pool: text(&e["pool"]),
            provider: None,
            reasons: vec![text(&e["reason"])],
        });
    }
    out
}
