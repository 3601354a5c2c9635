//! Admitting one candidate pool when the walk reaches it (step 1, see the module doc of `create`):
//! the `sandgate.creation` and `sandgate.provider` Rego layers for this pool, then whether the pool
//! can serve at all (bound credentials, an adapter). It records nothing, so a dry run (see
//! `dry_run`) asks exactly what the walk asks.

use std::sync::Arc;

use axum::http::StatusCode;
use sandgate_router::ProviderKind;
use serde_json::{json, Value};

use super::{Coordinator, Job, StoredCandidate};
use crate::error::ErrorReply;
use crate::providers::ErrorClass;

impl Coordinator {
    pub(super) fn admission_input(&self, job: &Job, cand: &StoredCandidate, seq: i64) -> Value {
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

    /// Whether the walk may attempt `cand` now, and why not: the `sandgate.creation` and
    /// `sandgate.provider` layers for this pool (a refusal ends the create), then an
    /// account without bound credentials or a provider without an adapter (the walk
    /// advances). Records nothing, so a dry run asks exactly what the walk asks.
    pub(super) fn admit(&self, job: &Job, cand: &StoredCandidate, seq: i64) -> Admission {
        self.admit_with(job, cand, seq, false)
    }

    /// [`Coordinator::admit`]; `dry_run` is given to the policies as `input.dry_run`.
    pub(super) fn admit_with(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
        dry_run: bool,
    ) -> Admission {
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
}

/// What [`Coordinator::admit`] decided for one candidate.
pub(super) enum Admission {
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
pub(super) fn refusal_reply(
    class: ErrorClass,
    layer: &str,
    pool: &str,
    reasons: Vec<String>,
) -> ErrorReply {
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
