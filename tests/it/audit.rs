//! Observe-only rollout (`audit_deny`, `data.sandgate.audit.layers`): a real request through
//! the real proxy is let through and recorded as `would_deny`, counted in
//! `sandgate_policy_would_deny_total`; an enforced deny beside an audited one still refuses;
//! a layer audited as a whole lets every policy refusal through; replay reports the flips
//! enforcing makes.

use std::time::Duration;

use crate::common::*;
use sandgate::cli::replay::{replay_against, ReplayArgs};
use sandgate::policy::replay;
use sandgate::policy::PolicyEngine;
use sandgate::telemetry::MetricsScope;
use serde_json::{json, Value};

const AUDIT: &str = r#"package sandgate.egress
import rego.v1

audit_deny contains "x.wild.test is being closed" if input.destination.host == "x.wild.test"

audit_deny contains "plain.test is being closed" if input.destination.host == "plain.test"

deny contains "plain.test is closed" if input.destination.host == "plain.test"
"#;

fn find<'a>(records: &'a [Value], host: &str) -> &'a Value {
    records
        .iter()
        .rev()
        .find(|r| r["host"] == host)
        .unwrap_or_else(|| panic!("no record for {host}"))
}

/// GETs `url` until it answers `status` (the policy reloads within a few polls).
async fn until_status(client: &reqwest::Client, url: &str, status: u16) {
    for _ in 0..100 {
        let got = client.get(url).send().await.unwrap().status().as_u16();
        if got == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never answered {status}");
}

#[tokio::test]
async fn audited_denials_pass_are_recorded_counted_and_replayed() {
    let _metrics = own_metrics();
    let origin = start_origin(None).await;
    let gw = Gateway::start(GatewayOptions {
        extra_policies: vec![("audit.rego", AUDIT.to_string())],
        ..GatewayOptions::default()
    })
    .await;
    let client = gw.client("sb-a", true);
    let port = origin.port();

    // The audited rule observes; the request reaches the origin.
    let r = client
        .get(format!("http://x.wild.test:{port}/a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(origin.count(), 1);
    // An enforced deny beside an audited one still refuses, and nothing is observed.
    let r = client
        .get(format!("http://plain.test:{port}/b"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.text().await.unwrap().contains("plain.test is closed"));
    assert_eq!(origin.count(), 1);
    // An unaudited allow carries no would_deny.
    let r = client
        .get(format!("http://api.a.test:{port}/c"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let records = gw.decisions(3).await;
    let audited = find(&records, "x.wild.test");
    assert_eq!(audited["decision"], "allow");
    let reasons = json!(["x.wild.test is being closed"]);
    assert_eq!(audited["policy_result"]["would_deny"], reasons, "{audited}");
    assert_eq!(audited["result"]["would_deny"], reasons, "{audited}");
    let refused = find(&records, "plain.test");
    assert_eq!(refused["decision"], "deny");
    assert!(
        refused["policy_result"].get("would_deny").is_none(),
        "{refused}"
    );
    assert!(find(&records, "api.a.test")["policy_result"]
        .get("would_deny")
        .is_none());
    assert_eq!(gw.metric("sandgate_policy_would_deny_total").await, 1.0);

    // The log replays exactly, would_deny included (counted apart from the gateway's).
    let replayed = MetricsScope::run_in(Some(MetricsScope::new()), || {
        let engine = PolicyEngine::load(&gw.policy_dir).unwrap();
        let mut replayed = 0;
        replay::read(&gw.decision_log, |record| {
            let (answer, _) = record.evaluate(&engine);
            assert_eq!(answer, record.recorded, "{}", record.input);
            replayed += 1;
            true
        })
        .unwrap();
        replayed
    });
    assert_eq!(replayed, 3);

    // Enforcing is a policy change: replay names the one would-deny→deny flip.
    let candidate = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&gw.policy_dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("audit_deny contains", "deny contains");
        std::fs::write(candidate.path().join(path.file_name().unwrap()), text).unwrap();
    }
    let args = ReplayArgs {
        decisions: Some(gw.decision_log.clone()),
        since: None,
        url: None,
        against: candidate.path().to_path_buf(),
        json: true,
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(replay_against(&args, &mut out, &mut err), 1);
    let report: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["flipped"], 1, "{report}");
    let group = &report["groups"][0];
    assert_eq!(group["flip"], "would-deny→deny");
    assert_eq!(
        group["reason"],
        "x.wild.test is being closed [scope platform]"
    );

    // A whole layer audited: every policy refusal of it passes and is observed.
    std::fs::write(
        gw.policy_dir.join("data.json"),
        r#"{"sandgate": {"audit": {"layers": ["egress"]}}}"#,
    )
    .unwrap();
    until_status(&client, &format!("http://api.b.test:{port}/d"), 200).await;
    let r = client
        .get(format!("http://plain.test:{port}/e"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let records = gw
        .log_records(1, |r| r["host"] == "plain.test" && r["decision"] == "allow")
        .await;
    assert_eq!(
        records[0]["policy_result"]["would_deny"],
        json!(["plain.test is being closed", "plain.test is closed"])
    );
    let b = gw
        .log_records(1, |r| r["host"] == "api.b.test" && r["decision"] == "allow")
        .await;
    assert_eq!(
        b[0]["policy_result"]["would_deny"],
        json!(["no rule allowed this (default deny)"])
    );
    // One count per decision let through with a would-deny, as the log has them.
    let observed = gw
        .log_records(3, |r| r["policy_result"].get("would_deny").is_some())
        .await;
    assert_eq!(
        gw.metric("sandgate_policy_would_deny_total").await,
        observed.len() as f64,
        "{observed:#?}"
    );
}

#[test]
fn a_layer_audit_naming_an_unknown_layer_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/policies")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rego") {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(
        dir.path().join("data.json"),
        r#"{"sandgate": {"audit": {"layers": ["egres"]}}}"#,
    )
    .unwrap();
    let e = PolicyEngine::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("unknown layer \"egres\""), "{e}");
}
