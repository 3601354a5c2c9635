//! What the proxy decided, as the decision log, the metrics and the sandbox see it: one
//! [`Outcome`] per decision, recorded once, and the refusals the proxy answers with.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use super::state::EgressState;
use super::target::Target;
use crate::credentials::scan;
use crate::decision_log::{now_rfc3339, redact_query, DecisionRecord, LoggedEval, SharedObject};
use crate::error::{Blame, Details, Error, Kind};
use crate::net::ResolveError;
use crate::policy::{Decision, Layer};

/// What is written to the decision log for one decision.
pub(crate) struct Outcome {
    pub phase: &'static str,
    pub protocol: &'static str,
    pub method: String,
    pub path: Option<String>,
    /// The address dialed (or, before a dial, the vetted address that would be).
    pub ip: Option<IpAddr>,
    pub decision: &'static str,
    pub code: Option<&'static str>,
    pub reasons: Vec<String>,
    pub action: Option<String>,
    pub credentials: Vec<String>,
    pub credential_types: Vec<&'static str>,
    pub generation: u64,
    /// The policy decision behind this outcome (see [`crate::decision_log::LoggedEval`]),
    /// kept by the phase that asked, so a refusal made after an allow (a resolve or dial
    /// failure) still says what policy answered.
    pub policy: Option<Arc<LoggedEval>>,
    /// A refused CONNECT: `in_tunnel` or `connect`, how it was answered.
    pub deny_mode: Option<&'static str>,
    /// Workspace credentials for this host that were not applied, and why (see
    /// [`crate::credentials::notes`]).
    pub credential_notes: Vec<String>,
    /// The tunnel's vetted destination, which the policy input may share (see
    /// [`SharedObject`]).
    pub destination: Option<Arc<SharedObject>>,
}

impl Outcome {
    pub fn new(
        phase: &'static str,
        protocol: &'static str,
        method: &str,
        path: Option<String>,
    ) -> Outcome {
        Outcome {
            phase,
            protocol,
            method: method.to_string(),
            path,
            ip: None,
            decision: "allow",
            code: None,
            reasons: Vec::new(),
            action: None,
            credentials: Vec::new(),
            credential_types: Vec::new(),
            generation: 0,
            policy: None,
            deny_mode: None,
            credential_notes: Vec::new(),
            destination: None,
        }
    }

    /// A refusal: nothing was forwarded.
    pub fn deny(&mut self, error: &Error, reasons: Vec<String>) {
        self.decision = "deny";
        self.code = Some(error.code);
        self.reasons = reasons;
    }

    /// Allowed, but the upstream could not be reached.
    pub fn fail(&mut self, error: &Error) {
        self.code = Some(error.code);
        self.reasons = vec![error.message.clone()];
    }
}

/// Writes the decision's metrics, diagnostic event and decision-log record. Host and path
/// lose any credential placeholder and the path its query values: a record is read by
/// people who must not learn what a sandbox could exchange for a secret.
pub(crate) fn record(state: &EgressState, target: &Target, outcome: Outcome, started: Instant) {
    let latency = started.elapsed();
    use crate::telemetry::hot;
    hot::histogram1("sandgate_proxy_decision_seconds", ("phase", outcome.phase))
        .record(latency.as_secs_f64());
    hot::counter(
        "sandgate_egress_decisions_total",
        [("phase", outcome.phase), ("decision", outcome.decision)],
    )
    .increment(1);
    let host = scan::redact(&target.host);
    // Inside the request's span, so diagnostics carry sandbox, workspace and request id.
    tracing::debug!(
        phase = outcome.phase,
        host = %host,
        port = target.port,
        decision = outcome.decision,
        code = outcome.code.unwrap_or(""),
        "egress decision"
    );
    if !state.log.enabled() {
        return;
    }
    state.log.record(DecisionRecord {
        ts: now_rfc3339(),
        kind: "egress",
        sandbox: Some(target.identity.id.clone()),
        workspace: Some(target.identity.workspace.clone()),
        phase: outcome.phase,
        protocol: outcome.protocol,
        host: host.into_owned(),
        port: target.port,
        ip: outcome.ip,
        method: Some(loggable(outcome.method)),
        path: outcome.path.map(|p| loggable(redact_query(&p))),
        decision: outcome.decision,
        code: outcome.code,
        reasons: outcome.reasons.into_iter().map(loggable).collect(),
        action: outcome.action,
        credentials: outcome.credentials,
        credential_types: outcome.credential_types,
        policy_generation: outcome.generation,
        latency_us: latency.as_micros() as u64,
        policy: outcome.policy,
        deny_mode: outcome.deny_mode,
        credential_notes: outcome.credential_notes.into_iter().map(loggable).collect(),
        shared: [Some(target.sandbox.clone()), outcome.destination],
    });
}

/// `text` without credential placeholders (allocating only when it has one).
fn loggable(text: String) -> String {
    match scan::redact(&text) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(clean) => clean,
    }
}

pub(crate) fn record_unidentified(
    state: &EgressState,
    host: &str,
    port: u16,
    method: &str,
    started: Instant,
) {
    metrics::counter!(
        "sandgate_egress_decisions_total",
        "phase" => "identify",
        "decision" => "deny"
    )
    .increment(1);
    if !state.log.enabled() {
        return;
    }
    state.log.record(DecisionRecord {
        ts: now_rfc3339(),
        kind: "egress",
        sandbox: None,
        workspace: None,
        phase: "identify",
        protocol: "proxy",
        host: scan::redact(host).into_owned(),
        port,
        ip: None,
        method: Some(scan::redact(method).into_owned()),
        path: None,
        decision: "deny",
        code: Some("proxy_auth_required"),
        reasons: vec!["missing or invalid proxy credentials".into()],
        action: None,
        credentials: Vec::new(),
        credential_types: Vec::new(),
        policy_generation: state.policy.generation(),
        latency_us: started.elapsed().as_micros() as u64,
        policy: None,
        deny_mode: None,
        credential_notes: Vec::new(),
        shared: Default::default(),
    });
}

pub(crate) fn egress_denied(target: &Target, reasons: &[String]) -> Error {
    Error::new(
        Kind::Refused,
        "egress_denied",
        format!(
            "egress to {}:{} is denied by policy: {}",
            target.host,
            target.port,
            reasons.join("; ")
        ),
    )
    .blame(Blame::Sandbox)
    .with_details(Details::destination(&target.host, target.port).with_reasons(reasons.to_vec()))
}

/// [`egress_denied`] for a policy `decision`: names the layer and the decision record, and
/// adds the one-line `reason` an agent can act on.
pub(crate) fn egress_refusal(target: &Target, decision: &Decision) -> Error {
    let mut error = egress_denied(target, &decision.reasons);
    let id = decision.decision_id.as_deref();
    let details = &mut *error.details;
    details.layer = Some(Layer::Egress);
    details.decision_id = id.map(str::to_string);
    details.reason = Some(format!(
        "sandgate's egress policy refuses {}:{} for this sandbox ({}); retrying will not help: use an allowed destination or ask the platform team{}",
        target.host,
        target.port,
        decision.reasons.join("; "),
        id.map(|id| format!(" (decision {id})")).unwrap_or_default(),
    ));
    error
}

pub(crate) fn resolve_error(target: &Target, e: &ResolveError) -> Error {
    match e {
        ResolveError::Forbidden { ip, why, .. } => Error::new(
            Kind::Forbidden,
            "destination_forbidden",
            format!(
                "{} resolves to {ip}, a {} address that sandboxes may not reach",
                target.host,
                why.as_str()
            ),
        )
        .blame(Blame::Sandbox)
        .with_details(Details {
            ip: Some(ip.to_string()),
            ..Details::destination(&target.host, target.port)
                .with_reasons(vec![format!("{} address", why.as_str())])
        }),
        ResolveError::Lookup { reason, .. } => Error::new(
            Kind::Upstream,
            "dns_failed",
            format!("cannot resolve {}: {reason}", target.host),
        )
        .destination(&target.host, target.port),
    }
}

pub(crate) fn misdirected(target: &Target, named: &str) -> Error {
    Error::new(
        Kind::Misdirected,
        "misdirected_request",
        format!(
            "request names {named:?} but the tunnel is to {}",
            target.authority
        ),
    )
    .blame(Blame::Sandbox)
    .with_details(Details {
        named: Some(named.to_string()),
        ..Details::destination(&target.host, target.port)
    })
}

pub(crate) fn sandbox_inactive(id: &str) -> Error {
    Error::new(
        Kind::Forbidden,
        "sandbox_inactive",
        format!("sandbox {id} has no active egress identity (deleted, or not running yet)"),
    )
}

/// A destination name that carries a placeholder: refused before it is resolved, since the
/// lookup itself would carry the placeholder out (DNS is an exfiltration channel).
pub(crate) fn placeholder_in_destination(port: u16) -> Error {
    let reason = "the destination host carries a credential placeholder";
    Error::new(
        Kind::Forbidden,
        "credential_destination_mismatch",
        format!("{reason}; it was not resolved or forwarded"),
    )
    .blame(Blame::Sandbox)
    .with_details(Details {
        port: Some(port),
        reasons: Some(vec![reason.to_string()]),
        ..Details::default()
    })
}

#[cfg(test)]
#[path = "decision_tests.rs"]
mod tests;
