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
            plan.push(json!({
                "position": seq, "pool": cand.pool, "provider": cand.provider,
                "account": cand.account, "decision": decision, "reached": reached,
                "layer": layer, "error_class": class.map(|c| c.as_str()), "reasons": reasons,
            }));
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
        json!({
            "dry_run": true,
            "workspace": workspace,
            "would_create": first_pool.is_some(),
            "first_pool": first_pool,
            "plan": plan,
            "refused": refused(&record_value),
            "error": error,
            "placement_record": record_value,
        })
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

/// Pools routing refused (with their unmet requirements) and pools a snapshot excluded.
fn refused(record: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = record["explanation"]["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["eligible"] == false)
        .map(|p| json!({"pool": p["pool"], "provider": p["provider"], "reasons": p["unmet_requirements"]}))
        .collect();
    for e in record["excluded"].as_array().into_iter().flatten() {
        out.push(json!({"pool": e["pool"], "provider": Value::Null, "reasons": [e["reason"]]}));
    }
    out
}
