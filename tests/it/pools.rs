//! `GET /v1/pools` and `sandgate pools` over real sockets: free capacity, the routing stats
//! window's sample counts and success share, recent failures by error class, and account
//! checks (simulated accounts: not applicable; E2B accounts against the fake: passed with the
//! right key, failed with a wrong one, never showing either key).

use std::process::Command;
use std::time::Duration;

use crate::common::fakes::e2b::{FakeE2b, FakeE2bConfig};
use crate::common::*;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN_A: &str = "api-token-ws-a-0123456789";

fn token_toml() -> String {
    format!("[[api.tokens]]\ntoken = \"{TOKEN_A}\"\nprincipal = \"alice\"\nworkspace = \"ws-a\"\n")
}

/// `pool-a` (capacity 10) fails every create with `capacity`; `pool-b` (capacity 3) starts in
/// 5 ms. More free capacity ranks first, so every create fails over from a to b. `pool-c` is
/// the Standby Pool, without a capacity, never tried here.
const SIMULATED: &str = r#"
[create]
short_wait_ms = 5000

[[providers]]
name = "sim"
kind = "simulated"
capabilities = { isolation = ["microvm"], egress = "gateway" }

[[accounts]]
name = "acct-a"
provider = "sim"
[[accounts]]
name = "acct-b"
provider = "sim"

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
geography = "us"
region = "us-east-1"
zone = "us-east-1a"
capacity = 10
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct-b"
region = "eu-west-1"
capacity = 3
[[pools]]
name = "pool-c"
provider = "sim"
account = "acct-b"
standby = true

[simulated.pool-a]
faults = { capacity = 1.0 }
[simulated.pool-b]
latency_ms = { min = 5, max = 5 }
"#;

async fn start(extra: &str) -> Gateway {
    init();
    Gateway::start(GatewayOptions {
        identities: vec![],
        extra_toml: format!("{}{extra}", token_toml()),
        ..GatewayOptions::default()
    })
    .await
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// `GET /v1/pools` as `token`: status, body text and body JSON.
async fn pools(gw: &Gateway, token: &str) -> (u16, String, Value) {
    let resp = http()
        .get(gw.api("/v1/pools"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, text, value)
}

fn pool<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == name)
        .unwrap_or_else(|| panic!("no pool {name} in {view}"))
}

async fn create(gw: &Gateway) -> Value {
    let resp = http()
        .post(gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_A)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

/// Runs the `sandgate` binary against the gateway (off the runtime's threads).
async fn cli(gw: &Gateway, token: &str, args: &[&str]) -> (Option<i32>, String) {
    let url = format!("http://{}", gw.server.api_addr());
    let token = token.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(BIN)
            .args(&args)
            .env("SANDGATE_URL", &url)
            .env("SANDGATE_TOKEN", &token)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_show_capacity_measurements_failures_and_account_checks() {
    let gw = start(SIMULATED).await;

    // Before any create: configuration only, no measurements.
    let (status, _, view) = pools(&gw, TOKEN_A).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["window_secs"], 3600);
    let names: Vec<&str> = view["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pool"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pool-a", "pool-b", "pool-c"]);
    let a = pool(&view, "pool-a");
    assert_eq!(a["provider"], "sim");
    assert_eq!(a["provider_kind"], "simulated");
    assert_eq!(a["account"], "acct-a");
    assert_eq!(
        (&a["geography"], &a["region"], &a["zone"]),
        (&json!("us"), &json!("us-east-1"), &json!("us-east-1a"))
    );
    assert_eq!(a["isolation"], json!([{"kind": "microvm"}]));
    assert_eq!(a["egress"], "gateway");
    assert_eq!(a["standby"], false);
    assert_eq!(a["capacity"], 10);
    assert_eq!(a["free_capacity"], 10);
    assert_eq!(
        a["startup_latency_ms"],
        json!({"median": null, "samples": 0})
    );
    assert_eq!(
        a["creation_success"],
        json!({"share": null, "attempts": 0, "successes": 0})
    );
    assert_eq!(a["recent_failures"], json!({}));
    let b = pool(&view, "pool-b");
    assert_eq!(
        (&b["capacity"], &b["free_capacity"]),
        (&json!(3), &json!(3))
    );
    let c = pool(&view, "pool-c");
    assert_eq!(c["standby"], true);
    assert_eq!(c["capacity"], Value::Null);
    assert_eq!(c["free_capacity"], Value::Null);
    assert_eq!(c["live"], 0);

    // Two creates, each failing over from pool-a (capacity) to pool-b; one is deleted.
    let first = create(&gw).await;
    let second = create(&gw).await;
    for created in [&first, &second] {
        assert_eq!(created["placement"]["pool"], "pool-b", "{created}");
    }
    let deleted = http()
        .delete(gw.api(&format!("/v1/sandboxes/{}", first["id"].as_str().unwrap())))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);

    let (_, _, view) = pools(&gw, TOKEN_A).await;
    let a = pool(&view, "pool-a");
    assert_eq!(a["live"], 0);
    assert_eq!(
        a["creation_success"],
        json!({"share": 0.0, "attempts": 2, "successes": 0})
    );
    assert_eq!(
        a["startup_latency_ms"],
        json!({"median": null, "samples": 0})
    );
    assert_eq!(a["recent_failures"], json!({"capacity": 2}));
    let b = pool(&view, "pool-b");
    assert_eq!(b["live"], 1);
    assert_eq!(
        (&b["capacity"], &b["free_capacity"]),
        (&json!(3), &json!(2))
    );
    assert_eq!(
        b["creation_success"],
        json!({"share": 1.0, "attempts": 2, "successes": 2})
    );
    assert_eq!(b["startup_latency_ms"]["samples"], 2);
    assert!(
        b["startup_latency_ms"]["median"].as_f64().unwrap() >= 5.0,
        "{b}"
    );
    assert_eq!(b["recent_failures"], json!({}));
    let c = pool(&view, "pool-c");
    assert_eq!(c["creation_success"]["attempts"], 0);
    // Simulated accounts have nothing remote to check.
    for p in [a, b, c] {
        assert_eq!(p["account_check"]["status"], "not_applicable", "{p}");
        assert_eq!(p["account_check"]["checked_ms"], Value::Null);
        assert!(p["account_check"]["message"]
            .as_str()
            .unwrap()
            .contains("no remote account to check"));
    }

    // The CLI: `--json`, `-o json` and (into a pipe) no `-o` print the API's answer; the
    // table (`-o table`; the default on a terminal) has a header and a row per pool.
    for args in [
        &["pools", "--json"][..],
        &["pools", "-o", "json"],
        &["pools"],
    ] {
        let (code, out) = cli(&gw, TOKEN_A, args).await;
        assert_eq!(code, Some(0), "{out}");
        let printed: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(printed, view);
    }
    let (code, out) = cli(&gw, TOKEN_A, &["pools", "-q"]).await;
    assert_eq!((code, out.as_str()), (Some(0), "pool-a\npool-b\npool-c\n"));
    let (code, out) = cli(&gw, TOKEN_A, &["pools", "-o", "table"]).await;
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("POOL "), "{out}");
    assert!(lines[0].contains("ACCOUNT CHECK"), "{out}");
    assert!(lines[1].starts_with("pool-a "), "{out}");
    assert!(lines[1].contains("capacity=2"), "{out}");
    assert!(lines[1].contains("0% (0/2)"), "{out}");
    assert!(lines[2].starts_with("pool-b "), "{out}");
    assert!(lines[2].contains("2/3 free"), "{out}");
    assert!(lines[2].contains("100% (2/2)"), "{out}");
    assert!(lines[3].starts_with("pool-c (standby) "), "{out}");
    assert!(lines[3].contains("0 live"), "{out}");
    // Columns line up: every row's second column starts where the header's does.
    let col = lines[0].find("PROVIDER").unwrap();
    assert_eq!(lines[1].find("sim (simulated)"), Some(col));
    assert_eq!(lines[2].find("sim (simulated)"), Some(col));
    assert_eq!(lines[3].find("sim (simulated)"), Some(col));
    assert!(lines[4..].iter().all(|l| !l.starts_with("pool-")), "{out}");

    // Refusals: no token is 401 (the CLI prints nothing on stdout, the error on stderr, and
    // exits 1).
    let (status, _, e) = pools(&gw, "not-a-token").await;
    assert_eq!(status, 401);
    assert_eq!(e["error"]["code"], "unauthenticated");
    let (code, out) = cli(&gw, "not-a-token", &["pools"]).await;
    assert_eq!((code, out.as_str()), (Some(1), ""));
}

/// E2B accounts on the fake: `e2b-good` (two pools) with the fake's key, `e2b-bad` with a
/// wrong one.
fn e2b_topology(fake: &FakeE2b, keys: &std::path::Path, wrong_key: &str) -> String {
    let good = keys.join("good.key");
    let bad = keys.join("bad.key");
    std::fs::write(&good, format!("{}\n", fake.api_key())).unwrap();
    std::fs::write(&bad, format!("{wrong_key}\n")).unwrap();
    let mut toml = String::from("[[providers]]\nname = \"e2b\"\n");
    for (account, key) in [("e2b-good", &good), ("e2b-bad", &bad)] {
        toml.push_str(&format!(
            "[[accounts]]\nname = \"{account}\"\nprovider = \"e2b\"\nbase_url = \"{url}\"\napi_key_file = {key:?}\noptions = {{ sandbox_url = \"{url}\", template = \"base\" }}\n",
            url = fake.url(),
            key = key.display().to_string(),
        ));
    }
    for (pool, account) in [
        ("e2b-good-1", "e2b-good"),
        ("e2b-good-2", "e2b-good"),
        ("e2b-bad-1", "e2b-bad"),
    ] {
        toml.push_str(&format!(
            "[[pools]]\nname = \"{pool}\"\nprovider = \"e2b\"\naccount = \"{account}\"\n"
        ));
    }
    toml
}

/// Polls until no pool's account check is `not_checked`.
async fn checked(gw: &Gateway) -> (String, Value) {
    for _ in 0..200 {
        let (status, text, view) = pools(gw, TOKEN_A).await;
        assert_eq!(status, 200, "{text}");
        let pending = view["pools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["account_check"]["status"] == "not_checked");
        if !pending {
            return (text, view);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the account checks did not finish");
}

fn list_calls(fake: &FakeE2b) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/v2/sandboxes")
        .count()
}

#[tokio::test]
async fn hosted_accounts_are_checked_once_each_at_start_without_showing_keys() {
    init();
    let fake = FakeE2b::start(FakeE2bConfig::default()).await;
    let keys = tempfile::tempdir().unwrap();
    let wrong_key = "e2b_wrong_key_0123456789abcdef";
    let gw = start(&e2b_topology(&fake, keys.path(), wrong_key)).await;
    let (text, view) = checked(&gw).await;

    for name in ["e2b-good-1", "e2b-good-2"] {
        let check = &pool(&view, name)["account_check"];
        assert_eq!(check["status"], "passed", "{check}");
        assert!(check["checked_ms"].as_i64().unwrap() > 0);
        assert!(
            check["message"].as_str().unwrap().contains("listed"),
            "{check}"
        );
        assert_eq!(check["error_class"], Value::Null);
    }
    let b = pool(&view, "e2b-bad-1");
    assert_eq!(b["provider_kind"], "e2b");
    let check = &b["account_check"];
    assert_eq!(check["status"], "failed", "{check}");
    assert!(check["checked_ms"].as_i64().unwrap() > 0);
    assert_eq!(check["error_class"], "unbound_account", "{check}");
    assert!(!check["message"].as_str().unwrap().is_empty());
    // Neither key appears anywhere in the answer.
    assert!(!text.contains(wrong_key), "{text}");
    assert!(!text.contains(fake.api_key()), "{text}");
    // One check per account, although e2b-good has two pools.
    assert_eq!(list_calls(&fake), 2);
}

#[tokio::test]
async fn account_checks_repeat_at_the_interval_and_zero_turns_them_off() {
    init();
    let fake = FakeE2b::start(FakeE2bConfig::default()).await;
    let keys = tempfile::tempdir().unwrap();
    let topology = e2b_topology(&fake, keys.path(), "e2b_wrong_key_fedcba9876543210");

    let off = start(&format!(
        "[create]\naccount_check_interval_secs = 0\n{topology}"
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, _, view) = pools(&off, TOKEN_A).await;
    let check = &pool(&view, "e2b-good-1")["account_check"];
    assert_eq!(check["status"], "not_checked", "{check}");
    assert!(
        check["message"].as_str().unwrap().contains("off"),
        "{check}"
    );
    assert_eq!(list_calls(&fake), 0, "nothing was sent");
    drop(off);

    let gw = start(&format!(
        "[create]\naccount_check_interval_secs = 1\n{topology}"
    ))
    .await;
    let (_, view) = checked(&gw).await;
    let first = pool(&view, "e2b-good-1")["account_check"]["checked_ms"]
        .as_i64()
        .unwrap();
    for _ in 0..100 {
        let (_, _, view) = pools(&gw, TOKEN_A).await;
        let check = &pool(&view, "e2b-good-1")["account_check"];
        if check["checked_ms"].as_i64().unwrap() > first {
            assert_eq!(check["status"], "passed");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the account was not checked again within 5 s");
}
