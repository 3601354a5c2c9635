//! Creates survive a replica that dies or stalls mid-walk (issue 15, item 2): two real
//! `sandgate serve` processes on one Postgres, placing on a pool of kind `e2b` whose
//! inventory lives outside both (the E2B fake, proven with the official SDKs in
//! tests/it/e2b_fake.rs), with short create leases.
//!
//! - SIGSTOP: replica A sends a create and is paused before the answer; B takes the lease
//!   over (a new epoch), adopts the instance A's attempt left and places the sandbox; on
//!   SIGCONT, A's walk finds its lease fenced and stops without writing. Without fencing A
//!   would take the sandbox for deleted meanwhile and delete the instance B adopted.
//! - SIGKILL: 30 concurrent creates with idempotency keys, round robin to A and B, A killed
//!   while its creates are in flight: every create ends running exactly once, the same key
//!   on B answers the same sandbox, and the provider holds one instance per sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::fakes::e2b::{FakeE2b, FakeE2bConfig};
use crate::common::postgres::{self, TestDatabase};
use crate::common::*;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN: &str = "api-token-failover-0123456789";

fn config(dir: &std::path::Path, db: &TestDatabase, e2b: &FakeE2b) -> std::path::PathBuf {
    let key = dir.join("e2b.key");
    std::fs::write(&key, e2b.api_key()).unwrap();
    let extra = format!(
        r#"
[[api.tokens]]
token = "{TOKEN}"
principal = "alice"
workspace = "ws-a"
[create]
short_wait_ms = 200
lease_ttl_ms = 600
janitor_interval_ms = 100
[[providers]]
name = "e2b"
[[accounts]]
name = "e2b-main"
provider = "e2b"
base_url = "{url}"
api_key_file = {key:?}
options = {{ sandbox_url = "{url}" }}
[[pools]]
name = "a-e2b"
provider = "e2b"
account = "e2b-main"
"#,
        url = e2b.url(),
        key = key.display().to_string(),
    );
    let text = process_config(
        dir,
        // The advertised proxy address; these tests do not dial it.
        "public_url = \"http://127.0.0.1:3999\"",
        "",
        &extra,
    );
    let path_line = format!(
        "path = {:?}",
        dir.join("data/sandgate.db").display().to_string()
    );
    assert!(text.contains(&path_line));
    let text = text.replace(&path_line, &format!("url = {:?}", db.url.expose()));
    let path = dir.join("sandgate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn serve(config: &std::path::Path) -> Served {
    let mut command = Command::new(BIN);
    command.args(["serve", "--config"]).arg(config);
    serve_process(command)
}

fn signal(replica: &Served, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(replica.child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig}");
}

struct Api {
    http: reqwest::Client,
}

impl Api {
    fn new() -> Api {
        Api {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    async fn create(&self, replica: &Served, key: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("http://{}/v1/sandboxes", replica.api))
            .bearer_auth(TOKEN)
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn get(&self, replica: &Served, id: &str) -> Value {
        self.http
            .get(format!("http://{}/v1/sandboxes/{id}", replica.api))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn metric(&self, replica: &Served, name: &str) -> f64 {
        let text = self
            .http
            .get(format!("http://{}/metrics", replica.api))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

async fn until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GET /v1/sandboxes/{id}` on `replica` until its state is one of `states`.
async fn wait_state(
    api: &Api,
    replica: &Served,
    id: &str,
    states: &[&str],
    limit: Duration,
) -> Value {
    let start = Instant::now();
    loop {
        let seen = api.get(replica, id).await;
        if states.iter().any(|s| seen["state"] == *s) {
            return seen;
        }
        assert!(
            start.elapsed() < limit,
            "{id}: not {states:?} within {limit:?}: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `test` on a fresh database of the test server (required under CI).
async fn on_postgres<F, Fut>(name: &str, test: F)
where
    F: FnOnce(TestDatabase) -> Fut,
    Fut: std::future::Future<Output = TestDatabase>,
{
    init();
    let Some(server) = postgres::server_or_skip(name) else {
        return;
    };
    let db = TestDatabase::create(&server, name).await;
    let outcome =
        futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(test(db))).await;
    match outcome {
        Ok(db) => db.drop().await,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_paused_past_its_lease_cannot_write_after_it_resumes() {
    on_postgres("paused_replica_is_fenced", |db| async move {
        let e2b = FakeE2b::start(FakeE2bConfig {
            answer_after: Duration::from_secs(3),
            ..FakeE2bConfig::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), &db, &e2b);
        let a = serve(&cfg);
        let b = serve(&cfg);
        let api = Api::new();
        let body = json!({"labels": {"case": "sigstop"}});

        // A takes the create and sends it; the provider has placed it but not answered.
        let (status, accepted) = api.create(&a, "stop-1", &body).await;
        assert_eq!(status, 202, "{accepted}");
        let id = accepted["id"].as_str().unwrap().to_string();
        until("A sends the create", Duration::from_secs(10), || async {
            e2b.create_attempts() == 1
        })
        .await;
        signal(&a, "STOP");

        // B takes the lease over once A's expires and adopts the instance A's attempt left.
        let placed = wait_state(&api, &b, &id, &["running"], Duration::from_secs(15)).await;
        let instance = placed["placement"]["instance_id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(e2b.live_count(), 1);
        assert_eq!(e2b.live()[0].sandbox_id, instance);
        let (status, replay) = api.create(&b, "stop-1", &body).await;
        assert_eq!((status, &replay["id"]), (201, &json!(id)), "{replay}");

        // A resumes: its walk is fenced, and it stops without a write. Wait until it has
        // acted: fenced, or (what an unfenced walk does) deleted the instance.
        signal(&a, "CONT");
        until(
            "A's walk acts on the answer",
            Duration::from_secs(15),
            || async {
                api.metric(&a, "sandgate_create_fenced_total").await >= 1.0 || e2b.live_count() != 1
            },
        )
        .await;
        // Time for anything else A would still do (a delete, a state change).
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(e2b.live_count(), 1, "the adopted instance must survive A");
        assert_eq!(e2b.live()[0].sandbox_id, instance);
        assert_eq!(api.metric(&a, "sandgate_create_fenced_total").await, 1.0);
        assert_eq!(e2b.create_attempts(), 1, "no second instance was asked for");
        for replica in [&a, &b] {
            let seen = api.get(replica, &id).await;
            assert_eq!(seen["state"], "running", "{seen}");
            assert_eq!(
                seen["placement"]["instance_id"],
                instance.as_str(),
                "{seen}"
            );
            assert_eq!(
                seen["updated_ms"], placed["updated_ms"],
                "nothing written since: {seen}"
            );
            let attempts = seen["attempts"].as_array().unwrap();
            assert_eq!(attempts.len(), 1, "{seen}");
            assert_eq!(attempts[0]["state"], "succeeded", "{seen}");
        }
        assert!(a
            .stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("lost the create's lease")));
        db
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_flight_on_a_killed_replica_end_once_on_the_other() {
    on_postgres("killed_replica_creates_end_once", |db| async move {
        const N: usize = 30;
        let e2b = FakeE2b::start(FakeE2bConfig {
            answer_after: Duration::from_millis(700),
            ..FakeE2bConfig::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), &db, &e2b);
        let a = serve(&cfg);
        let b = serve(&cfg);
        let api = std::sync::Arc::new(Api::new());
        let body = |i: usize| json!({"labels": {"case": "sigkill", "n": i.to_string()}});

        // 30 concurrent creates, even ones to A, odd ones to B.
        let mut sent = Vec::new();
        for i in 0..N {
            let (api, addr) = (api.clone(), if i % 2 == 0 { a.api } else { b.api });
            let body = body(i);
            sent.push(tokio::spawn(async move {
                let resp = api
                    .http
                    .post(format!("http://{addr}/v1/sandboxes"))
                    .bearer_auth(TOKEN)
                    .header("idempotency-key", format!("kill-{i}"))
                    .json(&body)
                    .send()
                    .await;
                // A dies under some of them: those see no answer.
                match resp {
                    Ok(r) => {
                        let v = r.json::<Value>().await.ok()?;
                        let id = v["id"]
                            .as_str()
                            .or(v["error"]["details"]["sandbox_id"].as_str());
                        Some(id?.to_string())
                    }
                    Err(_) => None,
                }
            }));
        }
        // Kill A while its creates wait for the provider's answers.
        until(
            "the creates reach the provider",
            Duration::from_secs(10),
            || async { e2b.create_attempts() >= N / 2 },
        )
        .await;
        let mut a = a;
        a.child.kill().unwrap();
        a.child.wait().unwrap();
        let mut first_ids = BTreeMap::new();
        for (i, task) in sent.into_iter().enumerate() {
            if let Some(id) = task.await.unwrap() {
                first_ids.insert(i, id);
            }
        }

        // Every key, asked again on B, is one sandbox that ends running, or failed (a create
        // A had started an attempt for but not sent: B finds no instance for it, and the one
        // pool has been tried).
        let mut ids = BTreeSet::new();
        let mut running = BTreeSet::new();
        for i in 0..N {
            let key = format!("kill-{i}");
            let (status, seen) = api.create(&b, &key, &body(i)).await;
            // The replay answers as the create did: 201/202 with the sandbox, or its
            // failure naming it.
            let id = match status {
                201 | 202 => seen["id"].as_str(),
                _ => seen["error"]["details"]["sandbox_id"].as_str(),
            }
            .unwrap_or_else(|| panic!("{key}: {status} {seen}"))
            .to_string();
            if let Some(first) = first_ids.get(&i) {
                assert_eq!(first, &id, "{key}: the same sandbox on both replicas");
            }
            let state = wait_state(
                &api,
                &b,
                &id,
                &["running", "failed"],
                Duration::from_secs(30),
            )
            .await["state"]
                .clone();
            if state == "running" {
                running.insert(id.clone());
            }
            assert!(ids.insert(id), "{key}: a sandbox of its own");
        }
        assert!(
            running.len() >= N / 2,
            "most creates run: {} of {N}",
            running.len()
        );
        // One instance per sandbox at the provider: none duplicated, none left over.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let live = e2b.live();
        assert_eq!(
            live.len(),
            running.len(),
            "{:?}",
            live.iter().map(|s| &s.metadata).collect::<Vec<_>>()
        );
        let tagged: BTreeSet<&str> = live
            .iter()
            .filter_map(|s| s.metadata.get("sandgate_sandbox").map(String::as_str))
            .collect();
        assert_eq!(
            tagged,
            running.iter().map(String::as_str).collect(),
            "one instance each"
        );
        for id in &running {
            let seen = api.get(&b, id).await;
            let instance = seen["placement"]["instance_id"].as_str().unwrap();
            assert!(live.iter().any(|s| s.sandbox_id == instance), "{seen}");
        }
        db
    })
    .await;
}
