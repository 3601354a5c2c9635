//! Replaying logged decisions (`sandgate policy eval --replay`, `sandgate policy replay`):
//! a real gateway logs real traffic (egress through the proxy, allowed and refused, at the
//! connect and request phases; creates through the API), then every record is evaluated
//! again from the log alone, under the same policy and under a candidate with one more deny.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use sandgate::cli::replay::{eval_replay, replay_against, ReplayArgs};
use sandgate::policy::replay::{self, Recorded};
use sandgate::policy::PolicyEngine;
use serde_json::{json, Value};

const TOKEN_A: &str = "api-token-ws-a-0123456789";
const TOKEN_B: &str = "api-token-ws-b-0123456789";

fn config() -> String {
    format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{TOKEN_B}"
principal = "bob"
workspace = "ws-b"

[create]
short_wait_ms = 3000

[[providers]]
name = "sim"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}

[[accounts]]
name = "acct-a"
provider = "sim"

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
"#
    )
}

/// Drives the traffic; returns how many egress and creation decisions it made.
async fn traffic(gw: &Gateway, origin_port: u16) -> (usize, usize) {
    let client = gw.client("sb-a", true);
    let mut egress = 0;
    for (host, n) in [("api.a.test", 40), ("api.b.test", 20), ("x.wild.test", 20)] {
        for i in 0..n {
            // Refused ones answer 403; either way one request-phase decision.
            let url = format!("http://{host}:{origin_port}/r/{i}?token=s3cret");
            client.get(url).send().await.unwrap();
            egress += 1;
        }
    }
    for (authority, n) in [
        (format!("api.a.test:{origin_port}"), 10),
        ("api.b.test:443".to_string(), 10),
    ] {
        for _ in 0..n {
            let _ = connect_tunnel(gw.server.proxy_addr(), &authority, Some(("sb-a", TOKEN))).await;
            egress += 1;
        }
    }
    let api = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut creates = 0;
    for (token, team) in [(TOKEN_A, "ml"), (TOKEN_A, "web"), (TOKEN_B, "ml")] {
        let resp = api
            .post(gw.api("/v1/sandboxes"))
            .bearer_auth(token)
            .json(&json!({"labels": {"team": team}}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        let id = resp.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        creates += 1;
        // A lifecycle decision too (delete), whatever its answer.
        api.delete(gw.api(&format!("/v1/sandboxes/{id}")))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
    }
    (egress, creates)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

fn all_records(log: &Path) -> Vec<Recorded> {
    let mut records = Vec::new();
    replay::read(log, |r| {
        records.push(r);
        true
    })
    .unwrap();
    records
}

fn run(f: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> i32) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = f(&mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[tokio::test]
async fn logged_decisions_replay_exactly_and_a_candidate_deny_flips_only_its_own() {
    let origin = start_origin(None).await;
    let gw = Gateway::start(GatewayOptions {
        extra_toml: config(),
        ..GatewayOptions::default()
    })
    .await;
    let (egress, creates) = traffic(&gw, origin.port()).await;
    // The log is written off the request path: wait until every decision is in it.
    gw.decisions(egress).await;
    gw.policy_decisions("provider", creates).await;
    gw.policy_decisions("lifecycle", creates).await;
    let creation = gw.policy_decisions("creation", creates).await;
    assert!(creation.len() >= creates);

    // (a) Every replayable record, from the log alone, decides as recorded.
    let records = all_records(&gw.decision_log);
    assert!(records.len() >= 100, "{} records", records.len());
    let engine = PolicyEngine::load(&gw.policy_dir).unwrap();
    let mut layers = std::collections::BTreeSet::new();
    let (mut allowed, mut denied) = (0, 0);
    for record in &records {
        let (answer, _) = record.evaluate(&engine);
        assert_eq!(
            answer, record.recorded,
            "line {} ({}) replays differently: {}",
            record.line, record.decision_id, record.input
        );
        layers.insert(record.layer.as_str());
        if record.recorded.allow {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    assert!(
        allowed >= 50 && denied >= 20,
        "{allowed} allowed, {denied} denied"
    );
    for layer in ["egress", "creation", "provider", "lifecycle"] {
        assert!(layers.contains(layer), "no {layer} record in {layers:?}");
    }
    // The derivations are in the record, the secrets are not.
    let request = records
        .iter()
        .find(|r| r.input["phase"] == "request" && r.input["destination"]["host"] == "api.a.test")
        .unwrap();
    assert_eq!(
        request.input["destination"]["match_names"],
        json!(["api.a.test", "*.a.test", "*.test"])
    );
    assert!(request.input["sandbox"]["allow_domains"]
        .as_array()
        .unwrap()
        .contains(&json!("api.a.test")));
    assert_eq!(request.input["request"]["path"], "/r/0?token=");
    let text = std::fs::read_to_string(&gw.decision_log).unwrap();
    assert!(!text.contains("s3cret") && !text.contains(TOKEN));
    for phase in ["connect", "request"] {
        assert!(
            records.iter().any(|r| r.input["phase"] == phase),
            "no {phase} record"
        );
    }

    // The command, on one record of every layer, phase and verdict.
    let mut seen = std::collections::BTreeSet::new();
    for record in &records {
        let key = (
            record.layer.as_str(),
            record.input["phase"].to_string(),
            record.recorded.allow,
        );
        if !seen.insert(key) {
            continue;
        }
        let (code, out, err) =
            run(|o, e| eval_replay(&record.decision_id, &gw.decision_log, &gw.policy_dir, o, e));
        assert_eq!(code, 0, "{out}{err}");
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["matches"], true);
        assert_eq!(report["decision_id"], record.decision_id.as_str());
    }
    assert!(seen.len() >= 5, "{seen:?}");
    let (code, _, err) =
        run(|o, e| eval_replay("no-such-id", &gw.decision_log, &gw.policy_dir, o, e));
    assert_eq!(code, 2);
    assert!(err.contains("no replayable decision no-such-id"), "{err}");

    // (b) An unchanged copy flips nothing; one more deny flips exactly what it names.
    let candidates = tempfile::tempdir().unwrap();
    let same = candidates.path().join("same");
    copy_dir(&gw.policy_dir, &same);
    let args = ReplayArgs {
        decisions: Some(gw.decision_log.clone()),
        since: None,
        url: None,
        against: same,
        json: true,
    };
    let (code, out, err) = run(|o, e| replay_against(&args, o, e));
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["flipped"], 0);
    assert_eq!(report["replayed"].as_u64().unwrap() as usize, records.len());

    let closed = candidates.path().join("closed");
    copy_dir(&gw.policy_dir, &closed);
    std::fs::write(
        closed.join("replay_close.rego"),
        "package sandgate.egress\nimport rego.v1\n\ndeny contains \"x.wild.test is closed\" if input.destination.host == \"x.wild.test\"\n",
    )
    .unwrap();
    let expected: Vec<&str> = records
        .iter()
        .filter(|r| r.recorded.allow && r.input["destination"]["host"] == "x.wild.test")
        .map(|r| r.decision_id.as_str())
        .collect();
    assert_eq!(expected.len(), 20);
    let args = ReplayArgs {
        decisions: Some(gw.decision_log.clone()),
        since: None,
        url: None,
        against: closed,
        json: true,
    };
    let (code, out, err) = run(|o, e| replay_against(&args, o, e));
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["flipped"], 20, "{report}");
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{report}");
    let group = &groups[0];
    assert_eq!(group["layer"], "egress");
    assert_eq!(group["flip"], "allow→deny");
    assert_eq!(group["workspace"], "ws-a");
    assert_eq!(group["sandbox"], "sb-a");
    assert_eq!(
        group["destination"],
        format!("x.wild.test:{}", origin.port())
    );
    assert_eq!(group["reason"], "x.wild.test is closed [scope platform]");
    assert_eq!(group["count"], 20);
    let examples = group["examples"].as_array().unwrap();
    assert_eq!(examples.len(), 3);
    for example in examples {
        assert!(expected.contains(&example.as_str().unwrap()), "{example}");
    }
    // The text form names the same group.
    let args = ReplayArgs {
        json: false,
        ..args
    };
    let (code, out, _) = run(|o, e| replay_against(&args, o, e));
    assert_eq!(code, 1);
    assert!(
        out.contains("20 flipped") && out.contains("egress allow→deny"),
        "{out}"
    );

    // The same through the real binary: `policy replay` and `policy eval --replay`.
    let bin = env!("CARGO_BIN_EXE_sandgate");
    let replayed = std::process::Command::new(bin)
        .args(["policy", "replay", "--json", "--decisions"])
        .arg(&gw.decision_log)
        .arg("--against")
        .arg(&args.against)
        .output()
        .unwrap();
    assert_eq!(replayed.status.code(), Some(1), "{replayed:?}");
    let report: Value = serde_json::from_slice(&replayed.stdout).unwrap();
    assert_eq!(report["flipped"], 20, "{report}");
    let one = std::process::Command::new(bin)
        .args(["policy", "eval", "--replay", expected[0], "--decisions"])
        .arg(&gw.decision_log)
        .arg("--dir")
        .arg(&gw.policy_dir)
        .output()
        .unwrap();
    assert_eq!(one.status.code(), Some(0), "{one:?}");
    let flipped = std::process::Command::new(bin)
        .args(["policy", "eval", "--replay", expected[0], "--decisions"])
        .arg(&gw.decision_log)
        .arg("--dir")
        .arg(&args.against)
        .output()
        .unwrap();
    assert_eq!(flipped.status.code(), Some(1), "{flipped:?}");

    // A tampered line is named; the command errs (2), it does not panic.
    let broken = candidates.path().join("broken.jsonl");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(2, "{\"kind\": \"policy\", \"layer\":");
    std::fs::write(&broken, lines.join("\n")).unwrap();
    let args = ReplayArgs {
        decisions: Some(broken),
        since: None,
        url: None,
        against: args.against.clone(),
        json: false,
    };
    let (code, _, err) = run(|o, e| replay_against(&args, o, e));
    assert_eq!(code, 2);
    assert!(err.contains("broken.jsonl:3: not a JSON record"), "{err}");
}
