//! Safe defaults for local sandboxes, end to end over the API: a sandbox created without
//! `resources` runs under `[local.defaults]`, reports them in its view's `limits`, and a
//! fork bomb, a memory hog or a disk filler inside it ends inside it (a `limit_reached`
//! event naming the limit) while another sandbox and the gateway keep serving.
//!
//! Small limits keep each test to seconds. Where this machine cannot enforce a limit, the
//! test checks that the sandbox and the pool declare it instead. Needs root, like
//! `local_provider`.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const TOKEN: &str = "api-token-limits-0123456789abcdef";

struct Env {
    gw: Gateway,
    http: reqwest::Client,
}

async fn start(test: &str) -> Option<Env> {
    if !root_or_skip(&format!("local_limits::{test}")) {
        return None;
    }
    init();
    let dir = tempfile::tempdir().unwrap();
    let extra_toml = format!(
        r#"
[[api.tokens]]
token = "{TOKEN}"
principal = "alice"
workspace = "ws-a"

[local]
dir = "{dir}/sandboxes"
snapshot_dir = "{dir}/snapshots"
netns_prefix = "sgm-"
cgroup = "sandgate-limits-test"

[local.defaults]
memory_mb = 64
cpu = 0.5
pids = 48
disk_mb = 24

[local.max]
memory_mb = 256
disk_mb = 1024
"#,
        dir = dir.path().display(),
    );
    let gw = Gateway::start(GatewayOptions {
        extra_toml,
        ..GatewayOptions::default()
    })
    .await;
    std::mem::forget(dir);
    Some(Env {
        gw,
        http: reqwest::Client::new(),
    })
}

impl Env {
    async fn create(&self, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(self.gw.api("/v1/sandboxes"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn sandbox(&self) -> String {
        let (status, body) = self.create(json!({})).await;
        assert_eq!(status, 201, "{body:#}");
        body["id"].as_str().unwrap().to_string()
    }

    async fn view(&self, id: &str) -> Value {
        let response = self
            .http
            .get(self.gw.api(&format!("/v1/sandboxes/{id}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    /// Runs a shell script; (stdout, exit event).
    async fn sh(&self, id: &str, script: &str, timeout_ms: u64) -> (String, Value) {
        let response = self
            .http
            .post(self.gw.api(&format!("/v1/sandboxes/{id}/exec")))
            .bearer_auth(TOKEN)
            .json(&json!({"argv": ["bash", "-c", script], "timeout_ms": timeout_ms}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let text = response.text().await.unwrap();
        let events: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let stdout = events
            .iter()
            .filter(|e| e["type"] == "stdout")
            .filter_map(|e| e["text"].as_str())
            .collect();
        (stdout, events.last().cloned().unwrap_or(Value::Null))
    }

    /// The sandbox's `limits` once `check` holds (the watch reads counters every 200 ms).
    async fn limits_until(&self, id: &str, check: impl Fn(&Value) -> bool) -> Value {
        let mut limits = Value::Null;
        for _ in 0..50 {
            limits = self.view(id).await["limits"].clone();
            if check(&limits) {
                return limits;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the sandbox's limits never showed it: {limits:#}");
    }

    /// Another sandbox and the gateway still serve.
    async fn others_serve(&self, other: &str) {
        let (out, exit) = self
            .sh(other, "echo alive; echo data > f; cat f", 10_000)
            .await;
        assert_eq!(out, "alive\ndata\n", "{exit}");
        let health = self.http.get(self.gw.api("/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
    }

    /// Whether `limit` is enforced here; if not, that it is declared, not hidden.
    async fn enforced_or_declared(&self, id: &str, limit: &str, field: &str) -> bool {
        let limits = self.view(id).await["limits"].clone();
        let unenforced = limits["unenforced"].as_array().expect("limits.unenforced");
        if unenforced.iter().any(|u| u == limit) {
            assert!(limits["enforced"][field].is_null(), "{limits:#}");
            let pools: Value = self
                .http
                .get(self.gw.api("/v1/pools"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(
                pools.to_string().contains("sandgate.unenforced_limits"),
                "{pools:#}"
            );
            eprintln!("local_limits: {limit} cannot be enforced here; declared instead");
            return false;
        }
        true
    }
}

/// `GET /v1/sandboxes/{id}/events?limits=true`, open before the workload runs.
struct EventStream {
    response: reqwest::Response,
    text: String,
}

impl Env {
    async fn events(&self, id: &str) -> EventStream {
        let response = self
            .http
            .get(
                self.gw
                    .api(&format!("/v1/sandboxes/{id}/events?limits=true")),
            )
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        EventStream {
            response,
            text: String::new(),
        }
    }
}

impl EventStream {
    /// Reads until the server ends the stream; panics if it is still open after 10 s.
    async fn ends(mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Ok(Ok(Some(chunk))) => self.text.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(_) => return,
                Err(_) => panic!("the stream is still open: {}", self.text),
            }
        }
    }

    /// The data of the first `limit_reached` event for `limit` on the stream (the stream
    /// delivers `done` first, then the sandbox's limit events as they happen).
    async fn limit_reached(&mut self, limit: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let found = self.text.split("\n\n").find_map(|frame| {
                let data: Value =
                    field(frame, "data").and_then(|d| serde_json::from_str(d).ok())?;
                let is_limit = field(frame, "event") == Some("limit_reached");
                (is_limit && data["limit"] == limit).then_some((frame.to_string(), data))
            });
            if let Some((frame, data)) = found {
                let id = field(&frame, "id");
                assert!(
                    id.is_some_and(|id| id.ends_with(&format!(".{}", data["seq"]))),
                    "{frame}"
                );
                assert!(
                    self.text
                        .split("\n\n")
                        .any(|f| field(f, "event") == Some("done")),
                    "{}",
                    self.text
                );
                return data;
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("no {limit} limit_reached on the stream: {}", self.text))
                .unwrap()
                .unwrap_or_else(|| panic!("the stream ended: {}", self.text));
            self.text.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

/// The value of an SSE field in one frame.
fn field<'a>(frame: &'a str, name: &str) -> Option<&'a str> {
    frame
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim_start)
}

fn has_event(limits: &Value, limit: &str) -> bool {
    limits["events"].as_array().is_some_and(|events| {
        events
            .iter()
            .any(|e| e["type"] == "limit_reached" && e["limit"] == limit)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_sandbox_reports_the_defaults_and_creates_stay_within_the_maximum() {
    let Some(env) = start("defaults").await else {
        return;
    };
    let id = env.sandbox().await;
    let limits = env.view(&id).await["limits"].clone();
    let enforced = &limits["enforced"];
    let unenforced: Vec<String> = serde_json::from_value(limits["unenforced"].clone()).unwrap();
    for (limit, field, value) in [
        ("memory", "memory_mb", json!(64)),
        ("cpu", "cpu", json!(0.5)),
        ("pids", "pids", json!(48)),
        ("disk", "disk_mb", json!(24)),
    ] {
        if unenforced.iter().any(|u| u == limit) {
            assert!(enforced[field].is_null(), "{limits:#}");
        } else {
            assert_eq!(enforced[field], value, "{limits:#}");
        }
    }
    assert_eq!(limits["oom_kills"], 0);
    assert_eq!(limits["events"], json!([]));
    // Raised within [local.max]: taken.
    let (status, body) = env.create(json!({"resources": {"memory_mb": 128}})).await;
    if !unenforced.iter().any(|u| u == "memory") {
        assert_eq!(status, 201, "{body:#}");
        let id = body["id"].as_str().unwrap();
        assert_eq!(env.view(id).await["limits"]["enforced"]["memory_mb"], 128);
        // Above it: refused, never run unbounded.
        let (status, body) = env.create(json!({"resources": {"memory_mb": 4096}})).await;
        assert_eq!(status, 422, "{body:#}");
    }
    // The process limit too, per create: read back from the kernel; above [local.max] (4096
    // by default) the default pool cannot offer it.
    if !unenforced.iter().any(|u| u == "pids") {
        let (status, body) = env.create(json!({"resources": {"pids": 100}})).await;
        assert_eq!(status, 201, "{body:#}");
        let id = body["id"].as_str().unwrap();
        assert_eq!(env.view(id).await["limits"]["enforced"]["pids"], 100);
        let (status, body) = env.create(json!({"resources": {"pids": 5000}})).await;
        assert_eq!(status, 422, "{body:#}");
        let unmet = body.to_string();
        assert!(unmet.contains("resources.pids"), "{body:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_ends_at_the_process_limit_inside_its_sandbox() {
    let Some(env) = start("fork_bomb").await else {
        return;
    };
    let (bomb, other) = (env.sandbox().await, env.sandbox().await);
    if !env.enforced_or_declared(&bomb, "pids", "pids").await {
        return;
    }
    let mut stream = env.events(&bomb).await;
    let (_, exit) = env.sh(&bomb, ":(){ :|:& };:; sleep 3", 3_000).await;
    assert!(exit["type"] == "exit", "{exit}");
    let limits = env.limits_until(&bomb, |l| has_event(l, "pids")).await;
    assert!(limits["pids_refused"].as_u64().unwrap() > 0, "{limits:#}");
    let event = stream.limit_reached("pids").await;
    assert!(
        event["message"].as_str().unwrap().contains("process limit"),
        "{event}"
    );
    env.others_serve(&other).await;
    // Deleted, the sandbox can meet no more limits: its stream ends.
    let deleted = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{bomb}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    stream.ends().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_killed_at_the_memory_limit_inside_its_sandbox() {
    let Some(env) = start("memory_hog").await else {
        return;
    };
    let (hog, other) = (env.sandbox().await, env.sandbox().await);
    if !env.enforced_or_declared(&hog, "memory", "memory_mb").await {
        return;
    }
    let mut stream = env.events(&hog).await;
    // 300 MB held by `tail` (no newline in the input), far past 64 MiB.
    let (out, exit) = env
        .sh(
            &hog,
            "head -c 300000000 /dev/zero | tail -n 1 >/dev/null; echo rc=$?",
            20_000,
        )
        .await;
    assert_eq!(out.trim(), "rc=137", "{exit}");
    let limits = env.limits_until(&hog, |l| has_event(l, "memory")).await;
    assert!(limits["oom_kills"].as_u64().unwrap() >= 1, "{limits:#}");
    let event = stream.limit_reached("memory").await;
    assert!(
        event["message"].as_str().unwrap().contains("out of memory"),
        "{event}"
    );
    // The sandbox itself goes on serving.
    let (out, _) = env.sh(&hog, "echo after", 10_000).await;
    assert_eq!(out, "after\n");
    env.others_serve(&other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_filler_stops_at_the_size_of_its_writable_areas() {
    let Some(env) = start("disk_filler").await else {
        return;
    };
    let (filler, other) = (env.sandbox().await, env.sandbox().await);
    if !env.enforced_or_declared(&filler, "disk", "disk_mb").await {
        return;
    }
    // /home/user and /tmp share the 24 MiB: 64 MiB across them does not fit.
    let (out, exit) = env
        .sh(
            &filler,
            "dd if=/dev/zero of=/tmp/a bs=1M count=8 2>/dev/null; \
             dd if=/dev/zero of=/home/user/b bs=1M count=56 2>&1 | grep -o 'No space left'; true",
            20_000,
        )
        .await;
    assert_eq!(out.trim(), "No space left", "{exit}");
    let limits = env.limits_until(&filler, |l| has_event(l, "disk")).await;
    assert_eq!(limits["disk_full"], true, "{limits:#}");
    env.others_serve(&other).await;
}
