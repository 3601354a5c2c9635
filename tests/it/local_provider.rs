//! The local provider end to end, over the API: sandboxes created with `POST /v1/sandboxes`
//! on the embedded default pool (`kind = "local"`), real namespaces, real `curl` and
//! `python3` inside them, a real HTTPS origin outside, reqwest as the API client.
//!
//! Needs root (network, PID and mount namespaces, cgroups): `common::unprivileged` is the
//! one place that decides, and every test prints a skip line and returns without it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

pub(crate) const TOKEN_A: &str = "api-token-ws-a-local-0123456789";
const TOKEN_B: &str = "api-token-ws-b-local-0123456789";
const SECRET: &str = "ghp_local_provider_real_secret_4242";

pub(crate) struct Env {
    pub(crate) gw: Gateway,
    pub(crate) http: reqwest::Client,
    origin: Origin,
    _ca: TestCa,
}

pub(crate) async fn start(test: &str, extra_policies: Vec<(&'static str, String)>) -> Option<Env> {
    if !root_or_skip(&format!("local_provider::{test}")) {
        return None;
    }
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(
        ca.server_config(&["api.allowed.test", "api.denied.test"]),
    ))
    .await;
    let secrets = tempfile::tempdir().unwrap();
    let secret_file = secrets.path().join("gh");
    std::fs::write(&secret_file, SECRET).unwrap();
    let extra_toml = format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{TOKEN_B}"
principal = "bob"
workspace = "ws-b"

[[credentials]]
workspace = "ws-a"
name = "gh"
secret_file = {secret:?}
placeholder_env = "GH_TOKEN"
destinations = [{{ host = "api.allowed.test", ports = [{port}] }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}

[local]
dir = "{dir}/sandboxes"
snapshot_dir = "{dir}/snapshots"
netns_prefix = "sgl-"
cgroup = "sandgate-ltest"
[local.users]
root = {{ uid = 0, gid = 0 }}
"#,
        secret = secret_file.display().to_string(),
        port = origin.port(),
        dir = secrets.path().display(),
    );
    let gw = Gateway::start(GatewayOptions {
        identities: vec![],
        hosts: vec![
            ("api.allowed.test", "127.0.0.1"),
            ("api.denied.test", "127.0.0.1"),
            // Names for `network.cidrs`: one inside 127.0.0.2/32, one outside it.
            ("inside.cidr.test", "127.0.0.2"),
            ("outside.cidr.test", "127.0.0.3"),
        ],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_policies,
        extra_toml,
        ..GatewayOptions::default()
    })
    .await;
    // The secret file was read at start; the directory holds the sandboxes now.
    std::mem::forget(secrets);
    Some(Env {
        gw,
        http: reqwest::Client::new(),
        origin,
        _ca: ca,
    })
}

impl Env {
    pub(crate) async fn create(&self, token: &str, body: Value) -> Value {
        let response = self
            .http
            .post(self.gw.api("/v1/sandboxes"))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 201, "{body:#}");
        assert_eq!(body["placement"]["pool"], "local", "{body:#}");
        body
    }

    /// Starts a command; the raw streaming response (status not checked).
    pub(crate) async fn exec_request(
        &self,
        token: &str,
        id: &str,
        body: Value,
    ) -> reqwest::Response {
        self.http
            .post(self.gw.api(&format!("/v1/sandboxes/{id}/exec")))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Runs a command; returns the NDJSON events.
    async fn exec(&self, token: &str, id: &str, argv: &[&str]) -> Vec<Value> {
        let response = self
            .exec_request(token, id, json!({"argv": argv, "timeout_ms": 30000}))
            .await;
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "{text}");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Runs a shell command; (stdout, stderr, exit code).
    async fn sh(&self, id: &str, script: &str) -> (String, String, i64) {
        let events = self.exec(TOKEN_A, id, &["sh", "-c", script]).await;
        let mut out = String::new();
        let mut err = String::new();
        let mut code = -1;
        for e in &events {
            match e["type"].as_str().unwrap() {
                "stdout" => out.push_str(e["text"].as_str().unwrap_or_default()),
                "stderr" => err.push_str(e["text"].as_str().unwrap_or_default()),
                "exit" => code = e["code"].as_i64().unwrap_or(-1),
                _ => {}
            }
        }
        (out, err, code)
    }

    async fn post(&self, token: &str, path: &str) -> (u16, Value) {
        let response = self
            .http
            .post(self.gw.api(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.origin.port())
    }
}

fn instance_of(sandbox: &Value) -> String {
    sandbox["placement"]["instance_id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Host pids whose root directory is inside `dir`.
fn processes_rooted_in(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(root) = std::fs::read_link(format!("/proc/{pid}/root")) {
            if root.starts_with(dir) {
                pids.push(pid);
            }
        }
    }
    pids
}

fn sandbox_root_on_host(instance: &str) -> Option<PathBuf> {
    // The root of any process of the sandbox: its init is always there while it runs.
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(root) = std::fs::read_link(entry.path().join("root")) {
            if root
                .to_string_lossy()
                .contains(&format!("/{instance}/root"))
            {
                return Some(root);
            }
        }
    }
    None
}

#[tokio::test]
async fn curl_and_python_inside_reach_the_allowed_origin_with_the_secret_injected_outside() {
    let Some(env) = start("curl_and_python", vec![]).await else {
        return;
    };
    let sandbox = env
        .create(
            TOKEN_A,
            json!({"credentials": ["gh"], "network": {"allow_domains": ["api.allowed.test"]}}),
        )
        .await;
    let id = sandbox["id"].as_str().unwrap();
    // The API describes the environment the sandbox was given, not the host's proxy.
    assert_eq!(sandbox["egress"]["enforcement"], "namespace");
    assert_eq!(
        sandbox["egress"]["env"]["HTTPS_PROXY"],
        "http://127.0.0.1:3128"
    );
    assert_eq!(sandbox["egress"]["ca_cert_path"], "/sandgate/ca.pem");

    // The environment: proxy inside the sandbox, the CA placed inside it, a placeholder only.
    let (out, _, code) = env.sh(id, "env").await;
    assert_eq!(code, 0);
    assert!(out.contains("HTTPS_PROXY=http://127.0.0.1:3128"), "{out}");
    assert!(out.contains("SSL_CERT_FILE=/sandgate/ca.pem"), "{out}");
    assert!(out.contains("GH_TOKEN=sgph_"), "{out}");
    assert!(
        !out.contains(SECRET),
        "the secret reached the sandbox's environment"
    );
    let (files, _, _) = env
        .sh(
            id,
            "grep -rl ghp_local_provider /home /tmp /sandgate 2>/dev/null; true",
        )
        .await;
    assert!(files.trim().is_empty(), "the secret is in a file: {files}");

    // curl with the placeholder in its header: the origin receives the real secret.
    let (out, err, code) = env
        .sh(
            id,
            &format!(
                "curl -sS -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $GH_TOKEN\" {}",
                env.url("api.allowed.test", "/from-curl")
            ),
        )
        .await;
    assert_eq!((out.as_str(), code), ("200", 0), "{err}");
    let seen = env.origin.last().unwrap();
    assert_eq!(seen.path, "/from-curl");
    let auth = seen.headers.iter().find(|(k, _)| *k == "authorization");
    assert_eq!(
        auth.map(|(_, v)| v.as_str()),
        Some(format!("Bearer {SECRET}").as_str())
    );

    // Python: requests when installed in the sandbox's view of the machine, else urllib;
    // both honour HTTPS_PROXY and the CA variables.
    let script = format!(
        r#"
import os
url = "{url}"
try:
    import requests
    print("requests", requests.get(url).status_code)
except ImportError:
    import urllib.request
    print("urllib", urllib.request.urlopen(url).status)
"#,
        url = env.url("api.allowed.test", "/from-python")
    );
    let has_python = Path::new("/usr/bin/python3").exists();
    if has_python {
        let events = env
            .exec(TOKEN_A, id, &["/usr/bin/python3", "-c", &script])
            .await;
        let out: String = events
            .iter()
            .filter(|e| e["type"] == "stdout")
            .map(|e| e["text"].as_str().unwrap_or_default())
            .collect();
        assert!(out.trim().ends_with("200"), "{events:?}");
        let seen = env.origin.last().unwrap();
        assert_eq!(seen.path, "/from-python");
        assert!(seen
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == &format!("Bearer {SECRET}")));
    } else {
        eprintln!("python3 not installed: the Python client part was skipped");
    }
}

#[tokio::test]
async fn denied_destinations_are_refused_with_the_reason_and_there_is_no_route_around_the_proxy() {
    let Some(env) = start("denied_and_no_route", vec![]).await else {
        return;
    };
    let sandbox = env
        .create(
            TOKEN_A,
            json!({"network": {"allow_domains": ["api.allowed.test"]}}),
        )
        .await;
    let id = sandbox["id"].as_str().unwrap();
    let before = env.origin.count();

    // Plain HTTP through the proxy shows the JSON refusal.
    let (out, _, _) = env
        .sh(
            id,
            &format!("curl -s http://api.denied.test:{}/nope", env.origin.port()),
        )
        .await;
    let refusal: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
    assert_eq!(refusal["error"]["code"], "egress_denied", "{refusal}");
    // HTTPS: the CONNECT is refused with 403.
    let (_, err, code) = env
        .sh(
            id,
            &format!("curl -sS {}", env.url("api.denied.test", "/nope")),
        )
        .await;
    assert_ne!(code, 0);
    assert!(err.contains("403"), "{err}");

    // Ignoring the proxy: no route to the origin (on the host's loopback), nor anywhere.
    let (_, err, code) = env
        .sh(
            id,
            &format!(
                "curl -sS --noproxy '*' -m 5 https://127.0.0.1:{}/direct",
                env.origin.port()
            ),
        )
        .await;
    assert_ne!(code, 0, "a direct connection got through: {err}");
    let (_, err, code) = env
        .sh(id, "curl -sS --noproxy '*' -m 5 http://1.1.1.1/")
        .await;
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("unreachable")
            || err.contains("Could not connect")
            || err.contains("Failed to connect"),
        "{err}"
    );
    // Its network namespace holds loopback and nothing else.
    let (out, _, _) = env.sh(id, "tail -n +3 /proc/net/dev | cut -d: -f1").await;
    let interfaces: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(interfaces, vec!["lo"], "{out}");
    assert_eq!(
        env.origin.count(),
        before,
        "a denied or direct request reached the origin"
    );

    // The decision log names the sandbox and the reason.
    let records = env.gw.decisions(2).await;
    assert!(
        records.iter().any(|r| r["sandbox"] == id
            && r["host"] == "api.denied.test"
            && r["decision"] == "deny"),
        "{records:?}"
    );
}

#[tokio::test]
async fn a_sandbox_forging_another_sandboxs_proxy_credentials_is_still_itself() {
    let Some(env) = start("forged_identity", vec![]).await else {
        return;
    };
    let first = env
        .create(
            TOKEN_A,
            json!({"network": {"allow_domains": ["api.allowed.test"]}}),
        )
        .await;
    let second = env
        .create(
            TOKEN_B,
            json!({"network": {"allow_domains": ["api.denied.test"]}}),
        )
        .await;
    let first_id = first["id"].as_str().unwrap();
    let second_id = second["id"].as_str().unwrap();
    let first_token = first["egress"]["token"].as_str().unwrap();
    let before = env.origin.count();
    let script = format!(
        "curl -sS -o /dev/null -w '%{{http_code}}' -x http://{first_id}:{first_token}@127.0.0.1:3128 {}",
        env.url("api.allowed.test", "/forged")
    );
    let events = env.exec(TOKEN_B, second_id, &["sh", "-c", &script]).await;
    let exit = events.last().unwrap();
    assert_ne!(exit["code"], 0, "{events:?}");
    assert_eq!(env.origin.count(), before);
    let records = env.gw.decisions(1).await;
    assert!(records.iter().any(|r| r["sandbox"] == second_id
        && r["host"] == "api.allowed.test"
        && r["decision"] == "deny"));
    assert!(!records
        .iter()
        .any(|r| r["sandbox"] == first_id && r["host"] == "api.allowed.test"));

    // Nor can its API caller reach into the first sandbox.
    let (status, body) = env
        .post(TOKEN_B, &format!("/v1/sandboxes/{first_id}/stop"))
        .await;
    assert_eq!(status, 404, "{body}");
    let response = env
        .http
        .get(env.gw.api(&format!(
            "/v1/sandboxes/{first_id}/files/content?path=/etc/hostname"
        )))
        .bearer_auth(TOKEN_B)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn exec_streams_stdout_and_stderr_in_order_and_returns_the_exit_code() {
    let Some(env) = start("exec_order", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    let events = env
        .exec(
            TOKEN_A,
            id,
            &[
                "sh",
                "-c",
                "echo out1; sleep 0.2; echo err1 >&2; sleep 0.2; echo out2; sleep 0.2; echo err2 >&2; exit 7",
            ],
        )
        .await;
    assert_eq!(events[0]["type"], "started");
    let sequence: Vec<(String, String)> = events[1..]
        .iter()
        .filter(|e| e["type"] != "exit")
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["text"].as_str().unwrap().trim().to_string(),
            )
        })
        .collect();
    assert_eq!(
        sequence,
        vec![
            ("stdout".to_string(), "out1".to_string()),
            ("stderr".to_string(), "err1".to_string()),
            ("stdout".to_string(), "out2".to_string()),
            ("stderr".to_string(), "err2".to_string()),
        ]
    );
    let exit = events.last().unwrap();
    assert_eq!(exit["type"], "exit");
    assert_eq!(exit["code"], 7);
    assert_eq!(exit["reason"], "exited");

    // Cancel by id: the stream ends with reason cancelled.
    let response = env
        .exec_request(TOKEN_A, id, json!({"argv": ["sleep", "30"]}))
        .await;
    let mut response = response;
    let first = response.chunk().await.unwrap().unwrap();
    let started: Value = serde_json::from_slice(&first).unwrap();
    let exec_id = started["exec_id"].as_str().unwrap();
    let (status, _) = env
        .post(
            TOKEN_A,
            &format!("/v1/sandboxes/{id}/exec/{exec_id}/cancel"),
        )
        .await;
    assert_eq!(status, 202);
    let rest = tokio::time::timeout(Duration::from_secs(10), response.text())
        .await
        .expect("a cancelled exec ends its stream")
        .unwrap();
    let exit: Value = serde_json::from_str(rest.lines().last().unwrap()).unwrap();
    assert_eq!(exit["reason"], "cancelled", "{rest}");

    // A client that goes away kills its command.
    let response = env
        .exec_request(TOKEN_A, id, json!({"argv": ["sleep", "31"]}))
        .await;
    let mut response = response;
    response.chunk().await.unwrap().unwrap();
    let (out, _, _) = env
        .sh(id, "ps -eo args | grep -c '^sleep 31' || true")
        .await;
    assert_eq!(out.trim(), "1", "the command should be running: {out}");
    drop(response);
    let mut gone = false;
    for _ in 0..50 {
        let (out, _, _) = env
            .sh(id, "ps -eo args | grep -c '^sleep 31' || true")
            .await;
        if out.trim() == "0" {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "closing the exec stream did not kill the command");

    // An empty argv is refused before anything runs.
    let response = env.exec_request(TOKEN_A, id, json!({"argv": []})).await;
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn files_round_trip_binary_content_and_stay_inside_their_sandbox() {
    let Some(env) = start("files", vec![]).await else {
        return;
    };
    let one = env.create(TOKEN_A, json!({})).await;
    let two = env.create(TOKEN_A, json!({})).await;
    let id = one["id"].as_str().unwrap();
    let other = two["id"].as_str().unwrap();
    let files = |path: &str| env.gw.api(&format!("/v1/sandboxes/{id}/{path}"));

    let response = env
        .http
        .post(files("files/mkdir?path=/home/user/data/deep&parents=true"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let payload: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let response = env
        .http
        .put(files("files/content?path=/home/user/data/deep/blob.bin"))
        .bearer_auth(TOKEN_A)
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let back = env
        .http
        .get(files("files/content?path=data/deep/blob.bin"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(back.as_ref(), payload.as_slice());
    // The sandbox's processes see the same bytes.
    let (out, _, _) = env.sh(id, "wc -c < /home/user/data/deep/blob.bin").await;
    assert_eq!(out.trim(), "300000");
    let listing: Value = env
        .http
        .get(files("files?path=/home/user/data/deep"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listing["entries"][0]["name"], "blob.bin");
    assert_eq!(listing["entries"][0]["kind"], "file");
    assert_eq!(listing["entries"][0]["size"], 300_000);

    // Escapes are refused.
    for bad in ["/home/user/../../etc/shadow", "/etc/passwd"] {
        let response = env
            .http
            .put(files(&format!("files/content?path={bad}")))
            .bearer_auth(TOKEN_A)
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{bad}");
    }

    // The other sandbox cannot see the first one's files, by path or through /proc.
    let (out, _, code) = env
        .sh(
            other,
            "cat /home/user/data/deep/blob.bin 2>&1; ls /proc | grep -c '^[0-9]'",
        )
        .await;
    assert!(out.contains("No such file"), "{out} {code}");
    let root = sandbox_root_on_host(&instance_of(&one)).expect("the first sandbox runs");
    let (out, _, _) = env
        .sh(other, &format!("ls {} 2>&1 || true", root.display()))
        .await;
    assert!(out.contains("No such file"), "{out}");

    // Delete and read back: 404.
    let response = env
        .http
        .delete(files("files?path=/home/user/data&recursive=true"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let response = env
        .http
        .get(files("files/content?path=/home/user/data/deep/blob.bin"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn pause_stops_progress_resume_continues_and_delete_leaves_nothing_behind() {
    let Some(env) = start("lifecycle", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    let instance = instance_of(&sandbox);
    let (_, _, code) = env
        .sh(
            id,
            // Written then renamed, so a read never finds the file half-written (empty).
            "(i=0; while true; do i=$((i+1)); echo $i > /home/user/count.tmp; mv /home/user/count.tmp /home/user/count; sleep 0.05; done) >/dev/null 2>&1 &",
        )
        .await;
    assert_eq!(code, 0);
    let count = || async {
        let bytes = env
            .http
            .get(env.gw.api(&format!(
                "/v1/sandboxes/{id}/files/content?path=/home/user/count"
            )))
            .bearer_auth(TOKEN_A)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        bytes.trim().parse::<u64>().unwrap_or(0)
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(count().await > 0);

    let (status, body) = env
        .post(TOKEN_A, &format!("/v1/sandboxes/{id}/pause"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "paused");
    let frozen = count().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count().await, frozen, "a paused sandbox made progress");
    // Exec needs a running sandbox.
    let response = env
        .exec_request(TOKEN_A, id, json!({"argv": ["true"]}))
        .await;
    assert_eq!(response.status(), 409);
    let (status, body) = env
        .post(TOKEN_A, &format!("/v1/sandboxes/{id}/resume"))
        .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(count().await > frozen, "a resumed sandbox did not continue");

    // Stop kills the processes and keeps the files; start brings it back.
    let (status, body) = env.post(TOKEN_A, &format!("/v1/sandboxes/{id}/stop")).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("stopped")));
    let stopped = count().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count().await, stopped);
    let (status, _) = env
        .post(TOKEN_A, &format!("/v1/sandboxes/{id}/start"))
        .await;
    assert_eq!(status, 200);
    let (out, _, _) = env.sh(id, "cat /home/user/count").await;
    assert_eq!(out.trim().parse::<u64>().unwrap(), stopped);

    // Delete: no process, namespace, mount or directory remains.
    let root = sandbox_root_on_host(&instance).expect("running sandbox has a root");
    let sandbox_dir = root.parent().unwrap().to_path_buf();
    assert!(netns_exists(&format!("sgl-{instance}")));
    let response = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(!netns_exists(&format!("sgl-{instance}")));
    assert!(!sandbox_dir.exists(), "{} remains", sandbox_dir.display());
    assert!(processes_rooted_in(&sandbox_dir).is_empty());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&instance), "a mount remains");
}

#[tokio::test]
async fn a_snapshot_seeds_a_new_sandbox_with_the_same_files() {
    let Some(env) = start("snapshot", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    env.sh(
        id,
        "mkdir -p /home/user/proj && echo kept > /home/user/proj/state.txt",
    )
    .await;
    let (status, body) = env
        .post(TOKEN_A, &format!("/v1/sandboxes/{id}/snapshot"))
        .await;
    assert_eq!(status, 201, "{body}");
    let snapshot = body["snapshot"]["id"].as_str().unwrap().to_string();
    assert!(body["snapshot"]["size_bytes"].as_u64().unwrap() > 0);

    let restored = env.create(TOKEN_A, json!({"snapshot": snapshot})).await;
    let (out, _, _) = env
        .sh(
            restored["id"].as_str().unwrap(),
            "cat /home/user/proj/state.txt",
        )
        .await;
    assert_eq!(out.trim(), "kept");

    // Another workspace cannot use it.
    let response = env
        .http
        .post(env.gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_B)
        .json(&json!({"snapshot": snapshot}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let response = env
        .http
        .delete(env.gw.api(&format!("/v1/snapshots/{snapshot}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
}

#[tokio::test]
async fn action_and_lifecycle_policy_refuse_before_anything_runs() {
    let data = json!({"sandgate": {"workspaces": {"ws-a": {
        "blocked_programs": ["curl"],
        "blocked_operations": ["files.write"],
    }}}});
    let Some(env) = start("policy", vec![("data.json", data.to_string())]).await else {
        return;
    };
    let sandbox = env
        .create(TOKEN_A, json!({"labels": {"protected": "true"}}))
        .await;
    let id = sandbox["id"].as_str().unwrap();
    let response = env
        .exec_request(
            TOKEN_A,
            id,
            json!({"argv": ["/usr/bin/curl", "-s", "https://api.allowed.test"]}),
        )
        .await;
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "policy_denied");
    assert!(body["error"]["details"]["reasons"][0]
        .as_str()
        .unwrap()
        .contains("program curl is blocked"));
    let response = env
        .http
        .put(env.gw.api(&format!(
            "/v1/sandboxes/{id}/files/content?path=/home/user/x"
        )))
        .bearer_auth(TOKEN_A)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let (_, _, code) = env.sh(id, "test ! -e /home/user/x").await;
    assert_eq!(code, 0, "a refused write still wrote");
    // A protected sandbox is not deleted by a member.
    let response = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let (out, _, _) = env.sh(id, "echo alive").await;
    assert_eq!(out.trim(), "alive");
}

/// The cgroup file `name` of a local instance, under any controller mount.
fn cgroup_file(instance: &str, name: &str) -> Option<PathBuf> {
    fn walk(dir: &Path, instance: &str, name: &str, depth: usize) -> Option<PathBuf> {
        if depth == 0 {
            return None;
        }
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if !entry.file_type().ok()?.is_dir() {
                continue;
            }
            if path.ends_with(format!("sandgate-ltest/{instance}")) && path.join(name).exists() {
                return Some(path.join(name));
            }
            if let Some(found) = walk(&path, instance, name, depth - 1) {
                return Some(found);
            }
        }
        None
    }
    walk(Path::new("/sys/fs/cgroup"), instance, name, 6)
}

/// The seccomp filter (`tests/it/local_seccomp.rs` has its refusals) leaves ordinary work
/// alone: python, git, pip, curl through the proxy; the pool and the sandbox declare it.
#[tokio::test]
async fn an_ordinary_workload_runs_under_the_seccomp_filter_and_the_pool_declares_it() {
    let Some(env) = start("seccomp_workload", vec![]).await else {
        return;
    };
    let pools: Value = env
        .http
        .get(env.gw.api("/v1/pools"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let local = pools["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pool"] == "local"))
        .unwrap_or_else(|| panic!("no local pool: {pools:#}"));
    assert_eq!(
        local["isolation"],
        json!([{"kind": "namespace", "seccomp": "enforced"}]),
        "{local:#}"
    );
    // A create may require the filter.
    let sandbox = env
        .create(
            TOKEN_A,
            json!({
                "network": {"allow_domains": ["api.allowed.test"]},
                "features": {"isolation": {"kind": "namespace", "seccomp": "enforced"}},
            }),
        )
        .await;
    let id = sandbox["id"].as_str().unwrap();
    let view: Value = env
        .http
        .get(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["limits"]["enforced"]["seccomp"], true, "{view:#}");
    let script = format!(
        "set -e; grep '^Seccomp:' /proc/self/status; \
         python3 -c 'import json, sqlite3; print(json.dumps(sqlite3.connect(\":memory:\").execute(\"select 6*7\").fetchone()))'; \
         git init -q repo && cd repo && echo hi > f && git add f && \
         git -c user.name=t -c user.email=t@example.test commit -qm first && git log --format=%s; \
         python3 -m pip --version | cut -d' ' -f1; \
         curl -sS -o /dev/null -w '%{{http_code}}\\n' {}",
        env.url("api.allowed.test", "/under-seccomp")
    );
    let (out, err, code) = env.sh(id, &script).await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    assert_eq!(lines.len(), 5, "{out}{err}");
    assert!(lines[0].ends_with('2'), "{out}");
    assert_eq!(&lines[1..], ["[42]", "first", "pip", "200"], "{err}");
    assert_eq!(env.origin.last().unwrap().path, "/under-seccomp");
}

#[tokio::test]
async fn requested_memory_becomes_an_enforced_limit_or_the_pool_does_not_offer_it() {
    let Some(env) = start("resources", vec![]).await else {
        return;
    };
    let response = env
        .http
        .post(env.gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_A)
        .json(&json!({"resources": {"memory_mb": 96}}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let v2_delegated = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
        .is_ok_and(|c| c.contains("memory"));
    if !(v1 || v2_delegated) {
        // Not enforceable here: the default pool does not declare memory, so nothing fits.
        assert_eq!(status, 422, "{body}");
        return;
    }
    assert_eq!(status, 201, "{body}");
    let instance = instance_of(&body);
    let file = cgroup_file(&instance, "memory.limit_in_bytes")
        .or_else(|| cgroup_file(&instance, "memory.max"))
        .expect("the sandbox's memory cgroup");
    let limit: u64 = std::fs::read_to_string(&file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(limit, 96 * 1024 * 1024, "{}", file.display());
    // And the kernel holds the sandbox to it.
    let id = body["id"].as_str().unwrap();
    let swap_off = std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() <= 1);
    if swap_off && Path::new("/usr/bin/python3").exists() {
        let events = env
            .exec(
                TOKEN_A,
                id,
                &[
                    "/usr/bin/python3",
                    "-c",
                    "b = bytearray(400 * 1024 * 1024); print(len(b))",
                ],
            )
            .await;
        let exit = events.last().unwrap();
        assert!(
            exit["signal"] == 9 || exit["code"] != 0,
            "allocating past the limit succeeded: {events:?}"
        );
    }
}

#[tokio::test]
async fn a_delegated_exec_token_execs_but_nothing_else_and_dies_with_its_delegators_authority() {
    let Some(env) = start("delegation", vec![]).await else {
        return;
    };
    let sandbox = env.create(TOKEN_A, json!({})).await;
    let id = sandbox["id"].as_str().unwrap();
    let other = env.create(TOKEN_A, json!({})).await;
    let other_id = other["id"].as_str().unwrap();
    let mint = |actions: Value| {
        env.http
            .post(env.gw.api(&format!("/v1/sandboxes/{id}/delegations")))
            .bearer_auth(TOKEN_A)
            .json(&json!({"agent": "build-bot", "actions": actions, "ttl_secs": 600}))
            .send()
    };
    let response = mint(json!(["exec"])).await.unwrap();
    assert_eq!(response.status(), 201);
    let minted: Value = response.json().await.unwrap();
    let token = minted["token"].as_str().unwrap().to_string();
    let delegation_id = minted["delegation"]["id"].as_str().unwrap().to_string();
    assert!(token.starts_with("sgd_"));

    // It can exec...
    let events = env.exec(&token, id, &["sh", "-c", "echo as-agent"]).await;
    assert!(
        events.iter().any(|e| e["text"] == "as-agent\n"),
        "{events:?}"
    );
    // ...but not read files, stop, exec elsewhere, delete, create or delegate further.
    let status = |r: reqwest::Response| r.status().as_u16();
    let read = env
        .http
        .get(env.gw.api(&format!(
            "/v1/sandboxes/{id}/files/content?path=/etc/hostname"
        )))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(status(read), 403);
    let (code, body) = env.post(&token, &format!("/v1/sandboxes/{id}/stop")).await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (403, Some("delegation_scope"))
    );
    let elsewhere = env
        .exec_request(&token, other_id, json!({"argv": ["true"]}))
        .await;
    assert_eq!(status(elsewhere), 403);
    let delete = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(status(delete), 403);
    let create = env
        .http
        .post(env.gw.api("/v1/sandboxes"))
        .bearer_auth(&token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(create), 403);
    let further = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{id}/delegations")))
        .bearer_auth(&token)
        .json(&json!({"agent": "x", "actions": ["exec"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(further), 403);
    // Another workspace's principal cannot mint on this sandbox.
    let foreign = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{id}/delegations")))
        .bearer_auth(TOKEN_B)
        .json(&json!({"agent": "x", "actions": ["exec"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(status(foreign), 404);

    // Suspending the delegator (policy data, reloaded) ends the delegation at its next use.
    std::fs::write(
        env.gw.policy_dir.join("data.json"),
        json!({"sandgate": {"suspended_principals": ["alice"]}}).to_string(),
    )
    .unwrap();
    let mut refused = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let response = env
            .exec_request(&token, id, json!({"argv": ["true"]}))
            .await;
        if response.status() == 403 {
            refused = Some(response.json::<Value>().await.unwrap());
            break;
        }
        let _ = response.text().await;
    }
    let refused = refused.expect("the suspended delegator's delegation kept working");
    assert_eq!(refused["error"]["code"], "policy_denied");
    assert!(refused["error"]["details"]["reasons"][0]
        .as_str()
        .unwrap()
        .contains("alice is suspended"));
    // A suspended delegator cannot mint either.
    assert_eq!(mint(json!(["exec"])).await.unwrap().status(), 403);

    // Lift the suspension: the token works again until it is revoked, then never.
    std::fs::write(env.gw.policy_dir.join("data.json"), "{}").unwrap();
    let mut works = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let response = env
            .exec_request(&token, id, json!({"argv": ["true"]}))
            .await;
        works = response.status() == 200;
        let _ = response.text().await;
        if works {
            break;
        }
    }
    assert!(works);
    let response = env
        .http
        .delete(env.gw.api(&format!("/v1/delegations/{delegation_id}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let response = env
        .exec_request(&token, id, json!({"argv": ["true"]}))
        .await;
    assert_eq!(response.status(), 401);
    let listed: Value = env
        .http
        .get(env.gw.api(&format!("/v1/sandboxes/{id}/delegations")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(listed["delegations"][0]["revoked_ms"].is_i64(), "{listed}");
    assert!(!listed.to_string().contains(&token), "a token was listed");
}

#[tokio::test]
async fn action_and_lifecycle_scopes_compose_with_deny_wins_and_a_missing_layer_denies() {
    let scope = vec![
        (
            "workspaces/ws-a/action.rego",
            r#"package sandgate.scopes.workspaces["ws-a"].action
import rego.v1

allow := true

deny contains "workspace ws-a reads nothing under /home/user/private" if {
	input.operation == "files.read"
	startswith(input.file.path, "/home/user/private/")
}
"#
            .to_string(),
        ),
        (
            "workspaces/ws-a/lifecycle.rego",
            r#"package sandgate.scopes.workspaces["ws-a"].lifecycle
import rego.v1

deny contains "workspace ws-a never pauses its sandboxes" if input.operation == "pause"
"#
            .to_string(),
        ),
        (
            "data.json",
            json!({"sandgate": {"workspaces": {"ws-a": {"blocked_programs": ["wget"]}}}})
                .to_string(),
        ),
    ];
    let Some(env) = start("scopes", scope).await else {
        return;
    };
    let a = env.create(TOKEN_A, json!({})).await;
    let a_id = a["id"].as_str().unwrap();
    let b = env.create(TOKEN_B, json!({})).await;
    let b_id = b["id"].as_str().unwrap();
    let read = |token: &'static str, id: &str| {
        env.http
            .get(env.gw.api(&format!(
                "/v1/sandboxes/{id}/files/content?path=/home/user/private/notes.txt"
            )))
            .bearer_auth(token)
            .send()
    };
    for (token, id) in [(TOKEN_A, a_id), (TOKEN_B, b_id)] {
        let events = env
            .exec(
                token,
                id,
                &["sh", "-c", "mkdir -p private && echo n > private/notes.txt"],
            )
            .await;
        assert_eq!(events.last().unwrap()["code"], 0, "{events:?}");
    }
    // The workspace's deny beats the platform's allow, in its workspace only.
    let refused = read(TOKEN_A, a_id).await.unwrap();
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["details"]["reasons"][0]
        .as_str()
        .unwrap()
        .contains("reads nothing under /home/user/private"));
    assert_eq!(read(TOKEN_B, b_id).await.unwrap().status(), 200);
    let (status, _) = env
        .post(TOKEN_A, &format!("/v1/sandboxes/{a_id}/pause"))
        .await;
    assert_eq!(status, 403);
    let (status, _) = env
        .post(TOKEN_B, &format!("/v1/sandboxes/{b_id}/pause"))
        .await;
    assert_eq!(status, 200);
    // The workspace's `allow := true` does not restore what the platform refuses.
    let wget = env
        .exec_request(TOKEN_A, a_id, json!({"argv": ["wget", "-q", "http://x"]}))
        .await;
    assert_eq!(wget.status(), 403);
    // Without the action layer at all, every action is refused (default deny).
    std::fs::remove_file(env.gw.policy_dir.join("action.rego")).unwrap();
    let mut denied = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let response = env
            .exec_request(TOKEN_A, a_id, json!({"argv": ["true"]}))
            .await;
        if response.status() == 403 {
            denied = Some(response.json::<Value>().await.unwrap());
            break;
        }
        let _ = response.text().await;
    }
    let denied = denied.expect("exec kept working without an action policy");
    assert_eq!(denied["error"]["code"], "policy_denied", "{denied}");
}

/// `network.cidrs` is enforced: a sandbox given `127.0.0.2/32` reaches an origin on
/// 127.0.0.2 by its address (HTTPS through CONNECT, and plain HTTP) and by a name that
/// resolves there, and is refused 127.0.0.3 both ways; the decision records carry the
/// address. The private-address guard still applies: a metadata address listed in `cidrs`
/// stays refused.
#[tokio::test]
async fn network_cidrs_are_enforced_on_ip_literals_and_resolved_addresses() {
    let Some(env) = start("network_cidrs", vec![]).await else {
        return;
    };
    let tls_origin = start_origin_at(
        "127.0.0.2",
        Some(env._ca.server_config(&["127.0.0.2", "inside.cidr.test"])),
    )
    .await;
    let plain_origin = start_origin_at("127.0.0.2", None).await;
    let sandbox = env
        .create(
            TOKEN_A,
            json!({"network": {"cidrs": ["127.0.0.2/32", "169.254.169.254"]}}),
        )
        .await;
    let id = sandbox["id"].as_str().unwrap();
    let status = |url: String| {
        format!("curl -sS -o /dev/null -m 10 -w '%{{http_code}} %{{http_connect}}' {url}")
    };

    // Inside the CIDR: by address and by a name resolving into it, HTTPS and plain HTTP.
    for url in [
        format!("https://127.0.0.2:{}/by-address", tls_origin.port()),
        format!("https://inside.cidr.test:{}/by-name", tls_origin.port()),
        format!("http://127.0.0.2:{}/plain-by-address", plain_origin.port()),
        format!(
            "http://inside.cidr.test:{}/plain-by-name",
            plain_origin.port()
        ),
    ] {
        let (out, err, _) = env.sh(id, &status(url.clone())).await;
        assert!(out.starts_with("200"), "{url}: {out} {err}");
    }
    assert_eq!(tls_origin.count(), 2);
    assert_eq!(plain_origin.count(), 2);

    // Outside it: refused, by address and by name, and nothing is forwarded.
    for (url, code) in [
        (
            format!("https://127.0.0.3:{}/x", tls_origin.port()),
            "000 403",
        ),
        (
            format!("https://outside.cidr.test:{}/x", tls_origin.port()),
            "000 403",
        ),
        (
            format!("http://127.0.0.3:{}/x", plain_origin.port()),
            "403 000",
        ),
    ] {
        let (out, err, _) = env.sh(id, &status(url.clone())).await;
        assert_eq!(out, code, "{url}: {err}");
    }
    // A metadata address stays refused by the address guard, whatever `cidrs` lists.
    let (out, err, _) = env
        .sh(id, &status("https://169.254.169.254:443/latest".into()))
        .await;
    assert_eq!(out, "000 403", "{err}");
    assert_eq!(tls_origin.count(), 2);
    assert_eq!(plain_origin.count(), 2);

    // The decision records carry the address, for IP literals and resolved names alike.
    let expected = [
        ("127.0.0.2", "connect", "allow", "127.0.0.2"),
        ("inside.cidr.test", "connect", "allow", "127.0.0.2"),
        ("127.0.0.2", "request", "allow", "127.0.0.2"),
        ("inside.cidr.test", "request", "allow", "127.0.0.2"),
        ("127.0.0.3", "connect", "deny", "127.0.0.3"),
        ("outside.cidr.test", "connect", "deny", "127.0.0.3"),
        ("127.0.0.3", "request", "deny", "127.0.0.3"),
        ("169.254.169.254", "connect", "deny", "169.254.169.254"),
    ];
    let find = |records: &[serde_json::Value], host: &str, phase: &str| {
        records
            .iter()
            .filter(|r| r["sandbox"] == id && r["host"] == host && r["phase"] == phase)
            .cloned()
            .collect::<Vec<_>>()
    };
    let holds = |records: &[serde_json::Value],
                 (host, phase, decision, ip): (&str, &str, &str, &str)| {
        find(records, host, phase)
            .iter()
            .any(|r| r["decision"] == decision && r["ip"] == ip)
    };
    // Wait for the full set rather than a count: the writer thread lands them in batches.
    let records = env
        .gw
        .decisions_until(|records| expected.iter().all(|e| holds(records, *e)))
        .await;
    for (host, phase, decision, ip) in expected {
        let found = find(&records, host, phase);
        assert!(
            found
                .iter()
                .any(|r| r["decision"] == decision && r["ip"] == ip),
            "{host} {phase}: want {decision} with ip {ip}: {found:#?}"
        );
    }
    let metadata = find(&records, "169.254.169.254", "connect");
    assert!(
        metadata
            .iter()
            .all(|r| r["code"] == "destination_forbidden"),
        "{metadata:#?}"
    );
}

/// `user` on an exec: the default user is the unprivileged one, a user the pool declares
/// (`[local.users] root` here, listed in the pool's `sandgate.users` label) is really that
/// uid inside, an undeclared or malformed name is refused naming what is declared, and the
/// action policy narrows it per workspace (`exec_users`) before anything runs.
#[tokio::test]
async fn exec_runs_as_a_declared_user_refuses_others_and_policy_narrows_it() {
    let data = json!({"sandgate": {"workspaces": {"ws-b": {"exec_users": ["user"]}}}});
    let Some(env) = start("users", vec![("data.json", data.to_string())]).await else {
        return;
    };
    let pools = env.gw.api_json("/v1/pools", TOKEN_A).await;
    let local = pools["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pool"] == "local"))
        .unwrap_or_else(|| panic!("{pools:#}"));
    assert_eq!(local["labels"]["sandgate.users"], "root,user", "{local:#}");

    let id = env.create(TOKEN_A, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let id_u = |user: Value| json!({"argv": ["id", "-u"], "user": user, "timeout_ms": 30000});
    for (user, uid) in [
        (Value::Null, "65534"),
        (json!("user"), "65534"),
        (json!("root"), "0"),
    ] {
        let r = env.exec_request(TOKEN_A, &id, id_u(user.clone())).await;
        assert_eq!(r.status(), 200, "{user}");
        let text = r.text().await.unwrap();
        let out: String = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["type"] == "stdout")
            .map(|e| e["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(out.trim(), uid, "{user}: {text}");
    }
    for (user, needle) in [
        (
            "admin",
            "\"admin\" is not declared by this local pool; it declares: root, user",
        ),
        ("Bad Name", "`user` must be a user name"),
    ] {
        let r = env.exec_request(TOKEN_A, &id, id_u(json!(user))).await;
        assert_eq!(r.status(), 400, "{user}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_request", "{body:#}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body:#}");
    }

    // ws-b may only run commands as `user`: root is refused by policy, the default is not.
    let other = env.create(TOKEN_B, json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = env.exec_request(TOKEN_B, &other, id_u(json!("root"))).await;
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    let reasons = body["error"]["details"]["reasons"].to_string();
    assert!(
        reasons.contains("may not run as root in workspace ws-b"),
        "{body:#}"
    );
    let r = env.exec_request(TOKEN_B, &other, id_u(Value::Null)).await;
    assert_eq!(r.status(), 200);
}
