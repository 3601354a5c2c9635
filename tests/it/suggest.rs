//! `sandgate policy suggest`: a request refused by the real proxy, the suggestion printed by
//! the real binary and saved into the policy directory as printed; then that request passes,
//! its neighbours (other path, method, host) are still refused, and `policy replay` over the
//! log recorded before the change flips that request and nothing else.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

fn sandgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

async fn status(client: &reqwest::Client, method: &str, url: &str) -> u16 {
    client
        .request(method.parse().unwrap(), url)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_suggestion_applied_allows_exactly_the_refused_request() {
    let origin = start_origin(None).await;
    let mut options = GatewayOptions::default();
    options.hosts.push(("api.c.test", "127.0.0.1"));
    let gw = Gateway::start(options).await;
    let client = gw.client("sb-a", true);
    let port = origin.port();
    let target = format!("http://api.b.test:{port}/v1/items/7?token=s3cret");
    assert_eq!(status(&client, "GET", &target).await, 403);
    // Recorded traffic besides it: allowed, and refused neighbours.
    let neighbours = [
        ("POST", format!("http://api.b.test:{port}/v1/items/7")),
        ("GET", format!("http://api.b.test:{port}/v1/items/8")),
        ("GET", format!("http://api.b.test:{port}/v1/items/70")),
        ("GET", format!("http://api.c.test:{port}/v1/items/7")),
    ];
    for (method, url) in &neighbours {
        assert_eq!(status(&client, method, url).await, 403, "{method} {url}");
    }
    assert_eq!(
        status(&client, "GET", &format!("http://api.a.test:{port}/x")).await,
        200
    );
    let records = gw.decisions(6).await;
    let refused = records
        .iter()
        .find(|r| {
            r["host"] == "api.b.test" && r["method"] == "GET" && r["path"] == "/v1/items/7?token="
        })
        .unwrap();
    let id = refused["decision_id"].as_str().unwrap().to_string();
    let before = gw.dir.path().join("before.jsonl");
    std::fs::copy(&gw.decision_log, &before).unwrap();
    let log = gw.decision_log.display().to_string();
    let dir = gw.policy_dir.display().to_string();

    // The Rego form checks out too (not applied).
    let (code, rego, err) = sandgate(&[
        "policy",
        "suggest",
        &id,
        "--decisions",
        &log,
        "--dir",
        &dir,
        "--format",
        "rego",
    ]);
    assert_eq!(code, 0, "{rego}{err}");
    assert!(
        rego.contains("package sandgate.egress") && rego.contains("\"/v1/items/7/\""),
        "{rego}"
    );
    assert!(err.contains("check: allow"), "{err}");

    let (code, data, err) =
        sandgate(&["policy", "suggest", &id, "--decisions", &log, "--dir", &dir]);
    assert_eq!(code, 0, "{data}{err}");
    assert!(err.contains("check: allow"), "{err}");
    let entry: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(
        entry,
        serde_json::json!({"host": "api.b.test", "port": port, "methods": ["GET"], "path_prefix": "/v1/items/7"})
    );
    assert!(!data.contains("s3cret") && !err.contains("s3cret"));
    let save = err
        .lines()
        .find_map(|l| l.strip_prefix("save as: "))
        .map(PathBuf::from)
        .unwrap();
    assert!(save.starts_with(&gw.policy_dir), "{save:?}");
    // Nothing was applied by the command.
    assert!(!save.exists());
    std::fs::create_dir_all(save.parent().unwrap()).unwrap();
    std::fs::write(&save, &data).unwrap();

    // The request passes once the policy reloads; its neighbours do not; below it does.
    let mut passed = false;
    for _ in 0..100 {
        if status(&client, "GET", &target).await == 200 {
            passed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(passed, "the suggested request is still refused");
    assert_eq!(origin.last().unwrap().path, "/v1/items/7?token=s3cret");
    for (method, url) in &neighbours {
        assert_eq!(status(&client, method, url).await, 403, "{method} {url}");
    }
    assert_eq!(
        status(
            &client,
            "GET",
            &format!("http://api.b.test:{port}/v1/items/7/parts")
        )
        .await,
        200
    );

    // Replay of what was recorded before: exactly the suggested request flips.
    let (code, out, err) = sandgate(&[
        "policy",
        "replay",
        "--json",
        "--decisions",
        before.to_str().unwrap(),
        "--against",
        &dir,
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["flipped"], 1, "{report}");
    let group = &report["groups"][0];
    assert_eq!(group["flip"], "deny→allow");
    assert_eq!(group["destination"], format!("api.b.test:{port}"));
    assert_eq!(group["examples"], serde_json::json!([id]));

    // An allowed decision has nothing to suggest; an unknown id is an error.
    let allowed = records.iter().find(|r| r["decision"] == "allow").unwrap();
    let (code, _, err) = sandgate(&[
        "policy",
        "suggest",
        allowed["decision_id"].as_str().unwrap(),
        "--decisions",
        &log,
        "--dir",
        &dir,
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("nothing to suggest"), "{err}");
    let (code, _, err) = sandgate(&[
        "policy",
        "suggest",
        "nope",
        "--decisions",
        &log,
        "--dir",
        &dir,
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no replayable decision nope"), "{err}");
}
