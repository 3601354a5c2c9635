use std::sync::Arc;

use proptest::prelude::*;
use serde::Serialize;

use super::egress_line;
use crate::decision_log::{
    summary_input, with_input, DecisionRecord, Labels, LoggedEval, LoggedInput, SharedObject,
};

/// The reference: the record through `serde`, as the line was written before it was
/// written by hand (a flattened record, `result` as a `serde_json` map).
#[derive(Serialize)]
struct EgressLine<'a> {
    #[serde(flatten)]
    record: &'a DecisionRecord,
    decision_id: &'a str,
    layer: &'static str,
    policy_path: &'static str,
    result: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_result: Option<&'a serde_json::Value>,
    timestamp: &'a str,
    labels: Labels,
    metrics: EgressMetrics,
}

#[derive(Serialize)]
struct EgressMetrics {
    timer_server_handler_ns: u64,
}

fn reference_result(record: &DecisionRecord) -> serde_json::Value {
    let allowed = record.decision == "allow";
    let deny = if allowed {
        Vec::new()
    } else {
        record.reasons.clone()
    };
    let mut result = serde_json::json!({"allow": allowed, "deny": deny});
    if let Some(action) = &record.action {
        result["action"] = action.clone().into();
    }
    if let Some(code) = record.code {
        result["code"] = code.into();
    }
    if let Some(would) = record
        .policy
        .as_ref()
        .and_then(|p| p.result.get("would_deny"))
    {
        result["would_deny"] = would.clone();
    }
    result
}

fn reference(record: &DecisionRecord, decision_id: &str) -> Vec<u8> {
    let line = serde_json::to_vec(&EgressLine {
        record,
        decision_id,
        layer: "egress",
        policy_path: "sandgate/egress",
        result: reference_result(record),
        policy_result: record.policy.as_ref().map(|p| &p.result),
        timestamp: &record.ts,
        labels: Labels::new(record.policy_generation),
        metrics: EgressMetrics {
            timer_server_handler_ns: record.latency_us.saturating_mul(1000),
        },
    })
    .unwrap();
    with_input(line, |out| match &record.policy {
        Some(policy) => policy.input.write_json(out),
        None => serde_json::to_writer(out, &summary_input(record)).unwrap(),
    })
}

fn written(record: &DecisionRecord, decision_id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    egress_line(record, decision_id, &mut out);
    // Again: the shared objects are now written from the renderings the first line made.
    let mut again = Vec::new();
    egress_line(record, decision_id, &mut again);
    assert_eq!(
        out, again,
        "a shared object's rendering is what it renders to"
    );
    out
}

/// Text with what JSON must escape: quotes, backslashes, controls, and non-ASCII.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9./_-]{0,12}",
        "[\\x00-\\x7f]{0,12}",
        any::<String>(),
        Just("sgph_0123456789abcdef0123456789abcdef01234567".to_string()),
    ]
}

fn one_of(items: &'static [&'static str]) -> impl Strategy<Value = &'static str> {
    proptest::sample::select(items)
}

/// A policy decision, and the objects of its input shared as a tunnel shares them (a
/// `destination` object, when there is one and it is shared).
type Policy = (Option<Arc<LoggedEval>>, [Option<Arc<SharedObject>>; 2]);

fn policy() -> impl Strategy<Value = Policy> {
    let result = (
        any::<bool>(),
        proptest::collection::vec(text(), 0..3),
        proptest::option::of(proptest::collection::vec(text(), 0..2)),
    )
        .prop_map(|(allow, deny, would)| {
            let mut result = serde_json::json!({"allow": allow, "deny": deny, "action": "inspect"});
            if let Some(would) = would {
                result["would_deny"] = would.into();
            }
            result
        });
    let eval = (text(), text(), result, any::<bool>()).prop_map(|(id, host, result, share)| {
        let mut destination = regorus::Value::new_object();
        destination.as_object_mut().unwrap().insert(
            regorus::Value::from("host"),
            regorus::Value::from(host.as_str()),
        );
        let mut input = regorus::Value::new_object();
        let fields = input.as_object_mut().unwrap();
        fields.insert(regorus::Value::from("host"), regorus::Value::from(host));
        fields.insert(regorus::Value::from("destination"), destination.clone());
        let eval = Arc::new(LoggedEval {
            decision_id: id,
            input: LoggedInput {
                value: input,
                full_argv: false,
            },
            result,
        });
        let shared = [share.then(|| SharedObject::new(destination)), None];
        (Some(eval), shared)
    });
    prop_oneof![Just((None, Default::default())), eval]
}

prop_compose! {
    fn record()(
        (ts, sandbox, workspace, host, port) in
            (text(), proptest::option::of(text()), proptest::option::of(text()), text(), any::<u16>()),
        (ip, method, path) in
            (proptest::option::of(any::<std::net::IpAddr>()), proptest::option::of(text()), proptest::option::of(text())),
        (kind, phase, protocol, decision) in (
            one_of(&["egress", "policy"]),
            one_of(&["connect", "request"]),
            one_of(&["https/h1", "https/h2", "http"]),
            one_of(&["allow", "deny", "error"]),
        ),
        code in proptest::option::of(one_of(&["egress_denied", "upstream_unreachable"])),
        reasons in proptest::collection::vec(text(), 0..3),
        action in proptest::option::of(text()),
        credentials in proptest::collection::vec(text(), 0..3),
        credential_types in proptest::collection::vec(one_of(&["header", "aws_sigv4"]), 0..3),
        (policy_generation, latency_us) in (any::<u64>(), any::<u64>()),
        (policy, shared) in policy(),
        deny_mode in proptest::option::of(one_of(&["in_tunnel", "connect"])),
        credential_notes in proptest::collection::vec(text(), 0..2),
    ) -> DecisionRecord {
        DecisionRecord {
            ts, kind, sandbox, workspace, phase, protocol, host, port, ip, method, path,
            decision, code, reasons, action, credentials, credential_types,
            policy_generation, latency_us, policy, deny_mode, credential_notes, shared,
        }
    }
}

proptest! {
    #[test]
    fn the_line_is_the_serde_line_byte_for_byte(record in record(), id in text()) {
        let line = written(&record, &id);
        let expected = reference(&record, &id);
        prop_assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(&expected));
        serde_json::from_slice::<serde_json::Value>(&line).expect("a JSON line");
    }
}
