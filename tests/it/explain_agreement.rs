//! "Why did it land there" has one answer (issue 14, items 2 and 3):
//! - `sandgate route explain` reads the measured context routing uses (samples in the stats
//!   window, existing placements for affinity and spread, free capacity, the `[create]`
//!   bands, the workspace order), from the configured store or from a running gateway
//!   (`--url`), and says which; on a seeded store its answer equals `POST
//!   /v1/routes:explain` of the gateway running on that store;
//! - the placement record kept with a sandbox is the explanation that produced its candidate
//!   list, survives a restart, and stays put when the measurements move on;
//!   `sandgate sandbox get --why` shows it next to the attempts.
//!
//! Real `sandgate serve` process, real SQLite store, real HTTP (reqwest) and the real CLI.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN: &str = "api-token-explain-0123456789";

fn config(dir: &Path) -> std::path::PathBuf {
    let extra = format!(
        r#"
[[api.tokens]]
token = "{TOKEN}"
principal = "alice"
workspace = "ws-a"
[create]
short_wait_ms = 5000
startup_latency_band_ms = 50.0
creation_success_band = 0.1
[create.workspace_order]
ws-a = ["sim"]
[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct-a"
provider = "sim"
[[accounts]]
name = "acct-b"
provider = "sim"
[[accounts]]
name = "acct-c"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
price = 1.0
region = "us-east-1"
capacity = 5
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct-b"
price = 3.0
region = "eu-west-1"
[[pools]]
name = "pool-c"
provider = "sim"
account = "acct-c"
price = 2.0
region = "eu-west-1"
[simulated.pool-a]
latency_ms = {{ min = 150, max = 150 }}
[simulated.pool-b]
latency_ms = {{ min = 5, max = 5 }}
[simulated.pool-c]
faults = {{ capacity = 1.0 }}
"#
    );
    let path = dir.join("sandgate.toml");
    std::fs::write(&path, process_config(dir, "", "", &extra)).unwrap();
    path
}

/// Ranked on every measured input at once: latency and success (bands from `[create]`),
/// sandbox affinity and soft spread (existing placements), free capacity (ties).
fn request() -> Value {
    json!({
        "labels": {"app": "web"},
        "routing": {
            "priorities": ["startup_latency", "creation_success"],
            "sandbox_affinity": {"preferred": [{"weight": 5, "topology": "region", "match_labels": {"app": "web"}}]},
            "spread": [{"topology": "region", "mode": "soft", "weight": 1, "match_labels": {"app": "web"}}]
        }
    })
}

fn order(e: &Value) -> Vec<&str> {
    e["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect()
}

fn pool<'a>(e: &'a Value, name: &str) -> &'a Value {
    e["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == name)
        .unwrap()
}

fn cli(dir: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(BIN);
    // The working directory holds no store of its own: what is read comes from --config.
    cmd.current_dir(dir).args(args).env_remove("SANDGATE_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_and_api_explain_agree_on_a_seeded_store_and_the_record_survives_a_restart() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let cfg_arg = cfg.display().to_string();
    let req_path = dir.path().join("req.json");
    std::fs::write(&req_path, request().to_string()).unwrap();
    let req_arg = req_path.display().to_string();

    // Before anything is measured the CLI says there is no store yet, and ranks on nothing
    // but configured capacity (pool-a's breaks the tie).
    let out = cli(
        dir.path(),
        &[
            "route",
            "explain",
            "--config",
            &cfg_arg,
            "--request",
            &req_arg,
        ],
        &[],
    );
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no store at"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let blind: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(order(&blind), ["pool-a", "pool-b", "pool-c"]);

    let mut command = Command::new(BIN);
    command.args(["serve", "--config", &cfg_arg]);
    let served = serve_process(command);
    let api = Api {
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        base: format!("http://{}", served.api),
    };
    // Seed: web sandboxes on pool-a (us-east-1), a db sandbox on pool-b, a failure on pool-c.
    for (pool, app) in [("pool-a", "web"), ("pool-a", "web"), ("pool-b", "db")] {
        let body = json!({"labels": {"app": app}, "routing": {"pin_pool": pool}});
        let (status, b) = api.post("/v1/sandboxes", &body).await;
        assert_eq!(status, 201, "{b}");
    }
    let (status, b) = api
        .post("/v1/sandboxes", &json!({"routing": {"pin_pool": "pool-c"}}))
        .await;
    assert_eq!(status, 503, "{b}");

    let (status, from_api) = api.post("/v1/routes:explain", &request()).await;
    assert_eq!(status, 200, "{from_api}");
    // The measured context is in the answer: samples, success, capacity, affinity, spread.
    assert_eq!(
        pool(&from_api, "pool-a")["metrics"]["startup_latency_samples"],
        2
    );
    assert_eq!(
        pool(&from_api, "pool-c")["metrics"]["creation_success"],
        0.0
    );
    assert_eq!(pool(&from_api, "pool-a")["free_capacity"], 3);
    assert_eq!(from_api["bands"]["startup_latency_ms"], 50.0);
    // pool-a: +5 affinity, -2 spread (two web sandboxes in us-east-1).
    assert_eq!(pool(&from_api, "pool-a")["soft_score"], 3);
    assert_eq!(
        order(&from_api),
        ["pool-b", "pool-a", "pool-c"],
        "{from_api}"
    );

    // The CLI on the store of the running gateway: the same answer, and it says where from.
    let out = cli(
        dir.path(),
        &[
            "route",
            "explain",
            "--config",
            &cfg_arg,
            "--request",
            &req_arg,
            "--workspace",
            "ws-a",
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("measured context of the store at"),
        "{stderr}"
    );
    assert!(stderr.contains("4 samples"), "{stderr}");
    let from_store: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(from_store, from_api);

    // And through the gateway's API.
    let out = cli(
        dir.path(),
        &[
            "route",
            "explain",
            "--request",
            &req_arg,
            "--url",
            &api.base,
        ],
        &[("SANDGATE_TOKEN", TOKEN.to_string())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("measured context of the gateway at"),
        "{stderr}"
    );
    let via_url: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(via_url, from_api);
    // `-o json` is the API's body too; a refusal by the gateway is its error on stderr.
    let args = [
        "route",
        "explain",
        "--request",
        &req_arg,
        "--url",
        &api.base,
    ];
    let out = cli(
        dir.path(),
        &[&args[..], &["-o", "json"]].concat(),
        &[("SANDGATE_TOKEN", TOKEN.to_string())],
    );
    assert!(out.status.success());
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        from_api
    );
    let out = cli(
        dir.path(),
        &args,
        &[("SANDGATE_TOKEN", "not-a-token".to_string())],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("error: unauthenticated: "), "{stderr}");

    // The create right after sees the same context: its record is that explanation.
    let (status, created) = api.post("/v1/sandboxes", &request()).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["placement"]["pool"], "pool-b");
    let record = api.get(&format!("/v1/sandboxes/{id}")).await["placement_record"].clone();
    assert_eq!(record["explanation"], from_api);
    assert_eq!(record["source"], "gateway");
    assert_eq!(record["candidates"], json!(["pool-b", "pool-a", "pool-c"]));
    assert_eq!(record["context"]["existing_sandboxes"], 3);
    // List pages leave the record out (it explains every pool).
    let list = api.get("/v1/sandboxes?limit=100").await;
    let listed = list["sandboxes"].as_array().expect("a page of sandboxes");
    assert!(listed.iter().all(|s| s.get("placement_record").is_none()));

    // Measurements move on: pool-b's samples grow.
    for _ in 0..2 {
        let body = json!({"labels": {"app": "db"}, "routing": {"pin_pool": "pool-b"}});
        assert_eq!(api.post("/v1/sandboxes", &body).await.0, 201);
    }
    let (_, now) = api.post("/v1/routes:explain", &request()).await;
    assert_ne!(now, from_api);
    drop(served);

    // After a restart the record is what it was, and `get --why` explains from it.
    let mut command = Command::new(BIN);
    command.args(["serve", "--config", &cfg_arg]);
    let served = serve_process(command);
    let api = Api {
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        base: format!("http://{}", served.api),
    };
    let after = api.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(after["placement_record"], record);
    let out = cli(
        dir.path(),
        &["sandbox", "get", &id, "--why"],
        &[
            ("SANDGATE_URL", api.base.clone()),
            ("SANDGATE_TOKEN", TOKEN.to_string()),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains(&id) && lines[0].contains("on pool pool-b"),
        "{text}"
    );
    let row = |pool: &str| {
        lines
            .iter()
            .position(|l| l.split_whitespace().nth(1) == Some(pool))
            .unwrap_or_else(|| panic!("no row for {pool}:\n{text}"))
    };
    assert!(
        row("pool-b") < row("pool-a") && row("pool-a") < row("pool-c"),
        "{text}"
    );
    assert!(text.contains("attempts:"), "{text}");
}
