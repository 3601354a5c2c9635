//! `POST /v1/sandboxes` with `"dry_run": true` (issue 14, item 5): the ordered plan, each
//! pool's admission decision with its reasons, and what would be refused, with nothing
//! created (store and provider inventory unchanged) and the idempotency key left unused.
//! In-process gateway, real HTTP (reqwest), real SQLite, the bundled Rego policies plus one.

use crate::common::*;
use serde_json::{json, Value};

const TOKEN_A: &str = "api-token-dry-run-0123456789";

fn pools(state: &std::path::Path) -> String {
    format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[create]
short_wait_ms = 3000
[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct"
price = 1.0
region = "us-east-1"
[[pools]]
name = "pool-prod"
provider = "sim"
account = "acct"
price = 2.0
region = "us-east-1"
labels = {{ environment = "production" }}
[[pools]]
name = "pool-eu"
provider = "sim"
account = "acct"
price = 0.5
region = "eu-west-1"
[simulated.pool-a]
state_file = {a:?}
[simulated.pool-prod]
state_file = {prod:?}
"#,
        a = state.join("sim-a.json").display().to_string(),
        prod = state.join("sim-prod.json").display().to_string(),
    )
}

/// A creation rule that only a plan can trip: proves the policies see `input.dry_run`.
const PROBE_POLICY: &str = r#"package sandgate.creation

import rego.v1

deny contains "dry runs of probe sandboxes are refused" if {
	input.dry_run
	input.request.labels.probe == "yes"
}
"#;

struct Env {
    gw: Gateway,
    http: reqwest::Client,
    /// The simulated pools' inventory files live here.
    state: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        init();
        let state = tempfile::tempdir().unwrap();
        let gw = Gateway::start(GatewayOptions {
            extra_toml: pools(state.path()),
            extra_policies: vec![("probe.rego", PROBE_POLICY.to_string())],
            ..GatewayOptions::default()
        })
        .await;
        Env {
            gw,
            http: reqwest::Client::new(),
            state,
        }
    }

    async fn create(&self, body: Value, key: Option<&str>) -> (u16, Value) {
        let mut req = self
            .http
            .post(self.gw.api("/v1/sandboxes"))
            .bearer_auth(TOKEN_A)
            .json(&body);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn sandboxes(&self) -> Vec<Value> {
        let resp = self
            .http
            .get(self.gw.api("/v1/sandboxes?limit=100"))
            .bearer_auth(TOKEN_A)
            .send()
            .await
            .unwrap();
        let page: Value = resp.json().await.unwrap();
        page["sandboxes"].as_array().unwrap().clone()
    }

    /// Instances the simulated pools hold (their inventory files).
    fn instances(&self) -> usize {
        ["sim-a.json", "sim-prod.json"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.state.path().join(f)).ok())
            .map(|text| {
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                count_instances(&v)
            })
            .sum()
    }
}

/// Live instances in a simulated pool's inventory file.
fn count_instances(v: &Value) -> usize {
    let all = v["instances"]
        .as_object()
        .map(|o| o.values().cloned().collect::<Vec<_>>())
        .or_else(|| v["instances"].as_array().cloned())
        .unwrap_or_default();
    all.iter()
        .filter(|i| i["failed"] != true && i["deleted"] != true)
        .count()
}

fn step<'a>(plan: &'a Value, pool: &str) -> &'a Value {
    plan["plan"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["pool"] == pool)
        .unwrap_or_else(|| panic!("{pool} not in the plan: {plan}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_plans_every_candidate_and_creates_nothing() {
    let env = Env::start().await;
    let body =
        json!({"regions": ["us-east-1"], "routing": {"priorities": ["price"]}, "dry_run": true});
    let (status, plan) = env.create(body.clone(), Some("key-1")).await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["would_create"], true);
    assert_eq!(plan["first_pool"], "pool-a");
    let order: Vec<&str> = plan["plan"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pool"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["pool-a", "pool-prod"]);
    let a = step(&plan, "pool-a");
    assert_eq!(
        (&a["decision"], &a["reached"], &a["position"]),
        (&json!("attempt"), &json!("first"), &json!(1))
    );
    // The production pool's provider layer refuses this unlabelled workload; the walk
    // reaches it only when pool-a fails.
    let prod = step(&plan, "pool-prod");
    assert_eq!(prod["decision"], "refused");
    assert_eq!(prod["reached"], "on_failover");
    assert_eq!(prod["layer"], "provider");
    assert_eq!(prod["error_class"], "policy");
    assert!(prod["reasons"][0]
        .as_str()
        .unwrap()
        .contains("reserved for production"));
    // Routing refused the EU pool, with the unmet requirement.
    assert_eq!(
        plan["refused"],
        json!([{"pool": "pool-eu", "provider": "sim", "reasons": ["regions"]}])
    );
    assert_eq!(
        plan["placement_record"]["candidates"],
        json!(["pool-a", "pool-prod"])
    );
    assert!(plan["error"].is_null());

    // Nothing was created: no sandbox, no instance, and the key is free for another body.
    assert!(env.sandboxes().await.is_empty());
    assert_eq!(env.instances(), 0);
    let (status, created) = env
        .create(json!({"labels": {"real": "yes"}}), Some("key-1"))
        .await;
    assert_eq!(status, 201, "the dry run did not claim the key: {created}");
    assert_eq!(env.instances(), 1);
    // And a dry run with that key, now held by another body, is still a plan, not a 409.
    let (status, again) = env.create(body, Some("key-1")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(env.sandboxes().await.len(), 1);
    assert_eq!(env.instances(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_says_when_the_create_would_be_refused() {
    let env = Env::start().await;
    // The production pool first: its refusal would end the create; pool-a is never reached.
    let body = json!({
        "regions": ["us-east-1"],
        "routing": {"pool_affinity": {"preferred": [{"weight": 10, "key": "environment", "operator": "in", "values": ["production"]}]}},
        "dry_run": true
    });
    let (status, plan) = env.create(body, None).await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["would_create"], false, "{plan}");
    assert!(plan["first_pool"].is_null());
    assert_eq!(step(&plan, "pool-prod")["reached"], "first");
    assert_eq!(step(&plan, "pool-a")["reached"], "never");
    assert_eq!(step(&plan, "pool-a")["decision"], "attempt");
    assert_eq!(plan["error"]["error"]["code"], "policy_denied");
    assert_eq!(plan["error"]["error"]["details"]["pool"], "pool-prod");

    // The policies see `input.dry_run`: this rule refuses plans only.
    let probe = json!({"labels": {"probe": "yes"}, "regions": ["us-east-1"], "dry_run": true});
    let (status, plan) = env.create(probe, None).await;
    assert_eq!(status, 200, "{plan}");
    let first = &plan["plan"][0];
    assert_eq!(
        (&first["decision"], &first["layer"], &first["error_class"]),
        (&json!("refused"), &json!("creation"), &json!("authority"))
    );
    assert_eq!(
        first["reasons"],
        json!(["dry runs of probe sandboxes are refused"])
    );
    let (status, created) = env
        .create(
            json!({"labels": {"probe": "yes"}, "regions": ["us-east-1"]}),
            None,
        )
        .await;
    assert_eq!(status, 201, "{created}");
}

#[tokio::test]
async fn a_dry_run_is_refused_as_the_create_would_be() {
    let env = Env::start().await;
    // Bad bodies: the same 400 with the field.
    let (status, e) = env.create(json!({"dry_run": "yes"}), None).await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["details"]["field"], "dry_run");
    let (status, e) = env
        .create(json!({"dry_run": true, "resources": {"cpu": -1}}), None)
        .await;
    assert_eq!(status, 400, "{e}");
    // No pool at all: the same 422 a create gets, every pool's unmet requirements in it.
    let (status, e) = env
        .create(json!({"dry_run": true, "features": {"pty": true}}), None)
        .await;
    assert_eq!(status, 422, "{e}");
    assert_eq!(e["error"]["code"], "no_eligible_provider");
    assert_eq!(
        e["error"]["details"]["attempts"].as_array().unwrap().len(),
        3
    );
    // Another workspace: forbidden, as a create.
    let (status, e) = env
        .create(json!({"dry_run": true, "workspace": "ws-other"}), None)
        .await;
    assert_eq!(status, 403, "{e}");
    assert!(env.sandboxes().await.is_empty());
    assert_eq!(env.instances(), 0);
}
