//! Policy on many replicas (issue 15, item 5): every replica reports the policy it serves
//! (generation and content digest) in `GET /v1/policies` and as metrics, and the API says
//! when replicas disagree. Two real `sandgate serve` processes on one store, each with its
//! own policy directory (as two pods whose ConfigMap mounts have not converged yet).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN: &str = "api-token-replicas-0123456789";

const EXTRA_RULE: &str = "package sandgate.creation\n\nimport rego.v1\n\ndeny contains \"no sandboxes labelled frozen\" if input.request.labels.frozen == \"yes\"\n";

async fn policies(http: &reqwest::Client, api: std::net::SocketAddr) -> Value {
    let r = http
        .get(format!("http://{api}/v1/policies"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_report_their_policy_and_the_api_says_when_they_disagree() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let extra =
        format!("[[api.tokens]]\ntoken = \"{TOKEN}\"\nprincipal = \"ops\"\nworkspace = \"ws-a\"\n");
    let text = process_config(dir.path(), "", "", &extra);
    let a_cfg = dir.path().join("a.toml");
    std::fs::write(&a_cfg, &text).unwrap();
    // Replica B: the same store, its own policy directory with one more rule in it.
    let a_policies = dir.path().join("policies");
    let b_policies = dir.path().join("policies-b");
    std::fs::create_dir_all(&b_policies).unwrap();
    for entry in std::fs::read_dir(&a_policies).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, b_policies.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(b_policies.join("frozen.rego"), EXTRA_RULE).unwrap();
    let b_text = text.replace(
        &format!("dir = {:?}", a_policies.display().to_string()),
        &format!(
            "dir = {:?}\nreload_interval_ms = 200",
            b_policies.display().to_string()
        ),
    );
    assert_ne!(b_text, text);
    let b_cfg = dir.path().join("b.toml");
    std::fs::write(&b_cfg, &b_text).unwrap();

    let serve = |cfg: &std::path::Path| {
        let mut command = Command::new(BIN);
        command.args(["serve", "--config"]).arg(cfg);
        serve_process(command)
    };
    let a = serve(&a_cfg);
    let b = serve(&b_cfg);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    let from_a = policies(&http, a.api).await;
    let digest_a = from_a["digest"].as_str().unwrap().to_string();
    assert_eq!(digest_a.len(), 64, "{from_a}");
    let replicas = from_a["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2, "{from_a}");
    assert_eq!(from_a["replicas_agree"], false);
    assert!(from_a["disagreement"]
        .as_str()
        .unwrap()
        .contains("2 different policies"));
    let this: Vec<&Value> = replicas.iter().filter(|r| r["this"] == true).collect();
    assert_eq!(this.len(), 1);
    assert_eq!(this[0]["policy_digest"], digest_a.as_str());
    assert_eq!(this[0]["id"], from_a["replica"]);
    let from_b = policies(&http, b.api).await;
    assert_ne!(from_b["digest"], digest_a.as_str());
    assert_eq!(from_b["replicas_agree"], false);

    // The metric carries the digest.
    let metrics = http
        .get(format!("http://{}/metrics", a.api))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!("sandgate_policy_info{{digest=\"{digest_a}\"}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains("sandgate_policy_generation 1"),
        "{metrics}"
    );

    // B's mount converges: once it reloads and heartbeats, they agree.
    std::fs::remove_file(b_policies.join("frozen.rego")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = policies(&http, a.api).await;
        if now["replicas_agree"] == true {
            assert!(now["disagreement"].is_null());
            assert!(now["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["policy_digest"] == digest_a.as_str()));
            break;
        }
        assert!(Instant::now() < deadline, "replicas never agreed: {now}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A replica that stops leaves the list.
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let now = policies(&http, a.api).await;
        if now["replicas"].as_array().unwrap().len() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a stopped replica stayed listed: {now}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Issue 25 item 11: a replica stopped by SIGTERM (a Kubernetes pod being deleted) removes
/// its own row as it stops gracefully, so the others stop listing it at once, not when its
/// heartbeat expires (~20 s later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_by_sigterm_leaves_the_list_at_once() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let extra =
        format!("[[api.tokens]]\ntoken = \"{TOKEN}\"\nprincipal = \"ops\"\nworkspace = \"ws-a\"\n");
    let cfg = dir.path().join("sandgate.toml");
    std::fs::write(&cfg, process_config(dir.path(), "", "", &extra)).unwrap();
    let serve = || {
        let mut command = Command::new(BIN);
        command.args(["serve", "--config"]).arg(&cfg);
        serve_process(command)
    };
    let a = serve();
    let mut b = serve();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let listed = policies(&http, a.api).await["replicas"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(listed, 2, "both replicas are listed while they run");

    // SAFETY: kill(2) on the child this test started and has not reaped yet.
    let sent = unsafe { libc::kill(b.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = b.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "B did not stop within 10 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stopped = Instant::now();
    assert!(status.success(), "a graceful stop exits 0: {status}");
    let now = policies(&http, a.api).await;
    eprintln!(
        "listed {} ms after B exited: {}",
        stopped.elapsed().as_millis(),
        now["replicas"]
    );
    let replicas = now["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 1, "B left the list as it stopped: {now}");
    assert_eq!(replicas[0]["this"], true, "{now}");
    let logs = b.stderr.lock().unwrap().join("\n");
    assert!(logs.contains("left the replica list"), "{logs}");
}
