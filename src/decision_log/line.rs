//! An egress record's line, written field by field into one buffer.
//!
//! The line: the record's own fields, flat (what existing readers use), plus the OPA
//! fields. When policy decided, `decision_id` is the policy decision's, `input` the
//! complete input it evaluated and `policy_result` its answer (`result` is the record's
//! outcome, which a later refusal may differ from); otherwise `input` is summarised from the
//! record and there is no `policy_result` (nothing to replay). The timer is the whole
//! decision's, as OPA's `timer_server_handler_ns`. `path` keeps its older meaning here (the
//! request path, query values removed), so the package path is in `policy_path`.
//!
//! Contract: [`egress_line`] writes exactly the bytes `serde_json` writes for the record's
//! documented shape (its own fields flat, in declaration order, `None` and empty lists
//! skipped where the struct says so; then `decision_id`, `layer`, `policy_path`, `result`
//! with its keys sorted as a `serde_json` map sorts them, `policy_result`, `timestamp`,
//! `labels`, `metrics`; `input` last). `line_tests.rs` holds it to the `serde` reference
//! over generated records, byte for byte.
//!
//! Why by hand: the writer thread renders one of these per proxied request, and through
//! `serde` (a `#[serde(flatten)]` record and a `result` built as a `serde_json::Value`,
//! cloning the reasons) it cost ~11k instructions of the ~32k a record took, the largest
//! share after the input. Every key here is a constant that needs no escaping, so it is
//! copied whole; strings take [`super::render::write_str`]'s copy-when-clean path.

use super::render::write_str;
use super::{summary_input, DecisionRecord};

/// A JSON object being written: commas between members, keys copied whole.
struct Obj<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> Obj<'a> {
    fn open(out: &'a mut Vec<u8>) -> Obj<'a> {
        out.push(b'{');
        Obj { out, empty: true }
    }

    /// Starts member `key` (a constant without characters to escape); the caller writes
    /// its value into the returned buffer.
    fn key(&mut self, key: &'static str) -> &mut Vec<u8> {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    fn str(&mut self, key: &'static str, value: &str) {
        write_str(value, self.key(key));
    }

    fn opt_str(&mut self, key: &'static str, value: Option<&str>) {
        match value {
            Some(value) => self.str(key, value),
            None => self.key(key).extend_from_slice(b"null"),
        }
    }

    fn num(&mut self, key: &'static str, value: u64) {
        let mut digits = itoa::Buffer::new();
        self.key(key)
            .extend_from_slice(digits.format(value).as_bytes());
    }

    fn bool(&mut self, key: &'static str, value: bool) {
        let text: &[u8] = if value { b"true" } else { b"false" };
        self.key(key).extend_from_slice(text);
    }

    fn strs<S: AsRef<str>>(&mut self, key: &'static str, items: &[S]) {
        let out = self.key(key);
        out.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(item.as_ref(), out);
        }
        out.push(b']');
    }

    fn json(&mut self, key: &'static str, value: &serde_json::Value) {
        // Writing a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *self.key(key), value);
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

/// Appends `record`'s line (without the newline) to `out`, under `decision_id`.
pub(super) fn egress_line(record: &DecisionRecord, decision_id: &str, out: &mut Vec<u8>) {
    let mut line = Obj::open(out);
    own_fields(record, &mut line);
    line.str("decision_id", decision_id);
    line.str("layer", "egress");
    line.str("policy_path", "sandgate/egress");
    result(record, Obj::open(line.key("result")));
    if let Some(policy) = &record.policy {
        line.json("policy_result", &policy.result);
    }
    line.str("timestamp", &record.ts);
    let mut labels = Obj::open(line.key("labels"));
    labels.str("app", "sandgate");
    labels.str("version", env!("CARGO_PKG_VERSION"));
    labels.num("generation", record.policy_generation);
    labels.close();
    let mut metrics = Obj::open(line.key("metrics"));
    metrics.num(
        "timer_server_handler_ns",
        record.latency_us.saturating_mul(1000),
    );
    metrics.close();
    let out = line.key("input");
    match &record.policy {
        Some(policy) => policy.input.write_json_with(out, &record.shared),
        // Writing a Value into a Vec cannot fail.
        None => drop(serde_json::to_writer(&mut *out, &summary_input(record))),
    }
    line.close();
}

/// The record's own fields, in [`DecisionRecord`]'s order and with its skipping rules.
fn own_fields(r: &DecisionRecord, line: &mut Obj<'_>) {
    line.str("ts", &r.ts);
    line.str("kind", r.kind);
    line.opt_str("sandbox", r.sandbox.as_deref());
    line.opt_str("workspace", r.workspace.as_deref());
    line.str("phase", r.phase);
    line.str("protocol", r.protocol);
    line.str("host", &r.host);
    line.num("port", u64::from(r.port));
    if let Some(ip) = r.ip {
        line.str("ip", &ip.to_string());
    }
    let present = [("method", &r.method), ("path", &r.path)];
    for (key, value) in present {
        if let Some(value) = value {
            line.str(key, value);
        }
    }
    line.str("decision", r.decision);
    if let Some(code) = r.code {
        line.str("code", code);
    }
    line.strs("reasons", &r.reasons);
    if let Some(action) = &r.action {
        line.str("action", action);
    }
    if !r.credentials.is_empty() {
        line.strs("credentials", &r.credentials);
    }
    if !r.credential_types.is_empty() {
        line.strs("credential_types", &r.credential_types);
    }
    line.num("policy_generation", r.policy_generation);
    line.num("latency_us", r.latency_us);
    if let Some(mode) = r.deny_mode {
        line.str("deny_mode", mode);
    }
    if !r.credential_notes.is_empty() {
        line.strs("credential_notes", &r.credential_notes);
    }
}

/// What happened to the request, in OPA's `result` shape with the refusal's code: keys in
/// the order a `serde_json` map keeps them (sorted).
fn result(r: &DecisionRecord, mut result: Obj<'_>) {
    let allowed = r.decision == "allow";
    if let Some(action) = &r.action {
        result.str("action", action);
    }
    result.bool("allow", allowed);
    if let Some(code) = r.code {
        result.str("code", code);
    }
    let no_reasons: &[String] = &[];
    result.strs("deny", if allowed { no_reasons } else { &r.reasons });
    // Let through under audit: what happened carries what policy would have refused.
    if let Some(would) = r.policy.as_ref().and_then(|p| p.result.get("would_deny")) {
        result.json("would_deny", would);
    }
    result.close();
}

#[cfg(test)]
#[path = "line_tests.rs"]
mod tests;
