//! Process-level: `kill -9` the real `sandgate` binary in the middle of a create and start it
//! again on the same data directory. The create must resume and end cleanly: the sandbox
//! record survives, and the simulated provider's inventory (kept in a state file, as a remote
//! provider outlives the gateway) holds exactly one instance for it.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN: &str = "api-token-restart-0123456789";

struct Running {
    child: Child,
    api: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `sandgate serve` and parses its startup line:
/// `sandgate: proxy on http://ADDR (HTTP_PROXY), API on http://ADDR, CA PATH`.
fn serve(dir: &Path) -> Running {
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(dir.join("sandgate.toml"))
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = stderr.clone();
    let stream = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let api = stderr.lock().unwrap().iter().find_map(|l| {
            let rest = l.strip_prefix("sandgate: proxy on http://")?;
            let api = rest.split("API on http://").nth(1)?.split(',').next()?;
            Some(api.to_string())
        });
        if let Some(api) = api {
            return Running { child, api, stderr };
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "sandgate exited with {status}: {:?}",
                stderr.lock().unwrap()
            );
        }
        assert!(Instant::now() < deadline, "sandgate did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_config(dir: &Path, state_a: &Path, state_b: &Path) {
    let config = format!(
        r#"
[proxy]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[[api.tokens]]
token = "{TOKEN}"
principal = "alice"
workspace = "ws-a"
[tls]
ca_dir = "certs"
[store]
path = "data/sandgate.db"
[secrets]
master_key_file = "data/master.key"
[policy]
dir = "policies"
[log]
decisions = "off"

[create]
short_wait_ms = 100
lease_ttl_ms = 600
janitor_interval_ms = 100
provisioning_window_ms = 15000

[[providers]]
name = "sim"
kind = "simulated"
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
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct-b"

[simulated.pool-a]
latency_ms = {{ min = 2500, max = 2500 }}
state_file = {a:?}
[simulated.pool-b]
state_file = {b:?}
"#,
        a = state_a.display().to_string(),
        b = state_b.display().to_string(),
    );
    std::fs::write(dir.join("sandgate.toml"), config).unwrap();
}

/// Live (not failed, not deleted) instances in a simulated state file.
fn live_instances(state: &PathBuf) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(state) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&text).unwrap();
    v["instances"]
        .as_object()
        .unwrap()
        .values()
        .filter(|i| i["failed"] == false)
        .cloned()
        .collect()
}

#[tokio::test]
async fn kill_9_mid_create_then_restart_resumes_without_loss_or_duplicate() {
    common::init();
    let dir = tempfile::tempdir().unwrap();
    let state_a = dir.path().join("sim-a.json");
    let state_b = dir.path().join("sim-b.json");
    write_config(dir.path(), &state_a, &state_b);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let body = json!({"labels": {"run": "restart"}});

    let mut first = serve(dir.path());
    let resp = http
        .post(format!("http://{}/v1/sandboxes", first.api))
        .bearer_auth(TOKEN)
        .header("idempotency-key", "restart-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let created: Value = resp.json().await.unwrap();
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    // The provider has been asked and the instance is starting: kill the gateway now.
    for _ in 0..100 {
        if live_instances(&state_a).len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(live_instances(&state_a).len(), 1);
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    let stderr_before = first.stderr.lock().unwrap().join("\n");
    drop(first);

    let second = serve(dir.path());
    let url = format!("http://{}/v1/sandboxes/{id}", second.api);
    let mut sandbox = Value::Null;
    for _ in 0..300 {
        let resp = http.get(&url).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(resp.status(), 200, "the sandbox record was lost");
        sandbox = resp.json().await.unwrap();
        if !["pending", "provisioning", "reconciling"].contains(&sandbox["state"].as_str().unwrap())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        sandbox["state"],
        "running",
        "{sandbox}\n--- first run ---\n{stderr_before}\n--- second run ---\n{}",
        second.stderr.lock().unwrap().join("\n")
    );
    // The second process took the create over when the dead one's lease expired.
    assert!(
        second
            .stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("resuming an in-flight create") && l.contains(&id)),
        "the create was not resumed by the new process"
    );
    // The instance created before the crash was found by its tags and adopted.
    assert_eq!(sandbox["placement"]["pool"], "pool-a");
    let attempts = sandbox["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{sandbox}");
    assert_eq!(attempts[0]["state"], "succeeded");
    let live_a = live_instances(&state_a);
    assert_eq!(live_a.len(), 1, "{live_a:?}");
    assert_eq!(live_a[0]["sandbox_id"], id.as_str());
    assert_eq!(sandbox["placement"]["instance_id"], live_a[0]["id"]);
    assert!(
        live_instances(&state_b).is_empty(),
        "a second pool was used"
    );

    // The same create replayed after the restart is the same sandbox.
    let resp = http
        .post(format!("http://{}/v1/sandboxes", second.api))
        .bearer_auth(TOKEN)
        .header("idempotency-key", "restart-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["id"], id.as_str());
    let list: Value = http
        .get(format!("http://{}/v1/sandboxes", second.api))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 1);
    assert_eq!(live_instances(&state_a).len(), 1);
    // The replay does not show the token again (the first create did)...
    let token = created["egress"]["token"].as_str().unwrap();
    assert!(!replay.to_string().contains(token), "{replay}");
    assert_eq!(replay["egress"]["token_already_shown"], true);
    // ...and no token is in the logs of either run.
    assert!(!stderr_before.contains(token));
    assert!(!second.stderr.lock().unwrap().join("\n").contains(token));
}
