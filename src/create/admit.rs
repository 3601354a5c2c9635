//! Admitting one candidate pool when the walk reaches it (step 1, see the module doc of `create`):
//! the `sandgate.creation` and `sandgate.provider` Rego layers for this pool, then whether the pool
//! can serve at all (bound credentials, an adapter). It records nothing, so a dry run (see
//! `dry_run`) asks exactly what the walk asks.

use std::sync::Arc;

use sandgate_router::ProviderKind;

use super::{Coordinator, Job, StoredCandidate};
use crate::base::Layer;
use crate::error::{Details, Error, Kind};
use crate::policy::input::{admission_input, AdmissionFacts};
use crate::providers::ErrorClass;

impl Coordinator {
    pub(super) fn admission_input(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
        dry_run: bool,
    ) -> regorus::Value {
        let topo = &self.deps.topology;
        let pool = topo.pool(&cand.pool);
        let p = &job.principal;
        admission_input(&AdmissionFacts {
            caller: (&p.principal, &p.workspace, &p.roles),
            workspace: &job.row.workspace,
            sandbox_id: &job.row.id,
            labels: &job.request.labels,
            request: job.body.policy_view(),
            provider: &cand.provider,
            account: &cand.account,
            pool,
            provider_kind: topo.provider(&cand.provider).map(|p| p.kind.as_str()),
            account_config: pool.and_then(|p| topo.accounts().get(p.account)),
            attempt: seq,
            dry_run,
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
        let input = self.admission_input(job, cand, seq, dry_run);
        let creation = self.deps.policy.decide(Layer::Creation, input.clone());
        if !creation.allowed {
            return Admission::Refused {
                class: ErrorClass::Authority,
                layer: Layer::Creation,
                reasons: creation.reasons,
            };
        }
        let provider_layer = self.deps.policy.decide(Layer::Provider, input);
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
                layer: Layer::Provider,
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
        layer: Layer,
        reasons: Vec<String>,
    },
}

/// The create's error when a policy layer refused it on `pool`.
pub(super) fn refusal_reply(
    class: ErrorClass,
    layer: Layer,
    pool: &str,
    reasons: Vec<String>,
) -> Error {
    let code = match class {
        ErrorClass::Billing => "billing_refused",
        ErrorClass::Authority => "forbidden",
        _ => "policy_denied",
    };
    let message = format!(
        "creation on pool {pool} was refused: {}",
        reasons.join("; ")
    );
    Error::new(Kind::Refused, code, message).with_details(Details {
        layer: Some(layer),
        pool: Some(pool.to_string()),
        reasons: Some(reasons),
        ..Details::default()
    })
}
