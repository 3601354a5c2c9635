//! The metrics catalog: one row per metric family sandgate exports, the single source of
//! `/metrics`' `# HELP` lines, of the histogram buckets, of the series present from start
//! (at zero) and of docs/metrics.md.
//!
//! Contract:
//! - every name a `metrics::counter!`/`gauge!`/`histogram!` (or [`super::ActiveGauge`]) in
//!   `src/` records has a row here (a unit test scans the sources and fails otherwise);
//! - every latency is a histogram with fixed buckets, never a summary, so replicas'
//!   series add up;
//! - labels take values from a small set known in the code (layer, decision, outcome,
//!   phase...) or from configuration (pool, provider); never a sandbox id, host or path.
//!
//! Adding a metric is one row in [`FAMILIES`] (then `SANDGATE_WRITE_DOCS=1 cargo test --lib
//! telemetry::catalog` rewrites docs/metrics.md).

/// A Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// The label names, in order.
    pub labels: &'static [&'static str],
    /// For each label (same order), the values known before any traffic: every combination
    /// is exported at zero from start. A label with no known values (empty list) means the
    /// family appears on its first event only (its values come from configuration or data).
    pub known: &'static [&'static [&'static str]],
    /// Histogram buckets (upper bounds, seconds); `None` for counters and gauges.
    pub buckets: Option<&'static [f64]>,
}

/// Policy evaluation is microseconds: buckets around the 10 µs target.
pub const POLICY_BUCKETS: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 1e-1,
];
/// Request-scale latencies: a proxied request, an API call.
pub const REQUEST_BUCKETS: &[f64] = &[
    1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Slow operations: a create, a provider attempt, a change reaching another replica.
pub const SLOW_BUCKETS: &[f64] = &[
    1e-3, 1e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

pub const LAYERS: &[&str] = &[
    "egress",
    "credential",
    "creation",
    "provider",
    "lifecycle",
    "action",
];
const ALLOW_DENY: &[&str] = &["allow", "deny"];
const POLICY_OUTCOMES: &[&str] = &["allow", "deny", "error"];
const EGRESS_PHASES: &[&str] = &[
    "identify", "connect", "tunnel", "tls", "request", "trailers",
];
const OPEN: &[&str] = &[];

const fn counter(name: &'static str, help: &'static str) -> Family {
    labelled(name, Kind::Counter, help, &[], &[])
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    labelled(name, Kind::Gauge, help, &[], &[])
}

const fn labelled(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    labels: &'static [&'static str],
    known: &'static [&'static [&'static str]],
) -> Family {
    Family {
        name,
        kind,
        help,
        labels,
        known,
        buckets: None,
    }
}

const fn histogram(
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    known: &'static [&'static [&'static str]],
    buckets: &'static [f64],
) -> Family {
    Family {
        name,
        kind: Kind::Histogram,
        help,
        labels,
        known,
        buckets: Some(buckets),
    }
}

use Kind::{Counter, Gauge};

/// Every metric family, grouped by subsystem (one row a line: not reformatted).
#[rustfmt::skip]
pub const FAMILIES: &[Family] = &[
    // Policy.
    histogram("sandgate_policy_eval_seconds", "Time to evaluate one policy decision, by layer.", &["layer"], &[LAYERS], POLICY_BUCKETS),
    labelled("sandgate_policy_would_deny_total", Counter, "Refusals recorded but not enforced (audit_deny rules and audited layers), by layer.", &["layer"], &[LAYERS]),
    labelled("sandgate_proxy_deny_tunnels_total", Counter, "Refused CONNECTs answered inside the tunnel (in_tunnel) or on the CONNECT because the leaf budget was spent (budget).", &["outcome"], &[&["in_tunnel", "budget"]]),
    gauge("sandgate_decision_ring_bytes", "Bytes of decision records held in the in-memory ring."),
    counter("sandgate_decision_ring_dropped_total", "Decision records larger than the whole ring, not kept."),
    counter("sandgate_decision_streams_refused_total", "Decision streams refused at the concurrent-stream limit."),
    counter("sandgate_decision_streams_dropped_total", "Decision streams closed because the client fell behind the ring."),
    labelled("sandgate_policy_decisions_total", Counter, "Policy decisions, by layer and outcome (allow, deny, error).", &["layer", "outcome"], &[LAYERS, POLICY_OUTCOMES]),
    labelled("sandgate_policy_eval_errors_total", Counter, "Policy evaluations that failed (and so denied), by layer.", &["layer"], &[LAYERS]),
    labelled("sandgate_policy_reloads_total", Counter, "Policy directory reloads, by outcome (loaded, rejected).", &["outcome"], &[&["loaded", "rejected"]]),
    gauge("sandgate_policy_generation", "The policy generation this replica enforces."),
    labelled("sandgate_policy_info", Gauge, "1 for the digest of the policy this replica enforces.", &["digest"], &[OPEN]),
    // Egress proxy.
    histogram("sandgate_proxy_decision_seconds", "Time from an egress request's arrival to its decision record (forwarded, refused or failed), by phase.", &["phase"], &[EGRESS_PHASES], REQUEST_BUCKETS),
    labelled("sandgate_egress_decisions_total", Counter, "Egress decisions, by phase and decision.", &["phase", "decision"], &[EGRESS_PHASES, ALLOW_DENY]),
    gauge("sandgate_proxy_connections_active", "Client connections open on the proxy."),
    counter("sandgate_proxy_connections_shed_total", "Proxy connections closed at accept because max_connections was reached."),
    gauge("sandgate_proxy_tunnels_active", "CONNECT tunnels open."),
    gauge("sandgate_proxy_tunnels_parked", "Idle tunnels parked (holding no worker task state)."),
    labelled("sandgate_proxy_tunnel_parks_total", Counter, "Idle tunnels parked, by the protocol served in them.", &["protocol"], &[&["http/1.1", "h2"]]),
    counter("sandgate_proxy_tunnels_revoked_total", "Open tunnels cut because their sandbox or credential was revoked."),
    labelled("sandgate_proxy_tunnels_refused_total", Counter, "CONNECT tunnels refused by a limit.", &["limit"], &[&["per_identity"]]),
    counter("sandgate_proxy_panics_total", "Proxy connection tasks that panicked (the connection is closed, the proxy goes on)."),
    labelled("sandgate_proxy_tls_handshake_failures_total", Counter, "Client TLS handshakes on the TLS proxy listener that failed, by reason.", &["reason"], &[&["error", "timeout"]]),
    // Ports gateway.
    labelled("sandgate_port_requests_total", Counter, "Requests to sandbox ports through the ports gateway, by outcome.", &["outcome"], &[&["forwarded", "bad_request", "unauthenticated", "refused", "not_found", "sandbox_state", "unsupported", "upstream_failed", "handshake_failed", "error"]]),
    counter("sandgate_port_connections_shed_total", "Ports gateway connections closed at accept because [ports] max_connections was reached."),
    counter("sandgate_tls_leaf_minted_total", "Interception leaf certificates minted."),
    counter("sandgate_tls_leaf_cache_hits_total", "Interception leaf certificates served from the cache."),
    labelled("sandgate_identity_lookups_total", Counter, "Store lookups of sandbox identities the proxy did not know, by outcome.", &["outcome"], &[&["found", "absent", "limited", "failed"]]),
    // Credentials.
    labelled("sandgate_credential_applied_total", Counter, "Credentials injected into egress requests, by workspace and credential name (names come from configuration).", &["workspace", "credential"], &[OPEN, OPEN]),
    labelled("sandgate_credential_refresh_total", Counter, "Minted-credential token refreshes, by outcome.", &["outcome"], &[OPEN]),
    // Decision log.
    counter("sandgate_decision_log_dropped_total", "Decision records dropped because the log writer fell behind."),
    counter("sandgate_decision_log_write_errors_total", "Decision log writes that failed."),
    gauge("sandgate_decision_log_queued", "Decision records waiting for the log writer, read at its last drain (past `[log] decisions_queue` they are dropped and counted)."),
    // API.
    histogram("sandgate_api_request_seconds", "Time to answer one API request, by status class.", &["status_class"], &[&["1xx", "2xx", "3xx", "4xx", "5xx"]], REQUEST_BUCKETS),
    gauge("sandgate_api_connections_active", "Connections open on the API listener."),
    labelled("sandgate_api_connections_shed_total", Counter, "API connections closed at accept by a limit.", &["limit"], &[&["total", "per_ip"]]),
    counter("sandgate_api_connections_idle_closed_total", "API connections closed for being idle."),
    counter("sandgate_event_streams_refused_total", "Event streams refused because too many were open."),
    labelled("sandgate_e2b_requests_total", Counter, "Requests to the E2B facade, by plane, matched route and status.", &["plane", "route", "status"], &[OPEN, OPEN, OPEN]),
    // Sandboxes.
    counter("sandgate_sandbox_creates_total", "Sandbox creations accepted."),
    labelled("sandgate_sandbox_create_failures_total", Counter, "Sandbox creations that failed, by error code.", &["code"], &[OPEN]),
    labelled("sandgate_create_retries_total", Counter, "Create attempts retried, by failure class.", &["class"], &[OPEN]),
    counter("sandgate_create_fenced_total", "Creates stopped because another replica took the sandbox over."),
    labelled("sandgate_pool_circuit_opened_total", Counter, "Pool circuit breakers opened, by pool (from configuration).", &["pool"], &[OPEN]),
    labelled("sandgate_sandboxes_lost_total", Counter, "Sandboxes found gone at their provider, by provider (from configuration).", &["provider"], &[OPEN]),
    counter("sandgate_sandboxes_expired_total", "Sandboxes deleted on expiry."),
    counter("sandgate_janitor_deleted_instances_total", "Orphaned provider instances deleted by the janitor."),
    counter("sandgate_sandbox_execs_total", "Commands run in sandboxes through the API."),
    counter("sandgate_store_unavailable_total", "Requests refused because the store did not answer."),
    // Replicas.
    labelled("sandgate_changes_applied_total", Counter, "Changes from other replicas applied, by kind.", &["kind"], &[OPEN]),
    histogram("sandgate_change_delay_seconds", "Delay between a change on one replica and its application here.", &[], &[], SLOW_BUCKETS),
    labelled("sandgate_reconcile_repaired_total", Counter, "State repaired by the periodic reconcile, by kind.", &["kind"], &[&["sandbox", "credential"]]),
    counter("sandgate_changes_unrecorded_total", "Changes that could not be recorded for the other replicas."),
];

/// The row of `name`, if it is in the catalog.
pub fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// Describes every family to the current recorder (the `# HELP` lines) and creates its
/// known series at zero, so a dashboard or alert sees them before the first event.
/// Idempotent: a counter is incremented by zero, a gauge moved by zero.
pub fn register() {
    for family in FAMILIES {
        describe(family);
        for labels in combinations(family) {
            zero(family, labels);
        }
    }
}

fn describe(family: &Family) {
    match family.kind {
        Kind::Counter => metrics::describe_counter!(family.name, family.help),
        Kind::Gauge => metrics::describe_gauge!(family.name, family.help),
        Kind::Histogram => metrics::describe_histogram!(family.name, family.help),
    }
}

fn zero(family: &Family, labels: Vec<metrics::Label>) {
    match family.kind {
        Kind::Counter => metrics::counter!(family.name, labels).increment(0),
        Kind::Gauge => metrics::gauge!(family.name, labels).increment(0.0),
        // Registering the handle is enough: it renders with empty buckets.
        Kind::Histogram => drop(metrics::histogram!(family.name, labels)),
    }
}

/// Every combination of the known label values (none when a label's values are open).
fn combinations(family: &Family) -> Vec<Vec<metrics::Label>> {
    let mut sets: Vec<Vec<metrics::Label>> = vec![Vec::new()];
    for (name, values) in family.labels.iter().zip(family.known) {
        sets = sets
            .into_iter()
            .flat_map(|set| {
                values.iter().map(move |value| {
                    let mut next = set.clone();
                    next.push(metrics::Label::new(*name, *value));
                    next
                })
            })
            .collect();
    }
    sets
}

/// docs/metrics.md: the catalog as a table.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Metrics\n\n\
         Generated from `src/telemetry/catalog.rs` (`SANDGATE_WRITE_DOCS=1 cargo test --lib \
         telemetry::catalog` rewrites it). Served on the API listener at `GET /metrics` in the \
         Prometheus text format, every family with `# HELP` and `# TYPE`. Labels marked *known* \
         are exported at zero from start for every value listed; the others appear with their \
         first event. Latencies are histograms (`_bucket`, `_sum`, `_count`), so they \
         aggregate across replicas.\n\n\
         | name | type | labels | help |\n| --- | --- | --- | --- |\n",
    );
    for family in FAMILIES {
        let labels: Vec<String> = family
            .labels
            .iter()
            .zip(family.known)
            .map(|(label, values)| match values.is_empty() {
                true => format!("`{label}`"),
                false => format!("`{label}` (known: {})", values.join(", ")),
            })
            .collect();
        let mut help = family.help.to_string();
        if let Some(buckets) = family.buckets {
            let b: Vec<String> = buckets.iter().map(|b| b.to_string()).collect();
            help.push_str(&format!(" Buckets (s): {}.", b.join(", ")));
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            family.name,
            family.kind.as_str(),
            labels.join(", "),
            help
        ));
    }
    out
}

#[cfg(test)]
#[path = "catalog_tests.rs"]
mod tests;
